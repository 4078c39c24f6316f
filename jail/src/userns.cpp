// Rootless mode: the gateway's own user and mount namespace (userns.hpp). user_namespaces(7).
#include "cellgate/jail/userns.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

#include "cellgate/unique_fd.hpp"

namespace cellgate::jail {
namespace {

std::string read_trimmed(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
    s.pop_back();
  }
  return s;
}

Result<void> write_proc(const std::string& path, const std::string& value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd || ::write(fd.get(), value.data(), value.size()) != static_cast<ssize_t>(value.size())) {
    return errno_error(ErrorCode::kFailedPrecondition, "userns",
                       "write('" + path + "', '" + value + "')", errno);
  }
  return {};
}

int threads_of_self() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Threads:", 0) == 0) {
      return std::atoi(line.c_str() + 8);
    }
  }
  return -1;
}

}  // namespace

std::string user_namespace_blocker(const std::string& proc_sys) {
  if (read_trimmed(proc_sys + "/kernel/unprivileged_userns_clone") == "0") {
    return "unprivileged user namespaces are switched off (sysctl "
           "kernel.unprivileged_userns_clone=0); an administrator can allow them with "
           "`sysctl -w kernel.unprivileged_userns_clone=1`";
  }
  if (read_trimmed(proc_sys + "/user/max_user_namespaces") == "0") {
    return "user namespaces are switched off (sysctl user.max_user_namespaces=0); an "
           "administrator can allow them with `sysctl -w user.max_user_namespaces=15000`";
  }
  if (read_trimmed(proc_sys + "/kernel/apparmor_restrict_unprivileged_userns") == "1") {
    return "AppArmor restricts unprivileged user namespaces (sysctl "
           "kernel.apparmor_restrict_unprivileged_userns=1, Ubuntu 23.10 and later): the "
           "namespace is made but holds no capabilities. An administrator can give cellgate an "
           "AppArmor profile with the `userns,` rule, or set the sysctl to 0";
  }
  return "";
}

bool in_single_uid_user_namespace() {
  return is_single_uid_map(read_trimmed("/proc/self/uid_map"));
}

bool is_single_uid_map(const std::string& uid_map) {
  std::istringstream map(uid_map);
  long inside = -1, outside = -1, count = -1;
  if (!(map >> inside >> outside >> count)) {
    return false;
  }
  long more = 0;
  return inside == 0 && outside != 0 && count == 1 && !(map >> more);
}

Result<UserNamespace> enter_gateway_user_namespace() {
  UserNamespace ns;
  ns.outer_uid = ::geteuid();
  ns.outer_gid = ::getegid();
  if (ns.outer_uid == 0) {
    return ns;
  }
  if (threads_of_self() != 1) {
    return make_error(ErrorCode::kInternal, "userns",
                      "a user namespace can be entered only by a single-threaded process");
  }
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    const int err = errno;
    Error e = errno_error(ErrorCode::kFailedPrecondition, "userns",
                          "unshare(CLONE_NEWUSER|CLONE_NEWNS)", err);
    const std::string why = user_namespace_blocker();
    e.message = "rootless mode needs an unprivileged user namespace, and " +
                (why.empty() ? e.message : why + " (" + e.message + ")") +
                "; or run cellgate as root";
    return e;
  }
  // user_namespaces(7): an unprivileged process maps only its own ids, and must deny setgroups
  // before it may write a gid_map.
  CELLGATE_TRY(write_proc("/proc/self/setgroups", "deny"));
  CELLGATE_TRY(write_proc("/proc/self/uid_map", "0 " + std::to_string(ns.outer_uid) + " 1"));
  CELLGATE_TRY(write_proc("/proc/self/gid_map", "0 " + std::to_string(ns.outer_gid) + " 1"));
  // Nothing mounted from here on is seen outside, and the capabilities of this namespace must
  // be real: under AppArmor's restriction the namespace is made but mounting fails.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("cellgate-run", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m") != 0) {
    const int err = errno;
    const std::string why = user_namespace_blocker();
    return errno_error(ErrorCode::kFailedPrecondition, "userns",
                       "mount(tmpfs, '/run') in the gateway's user namespace" +
                           (why.empty() ? std::string() : " (" + why + ")"),
                       err);
  }
  ns.entered = true;
  ns.summary = "rootless: uid " + std::to_string(ns.outer_uid) + " is root of the gateway's own "
               "user namespace (kernels run as uid " + std::to_string(ns.outer_uid) +
               " outside, every capability dropped); a private /run";
  return ns;
}

}  // namespace cellgate::jail
