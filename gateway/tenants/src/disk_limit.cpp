#include "cellgate/tenants/disk_limit.hpp"

namespace cellgate::tenants {
namespace {

std::string mib(std::uint64_t bytes) {
  return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB";
}

}  // namespace

Result<void> DiskLimit::room(const std::string& tenant, std::uint64_t adding) const {
  if (max_bytes_ == 0 || !held_) {
    return ok_result();
  }
  const std::uint64_t held = held_(tenant);
  if (held <= max_bytes_ && adding <= max_bytes_ - held) {
    return ok_result();
  }
  return make_error(ErrorCode::kResourceExhausted, "tenant_disk",
                    "this tenant's kernels, paused sandboxes and snapshots hold " + mib(held) +
                        " of its " + mib(max_bytes_) +
                        " (--tenant-max-disk-mb), and this would take " + mib(adding) +
                        " more; delete a snapshot or kill a sandbox first");
}

}  // namespace cellgate::tenants
