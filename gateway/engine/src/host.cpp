#include "cellgate/engine/host.hpp"

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/userns.hpp"

namespace cellgate::engine {

const char* const kLandlockNotCheckpointed =
    "CRIU cannot save a kernel's Landlock layer, so a resumed or forked kernel would run without "
    "it; start the gateway with --checkpoint-without-landlock to accept that (jail/README.md, "
    "Checkpoints)";

namespace {

void report(const HostOptions& o, HostStep step, const std::string& line) {
  if (o.report) {
    o.report(step, line);
  }
}

Result<void> probe(const HostOptions& o, PreparedHost& host) {
  host.support = jail::probe_host();
  report(o, HostStep::kProbe, host.support.describe());
  return ok_result();
}

Result<void> place_cgroups(const HostOptions& o, PreparedHost& host) {
  if (!o.jailed || !o.place_cgroups) {
    host.cgroup_parent = o.cgroup_parent;
    return ok_result();
  }
  jail::CgroupPlacementRequest request;
  request.requested_parent = o.cgroup_parent;
  CELLGATE_ASSIGN_OR_RETURN(const auto placed, jail::place_kernel_cgroups(request));
  host.cgroup_parent = placed.parent;
  report(o, HostStep::kPlaceCgroups, placed.summary);
  return ok_result();
}

Result<void> probe_checkpoints(const HostOptions& o, PreparedHost& host) {
  if (!o.jailed) {
    // Not a step unjailed: nothing to say at start, only the reason for a 501.
    host.checkpoints.reason = "kernels run unjailed (--no-jail), and a checkpoint is of a jail";
    return ok_result();
  }
  host.checkpoints = checkpoint::probe_criu();
  if (host.checkpoints.available && !o.checkpoint_without_landlock) {
    host.checkpoints.available = false;
    host.checkpoints.reason = kLandlockNotCheckpointed;
  }
  report(o, HostStep::kCheckpoints, host.checkpoints.describe());
  return ok_result();
}

Result<void> enter_user_namespace(const HostOptions& o, PreparedHost& host) {
  if (!o.jailed) {
    return ok_result();
  }
  CELLGATE_ASSIGN_OR_RETURN(const auto userns, jail::enter_gateway_user_namespace());
  host.user_namespace = userns.entered;
  if (userns.entered) {
    report(o, HostStep::kEnterUserNamespace, userns.summary);
  }
  return ok_result();
}

}  // namespace

Result<PreparedHost> prepare_host(const HostOptions& options) {
  PreparedHost host;
  CELLGATE_TRY(probe(options, host));
  CELLGATE_TRY(place_cgroups(options, host));
  CELLGATE_TRY(probe_checkpoints(options, host));
  CELLGATE_TRY(enter_user_namespace(options, host));
  return host;
}

}  // namespace cellgate::engine
