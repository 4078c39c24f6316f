// Namespaces and the small per-process steps: clone, cgroup namespace, hostname, session.
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "cellgate/jail/jail.hpp"

namespace cellgate::jail {

Result<pid_t> clone_jailed() {
  // New namespaces for everything but users (the launcher runs as root) and cgroups (entered
  // by the child once the parent has put it in its cgroup, so that cgroup is its root).
  // Raw clone with a null stack behaves like fork: safe because the launcher has one thread.
  constexpr unsigned long kFlags =
      CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
  long pid = ::syscall(SYS_clone, kFlags, nullptr, nullptr, nullptr, nullptr);
  if (pid < 0) {
    return errno_error(ErrorCode::kFailedPrecondition, "clone",
                       "clone(CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS)",
                       errno);
  }
  return static_cast<pid_t>(pid);
}

Result<void> enter_cgroup_namespace() {
  if (::unshare(CLONE_NEWCGROUP) != 0) {
    return errno_error(ErrorCode::kFailedPrecondition, "cgroupns", "unshare(CLONE_NEWCGROUP)",
                       errno);
  }
  return {};
}

Result<void> set_hostname(const std::string& name) {
  if (::sethostname(name.data(), name.size()) != 0) {
    return errno_error(ErrorCode::kInternal, "hostname", "sethostname('" + name + "')", errno);
  }
  return {};
}

Result<void> new_session() {
  // No controlling terminal: TIOCSTI has nothing to inject into (CVE-2017-5226).
  if (::setsid() < 0) {
    return errno_error(ErrorCode::kInternal, "setsid", "setsid()", errno);
  }
  return {};
}

Result<void> enter_work_dir() {
  if (::chdir(kJailWorkDir) != 0) {
    return errno_error(ErrorCode::kInternal, "chdir", std::string("chdir('") + kJailWorkDir + "')",
                       errno);
  }
  return {};
}

}  // namespace cellgate::jail
