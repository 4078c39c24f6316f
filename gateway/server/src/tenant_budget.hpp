// The tenants' limits of a `cellgate serve`: the CPU budget (--tenant-max-cpu-seconds) and disk
// limit (--tenant-max-disk-mb) over the registry's kernels and the tenants that own them
// (tenants/cpu_budget.hpp, tenants/disk_limit.hpp), and the same limits on MCP's conversations.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cellgate/api/api.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/mcp/server.hpp"
#include "cellgate/sandboxes/registry.hpp"
#include "cellgate/server/config.hpp"
#include "cellgate/tenants/cpu_budget.hpp"
#include "cellgate/tenants/disk_limit.hpp"
#include "cellgate/tenants/owners.hpp"

namespace cellgate::server {

// How often each tenant's kernels' CPU time is read (--tenant-max-cpu-seconds): a tenant passes its
// budget by at most what its kernels use in this time.
inline constexpr std::chrono::milliseconds kCpuBudgetInterval{2000};

// Null without --tenant-max-cpu-seconds. Fails closed: a budget it cannot hold (no cgroup this
// gateway can read and throttle: --no-jail,
// --user) throws std::invalid_argument, so serve does not start.
std::unique_ptr<tenants::CpuBudget> make_cpu_budget(const ServeOptions& o,
                                                    kernels::KernelRegistry& registry,
                                                    tenants::KernelOwners& owners);

// The tenants' disk limit (--tenant-max-disk-mb): what a tenant holds is its running kernels' work
// dir caps, its hibernated kernels' images and its E2B snapshots' images (`sandboxes`, made after
// this and read only when a limit is checked). Null without --tenant-max-disk-mb.
std::unique_ptr<tenants::DiskLimit> make_disk_limit(
    const ServeOptions& o, kernels::KernelRegistry& registry, tenants::KernelOwners& owners,
    const std::unique_ptr<sandboxes::SandboxRegistry>& sandboxes);

// MCP's options with its tenants' conversations held to the same limits as the Jupyter routes'
// starts, and their kernels recorded as theirs (`api` outlives the MCP server).
mcp::ServerOptions mcp_options(api::Api& api);

}  // namespace cellgate::server
