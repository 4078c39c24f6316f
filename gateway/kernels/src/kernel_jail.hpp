// The jail of one registry kernel, built the same way by the registry and, for a gateway split
// in two (broker.hpp), by the broker.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "cellgate/jail/spec.hpp"

namespace cellgate::kernels {

// The gateway's spec with the kernel's uid and gid (uid 0: a single-uid rootless namespace,
// where the launcher runs it as 0), its cgroup named after the kernel, and its work dir bound
// at each alias besides /home/kernel.
inline jail::JailSpec kernel_jail(jail::JailSpec spec, const std::string& kernel_id, uid_t uid,
                                  const std::string& work_dir,
                                  const std::vector<std::string>& aliases) {
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

}  // namespace cellgate::kernels
