// Adoption, as a function: what a previous gateway on the same state dir left (state records,
// runtime dirs) is sorted at start. Every client kernel whose launcher still runs, or that was
// hibernated, is handed to `adopt` (the registry connects to it again, or lists it hibernated:
// same id, uid, env and variables); an `adopt` that answers kLeftOnDisk leaves the kernel's
// record, image and runtime dir as they are; everything else —
// pooled kernels (a pool is refilled fresh), kernels whose launcher is gone or that `adopt`
// refused, unreadable records, runtime dirs no record names (a start cut short) — is ended and
// removed here.
//
//   auto counts = adopt_or_clean_up(state_dir, backend,
//                                   [&](const Record& r) { return registry_adopt(r); });
//
// Thread-safety: blocking; run once, before the registry serves anything.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "cellgate/kernel/kernel.hpp"
#include "cellgate/result.hpp"
#include "records.hpp"

namespace cellgate::kernels {

// The reason of an `adopt` error that keeps what the kernel left on disk instead of cleaning up.
inline constexpr const char* kLeftOnDisk = "left_on_disk";

struct AdoptionCounts {
  std::size_t adopted = 0;
  std::size_t cleaned_up = 0;
};

AdoptionCounts adopt_or_clean_up(const std::string& state_dir, kernel::KernelBackend& backend,
                                 const std::function<Result<void>(const Record&)>& adopt);

}  // namespace cellgate::kernels
