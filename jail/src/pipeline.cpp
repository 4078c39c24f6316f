// The jail's two lists of steps, written once for exec mode and the zygote (order: jail.hpp).
#include <sys/stat.h>

#include <string>
#include <utility>

#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/landlock.hpp"
#include "cellgate/jail/seccomp.hpp"

namespace cellgate::jail {

Result<void> run_steps(const std::vector<Step>& steps) {
  for (const auto& step : steps) {
    auto r = step.run();
    if (!r) {
      Error e = std::move(r).error();
      e.message = std::string(step.name) + ": " + e.message;
      return e;
    }
  }
  return {};
}

Result<void> contain_init(const JailSpec& spec, const RootPaths& paths, uid_t uid, gid_t gid) {
  return run_steps({
      // pid 1 leads its own session, with no controlling terminal: a checkpoint (CRIU) can only
      // restore a pid namespace whose sessions all begin inside it.
      {"session", [] { return new_session(); }},
      {"cgroup namespace", [] { return enter_cgroup_namespace(); }},
      {"root filesystem", [&] { return build_root(spec, paths, uid, gid); }},
      {"hostname", [&] { return set_hostname(spec.hostname); }},
      // Before the kernel exists, as root in the jail's own network namespace: the kernel's
      // seccomp filter refuses netlink, and it has no CAP_NET_ADMIN anyway.
      {"loopback network",
       [&]() -> Result<void> {
         if (spec.loopback_network) {
           return bring_up_loopback();
         }
         return {};
       }},
  });
}

Result<void> contain_kernel(const JailSpec& spec, uid_t uid, gid_t gid,
                            const std::function<Result<void>()>& settle_fds) {
  return run_steps({
      {"session", [] { return new_session(); }},
      {"work dir", [] { return enter_work_dir(); }},
      {"rlimits", [&] { return apply_rlimits(spec); }},
      {"cpu affinity", [&] { return limit_cpu_affinity(spec.cpus, uid); }},
      // What it makes in its work and connection dirs stays usable by the access group.
      {"umask",
       [&]() -> Result<void> {
         if (spec.access_gid) {
           ::umask(002);
         }
         return {};
       }},
      {"credentials", [&] { return drop_privileges(uid, gid); }},
      {"no_new_privs", [] { return set_no_new_privs(); }},
      // Needs no_new_privs (or CAP_SYS_ADMIN, long dropped); closes its ruleset fd itself, and
      // its syscalls come before the seccomp filter, which does not list them.
      {"landlock",
       [&]() -> Result<void> {
         CELLGATE_TRY(apply_landlock(spec));
         return {};
       }},
      {"file descriptors", settle_fds},
      // Last: after it, even the launcher's own code could not undo anything above.
      {"seccomp",
       [&] {
         return apply_seccomp(spec.loopback_network ? loopback_seccomp_table()
                                                    : default_seccomp_table());
       }},
  });
}

}  // namespace cellgate::jail
