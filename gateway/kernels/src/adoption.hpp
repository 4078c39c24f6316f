// Adoption, as a function: what a previous gateway on the same state dir left (state records,
// runtime dirs) is sorted at start. Every client kernel whose launcher still runs is handed to
// `adopt` (the registry connects to it again: same id, uid, env and variables); everything else —
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

struct AdoptionCounts {
  std::size_t adopted = 0;
  std::size_t cleaned_up = 0;
};

AdoptionCounts adopt_or_clean_up(const std::string& state_dir, kernel::KernelBackend& backend,
                                 const std::function<Result<void>(const Record&)>& adopt);

}  // namespace cellgate::kernels
