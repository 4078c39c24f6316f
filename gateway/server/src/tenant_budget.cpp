#include "tenant_budget.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace cellgate::server {

std::unique_ptr<tenants::CpuBudget> make_cpu_budget(const ServeOptions& o,
                                                    kernels::KernelRegistry& registry,
                                                    tenants::KernelOwners& owners) {
  if (o.tenant_max_cpu_seconds <= 0) {
    return nullptr;
  }
  if (o.no_jail || !o.user.empty()) {
    throw std::invalid_argument(
        std::string("--tenant-max-cpu-seconds needs kernels in cgroups this gateway can "
                    "throttle: not with ") +
        (o.no_jail ? "--no-jail" : "--user (the broker's kernels)"));
  }
  tenants::CpuBudgetOptions bo;
  bo.max_cpu_seconds = o.tenant_max_cpu_seconds;
  bo.window = std::chrono::seconds(std::max<long long>(1, std::llround(o.tenant_cpu_window)));
  bo.file = o.state_dir + "/tenant-cpu.json";
  tenants::CpuBudgetHooks hooks;
  hooks.owned = [&registry, &owners] {
    std::vector<tenants::CpuBudgetHooks::Owned> out;
    for (auto& [kernel_id, tenant] : owners.all()) {
      if (registry.find(kernel_id)) {
        out.push_back({kernel_id, tenant});
      }
    }
    return out;
  };
  hooks.cpu_usec = [&registry](const std::string& id) -> std::optional<std::uint64_t> {
    auto k = registry.find(id);
    if (!k) {
      return std::nullopt;
    }
    auto stats = (*k)->cgroup_stats();
    if (!stats || !stats->cpu_usage_known) {
      return std::nullopt;
    }
    return stats->cpu_usage_usec;
  };
  hooks.throttle = [&registry](const std::string& id, bool throttled) -> Result<void> {
    CELLGATE_ASSIGN_OR_RETURN(auto k, registry.find(id));
    return k->throttle_cpu(throttled);
  };
  return std::make_unique<tenants::CpuBudget>(std::move(bo), std::move(hooks));
}

std::unique_ptr<tenants::DiskLimit> make_disk_limit(
    const ServeOptions& o, kernels::KernelRegistry& registry, tenants::KernelOwners& owners,
    const std::unique_ptr<sandboxes::SandboxRegistry>& sandboxes) {
  if (o.tenant_max_disk_mb == 0) {
    return nullptr;
  }
  const std::uint64_t work_dir = o.jail.work_bytes;
  auto held = [&registry, &owners, work_dir, &sandboxes](const std::string& tenant) {
    std::uint64_t total = 0;
    for (const auto& [kernel_id, owner] : owners.all()) {
      if (owner != tenant) {
        continue;
      }
      auto k = registry.find(kernel_id);
      if (!k) {
        continue;
      }
      total += (*k)->model().hibernated ? registry.image_bytes(kernel_id) : work_dir;
    }
    if (sandboxes) {
      std::map<std::string, std::uint64_t> bytes;
      for (const auto& snap : registry.snapshots()) {
        bytes[snap.id] = snap.bytes;
      }
      for (const auto& snap : sandboxes->snapshots(sandboxes::Caller{tenant, false})) {
        auto it = bytes.find(snap.id);
        total += it == bytes.end() ? 0 : it->second;
      }
    }
    return total;
  };
  return std::make_unique<tenants::DiskLimit>(o.tenant_max_disk_mb << 20, std::move(held));
}

mcp::ServerOptions mcp_options(api::Api& api) {
  mcp::ServerOptions o;
  o.tenant_may_start = [&api](const std::string& tenant) {
    return api.tenant_room(tenant, /*kernel=*/true);
  };
  o.tenant_owns = [&api](const std::string& tenant, const std::string& kernel_id) {
    api.record_owner(tenant, kernel_id);
  };
  return o;
}

}  // namespace cellgate::server
