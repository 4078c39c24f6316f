// Namespaces and the small per-process steps: clone, cgroup namespace, hostname, the loopback
// network, session.
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cellgate/jail/jail.hpp"
#include "cellgate/unique_fd.hpp"

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

Result<void> bring_up_loopback() {
  // The namespace is new: it must hold `lo` and nothing else. Anything more would be a route out.
  struct if_nameindex* names = ::if_nameindex();
  if (names == nullptr) {
    return errno_error(ErrorCode::kFailedPrecondition, "loopback", "if_nameindex()", errno);
  }
  std::string others;
  bool has_lo = false;
  for (const struct if_nameindex* n = names; n->if_index != 0 && n->if_name != nullptr; ++n) {
    if (std::strcmp(n->if_name, "lo") == 0) {
      has_lo = true;
    } else {
      others += std::string(others.empty() ? "" : ", ") + n->if_name;
    }
  }
  ::if_freenameindex(names);
  if (!has_lo || !others.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "loopback",
                      "the kernel's network namespace must hold only 'lo'; it holds " +
                          std::string(has_lo ? "lo, " : "no lo, ") +
                          (others.empty() ? "nothing else" : others));
  }
  UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock) {
    return errno_error(ErrorCode::kFailedPrecondition, "loopback",
                       "socket(AF_INET, SOCK_DGRAM) to bring up lo", errno);
  }
  struct ifreq req {};
  std::strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(sock.get(), SIOCGIFFLAGS, &req) != 0) {
    return errno_error(ErrorCode::kFailedPrecondition, "loopback", "ioctl(SIOCGIFFLAGS, 'lo')",
                       errno);
  }
  req.ifr_flags = static_cast<short>(req.ifr_flags | IFF_UP | IFF_RUNNING);
  if (::ioctl(sock.get(), SIOCSIFFLAGS, &req) != 0) {
    return errno_error(ErrorCode::kFailedPrecondition, "loopback",
                       "ioctl(SIOCSIFFLAGS, 'lo', IFF_UP)", errno);
  }
  // Read back: the kernel must see it up, or the kernel would start without the network it asked
  // for and fail later, less clearly.
  struct ifreq check {};
  std::strncpy(check.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(sock.get(), SIOCGIFFLAGS, &check) != 0 || (check.ifr_flags & IFF_UP) == 0) {
    return make_error(ErrorCode::kFailedPrecondition, "loopback",
                      "lo is still down after ioctl(SIOCSIFFLAGS, IFF_UP)");
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
