// The tenants' CPU budget of a `cellgate serve` (--tenant-max-cpu-seconds), over the registry's
// kernels and the tenants that own them (tenants/cpu_budget.hpp).
#pragma once

#include <chrono>
#include <memory>

#include "cellgate/kernels/registry.hpp"
#include "cellgate/server/config.hpp"
#include "cellgate/tenants/cpu_budget.hpp"
#include "cellgate/tenants/owners.hpp"

namespace cellgate::server {

// How often each tenant's kernels' CPU time is read (--tenant-max-cpu-seconds): a tenant passes its
// budget by at most what its kernels use in this time.
inline constexpr std::chrono::milliseconds kCpuBudgetInterval{2000};

// Fails closed: a budget it cannot hold (no cgroup this gateway can read and throttle: --no-jail,
// --user) throws std::invalid_argument, so serve does not start.
std::unique_ptr<tenants::CpuBudget> make_cpu_budget(const ServeOptions& o,
                                                    kernels::KernelRegistry& registry,
                                                    tenants::KernelOwners& owners);

}  // namespace cellgate::server
