// The jail's two lists of steps, written once for exec mode and the zygote (order: jail.hpp).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "cellgate/jail/enter.hpp"
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

Result<void> contain_exec(const JailSpec& spec, uid_t uid, gid_t gid, const ExecSteps& steps) {
  return run_steps({
      // Leads a session of its own: never the kernel's, whose terminal it must not reach; with a
      // pty, the pty becomes this session's controlling terminal below.
      {"session", [] { return new_session(); }},
      {"rlimits", [&] { return apply_rlimits(spec); }},
      {"cpu affinity", [&] { return limit_cpu_affinity(spec.cpus, uid); }},
      {"umask",
       [&]() -> Result<void> {
         ::umask(spec.access_gid ? 002 : 022);
         return {};
       }},
      {"credentials", [&] { return drop_privileges(uid, gid); }},
      // After the credentials, which clear both: the change of uid sets "dumpable" from
      // fs.suid_dumpable, and this process still holds the helper's memory and environment until
      // its execve (which makes the command dumpable again, as any process of the kernel's uid).
      // The helper outside waits for us; if it dies, so do we (the jail's pid 1 does not know us).
      {"parent death",
       []() -> Result<void> {
         if (::prctl(PR_SET_DUMPABLE, 0) != 0) {
           return errno_error(ErrorCode::kInternal, "prctl", "prctl(PR_SET_DUMPABLE, 0)", errno);
         }
         if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
           return errno_error(ErrorCode::kInternal, "prctl", "prctl(PR_SET_PDEATHSIG)", errno);
         }
         return {};
       }},
      // As the kernel's uid, so the pty's slave is its own, as one the kernel opened would be.
      {"terminal",
       [&]() -> Result<void> {
         if (!steps.terminal) {
           return {};
         }
         CELLGATE_ASSIGN_OR_RETURN(Terminal t, open_terminal(*steps.terminal));
         auto attached = attach_terminal(t.slave);
         ::close(t.slave);
         auto handed = attached ? steps.hand_over_master(t.master) : attached;
         ::close(t.master);
         return handed;
       }},
      {"no_new_privs", [] { return set_no_new_privs(); }},
      {"landlock",
       [&]() -> Result<void> {
         CELLGATE_TRY(apply_landlock(spec));
         return {};
       }},
      // A directory the caller chose: entered as the kernel's uid, under Landlock, in the
      // jail's root (setns put our root there; ".." stops at it).
      {"work dir",
       [&]() -> Result<void> {
         const std::string dir = steps.cwd.empty() ? std::string(kJailWorkDir) : steps.cwd;
         if (::chdir(dir.c_str()) != 0) {
           return errno_error(ErrorCode::kInvalidArgument, "cwd", "chdir('" + dir + "')", errno);
         }
         return {};
       }},
      {"file descriptors", steps.settle_fds},
      {"seccomp",
       [&] {
         return apply_seccomp(spec.loopback_network ? loopback_seccomp_table()
                                                    : default_seccomp_table());
       }},
  });
}

}  // namespace cellgate::jail
