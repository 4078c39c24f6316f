// Rootless mode: the gateway's own user and mount namespace (userns.hpp). user_namespaces(7).
#include "cellgate/jail/userns.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cellgate/sys/file.hpp"
#include "cellgate/sys/pipe.hpp"
#include "cellgate/sys/proc.hpp"
#include "cellgate/sys/process.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::jail {
namespace {

using sys::read_trimmed;

// uid_map, gid_map and setgroups are written once each, whole, without O_TRUNC.
Result<void> write_proc(const std::string& path, const std::string& value) {
  auto written = sys::write_file(path, value, "userns", /*truncate=*/false);
  if (!written) {
    Error e = std::move(written).error();
    e.code = ErrorCode::kFailedPrecondition;
    return e;
  }
  return {};
}

int threads_of_self() {
  const auto threads = sys::read_status_field("self", "Threads");
  return threads ? std::atoi(threads->c_str()) : -1;
}

std::string user_name(uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  char buf[4096];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr) {
    return found->pw_name;
  }
  return "";
}

// Runs a program and waits for it; its exit status, or -1.
int run_and_wait(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));
  }
  args.push_back(nullptr);
  auto child = sys::Child::fork([&args] {
    ::execv(args[0], args.data());
    return 127;
  });
  if (!child) {
    return -1;
  }
  const auto status = child->wait();
  if (!status || !WIFEXITED(*status)) {
    return -1;
  }
  return WEXITSTATUS(*status);
}

constexpr const char* kNewUidMap = "/usr/bin/newuidmap";
constexpr const char* kNewGidMap = "/usr/bin/newgidmap";

// The subordinate ranges newuidmap and newgidmap would map for us, with the count both allow;
// count 0 when there is none or the helpers are not installed.
struct HelperMapping {
  SubordinateRange uids;
  SubordinateRange gids;
  std::uint64_t count = 0;
};

HelperMapping helper_mapping(uid_t uid) {
  HelperMapping m;
  if (::access(kNewUidMap, X_OK) != 0 || ::access(kNewGidMap, X_OK) != 0) {
    return m;
  }
  const std::string name = user_name(uid);
  m.uids = find_subordinate_range(read_trimmed("/etc/subuid"), name, uid);
  m.gids = find_subordinate_range(read_trimmed("/etc/subgid"), name, uid);
  // Namespace ids 1..count; kept below 2^31 so that every id stays a plain positive number.
  m.count = std::min<std::uint64_t>({m.uids.count, m.gids.count, 1u << 30});
  return m;
}

}  // namespace

SubordinateRange find_subordinate_range(const std::string& text, const std::string& name,
                                        std::uint64_t id) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) {
      continue;
    }
    const std::string who = line.substr(0, a);
    if (who != name && who != std::to_string(id)) {
      continue;
    }
    const std::string start = line.substr(a + 1, b - a - 1);
    const std::string count = line.substr(b + 1);
    auto digits = [](const std::string& v) {
      return !v.empty() && v.size() < 12 && v.find_first_not_of("0123456789") == std::string::npos;
    };
    if (digits(start) && digits(count) && std::stoull(count) > 0) {
      return {std::stoull(start), std::stoull(count)};
    }
  }
  return {};
}

KernelUidRange kernel_uid_range_of_map(const std::string& uid_map) {
  std::istringstream in(uid_map);
  unsigned long long inside = 0, outside = 0, count = 0;
  bool zero = false;
  KernelUidRange range;
  while (in >> inside >> outside >> count) {
    zero = zero || (inside == 0 && count >= 1);
    if (inside == 1 && count > 0 && count < (1ull << 31)) {
      range = {1, static_cast<uid_t>(count)};
    }
  }
  return zero ? range : KernelUidRange{};
}

KernelUidRange kernel_uid_range() {
  if (::geteuid() != 0) {
    return {};
  }
  return kernel_uid_range_of_map(read_trimmed("/proc/self/uid_map"));
}

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
  // With a subordinate range, the setuid helpers write our maps from outside the namespace: a
  // child forked before the unshare, told to go once it is made.
  const HelperMapping helpers = helper_mapping(ns.outer_uid);
  // The helper learns that the unshare is done from one byte on `go`, or that it failed from
  // the end of the pipe (the parent closes its end without writing).
  std::optional<sys::Pipe> go;
  std::optional<sys::Child> helper;
  if (helpers.count > 0) {
    if (auto pipe = sys::make_pipe()) {
      go = std::move(pipe).value();
    }
  }
  if (go) {
    const pid_t gateway = ::getpid();
    auto forked = sys::Child::fork([&go, &helpers, &ns, gateway] {
      go->write.reset();
      char c = 0;
      if (::read(go->read.get(), &c, 1) != 1) {
        return 1;  // the unshare failed
      }
      const std::string pid = std::to_string(gateway);
      const std::string count = std::to_string(helpers.count);
      if (run_and_wait({kNewUidMap, pid, "0", std::to_string(ns.outer_uid), "1", "1",
                        std::to_string(helpers.uids.start), count}) != 0) {
        return 2;
      }
      return run_and_wait({kNewGidMap, pid, "0", std::to_string(ns.outer_gid), "1", "1",
                           std::to_string(helpers.gids.start), count}) == 0
                 ? 0
                 : 3;
    });
    go->read.reset();
    if (forked) {
      helper = std::move(forked).value();
    }
  }
  const bool unshared = ::unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0;
  const int unshare_errno = errno;
  int helper_status = -1;
  if (helper) {
    if (unshared) {
      (void)sys::write_all(go->write.get(), "x", 1);
    }
    go->write.reset();
    if (auto status = helper->wait(); status && WIFEXITED(*status)) {
      helper_status = WEXITSTATUS(*status);
    }
  }
  if (!unshared) {
    Error e = errno_error(ErrorCode::kFailedPrecondition, "userns",
                          "unshare(CLONE_NEWUSER|CLONE_NEWNS)", unshare_errno);
    const std::string why = user_namespace_blocker();
    e.message = "rootless mode needs an unprivileged user namespace, and " +
                (why.empty() ? e.message : why + " (" + e.message + ")") +
                "; or run cellgate as root";
    return e;
  }
  std::string mapping_note;
  if (helper_status == 0) {
    ns.kernel_uid_count = static_cast<uid_t>(helpers.count);
  } else {
    if (helper) {
      if (!read_trimmed("/proc/self/uid_map").empty()) {
        return make_error(ErrorCode::kFailedPrecondition, "userns",
                          "newgidmap failed after newuidmap mapped our uids (see its message "
                          "above); check the user's line in /etc/subgid");
      }
      mapping_note =
          "; newuidmap failed (see its message above), so only the user's own uid is "
          "mapped";
    }
    // user_namespaces(7): an unprivileged process maps only its own ids, and must deny setgroups
    // before it may write a gid_map.
    CELLGATE_TRY(write_proc("/proc/self/setgroups", "deny"));
    CELLGATE_TRY(write_proc("/proc/self/uid_map", "0 " + std::to_string(ns.outer_uid) + " 1"));
    CELLGATE_TRY(write_proc("/proc/self/gid_map", "0 " + std::to_string(ns.outer_gid) + " 1"));
  }
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
  if (ns.kernel_uid_count > 0) {
    ns.summary = "rootless: uid " + std::to_string(ns.outer_uid) +
                 " is root of the gateway's "
                 "own user namespace; kernels run as uids of its subordinate range (" +
                 std::to_string(helpers.uids.start) + "-" +
                 std::to_string(helpers.uids.start + helpers.count - 1) +
                 " outside, from /etc/subuid through newuidmap), every capability dropped; a "
                 "private /run";
  } else {
    ns.summary = "rootless: uid " + std::to_string(ns.outer_uid) +
                 " is root of the gateway's "
                 "own user namespace (kernels run as uid " +
                 std::to_string(ns.outer_uid) +
                 " outside, every capability dropped: no subordinate range in /etc/subuid with "
                 "newuidmap installed" +
                 mapping_note + "); a private /run";
  }
  return ns;
}

}  // namespace cellgate::jail
