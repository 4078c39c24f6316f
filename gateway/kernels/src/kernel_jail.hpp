// The jail of one registry kernel, built the same way by the registry and, for a gateway split
// in two (broker.hpp), by the broker.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "cellgate/jail/spec.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernels {

// The gateway's spec with the kernel's uid and gid (uid 0: a single-uid rootless namespace,
// where the launcher runs it as 0), its cgroup named after the kernel, and its work dir bound
// at each alias besides /home/kernel.
inline jail::JailSpec kernel_jail(jail::JailSpec spec, const std::string& kernel_id, uid_t uid,
                                  const std::string& work_dir,
                                  const std::vector<std::string>& aliases,
                                  bool loopback_network = false) {
  spec.loopback_network = loopback_network;
  if (uid != 0) {
    spec.uid = uid;
    spec.gid = static_cast<gid_t>(uid);
  }
  spec.name = "k-" + kernel_id;
  for (const auto& alias : aliases) {
    spec.binds.push_back({work_dir, alias, /*writable=*/true});
  }
  return spec;
}

// Whether a kernelspec asks for the debugger's loopback network: `"metadata": {"cellgate":
// {"debugger": true}}` in its kernel.json (jail/README.md, "Loopback network"). An operator who
// has not allowed it (`serve --allow-debugger`) gets a refusal naming the switch, never a kernel
// quietly started without what its kernelspec says; a value that is not a boolean is refused too.
inline Result<bool> kernel_loopback(const kernel::KernelSpec& spec, bool allowed) {
  const auto cellgate = spec.metadata.find("cellgate");
  if (cellgate == spec.metadata.end() || !cellgate->is_object()) {
    return false;
  }
  const auto debugger = cellgate->find("debugger");
  if (debugger == cellgate->end() || debugger->is_null()) {
    return false;
  }
  if (!debugger->is_boolean()) {
    return make_error(ErrorCode::kInvalidArgument, "bad_kernelspec",
                      "kernelspec '" + spec.name +
                          "': metadata.cellgate.debugger must be true or "
                          "false");
  }
  if (debugger->get<bool>() && !allowed) {
    return make_error(ErrorCode::kPermissionDenied, "debugger_not_allowed",
                      "kernelspec '" + spec.name +
                          "' asks for the debugger's loopback network "
                          "(metadata.cellgate.debugger); this gateway does not allow it (start it "
                          "with --allow-debugger)");
  }
  return debugger->get<bool>();
}

}  // namespace cellgate::kernels
