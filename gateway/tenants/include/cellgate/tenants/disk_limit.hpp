// DiskLimit: the disk one tenant may hold (`--tenant-max-disk-mb`): each of its running kernels
// reserves its work dir's size cap (a tmpfs the kernel cannot grow past), each hibernated one (a
// paused sandbox) its image, each of its snapshots its image. What would take more — a kernel or
// sandbox start, a fork, a snapshot — is refused (kResourceExhausted "tenant_disk": E2B's 429, 403
// on the Jupyter routes) until the tenant frees some.
//
//   DiskLimit disk(max_bytes, [&](const std::string& tenant) { return held(tenant); });
//   CELLGATE_TRY(disk.room("alice", work_dir_bytes));
//
// `held` is the composition root's (gateway/server/src/tenant_budget.cpp): it walks the tenant's
// kernels and snapshots. Checks and starts are not one step: racing starts may pass the limit by
// as many as start at once.
//
// Thread-safety: room() may be called from any thread, as `held` must allow.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cellgate/result.hpp"

namespace cellgate::tenants {

class DiskLimit {
 public:
  using Held = std::function<std::uint64_t(const std::string& tenant)>;
  DiskLimit(std::uint64_t max_bytes, Held held) : max_bytes_(max_bytes), held_(std::move(held)) {}
  Result<void> room(const std::string& tenant, std::uint64_t adding) const;

 private:
  const std::uint64_t max_bytes_;
  const Held held_;
};

}  // namespace cellgate::tenants
