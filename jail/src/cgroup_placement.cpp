// Placing kernels' cgroups on a v2 host (systemd.io/CGROUP_DELEGATION): the gateway moves itself
// into a leaf of its delegated cgroup so that kernels' cgroups can go beside it.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <thread>
#include <utility>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/sys/file.hpp"
#include "cgroup_internal.hpp"

namespace cellgate::jail {

using namespace cgroup_internal;  // NOLINT(google-build-using-namespace): this room's helpers

// --- placement of kernels' cgroups (v2 delegation) ---------------------------------------------

namespace {

constexpr int kMoveRounds = 5;  // processes of a delegated cgroup may fork while we move them

// systemd (>= 251) marks a cgroup it delegated with trusted.delegate=1 (user.delegate=1 for a
// user manager's, from 252 on); systemd.io/CGROUP_DELEGATION.
bool delegated_by_xattr(const std::string& dir) {
  for (const char* name : {"trusted.delegate", "user.delegate"}) {
    char value[8] = {};
    const ssize_t n = ::getxattr(dir.c_str(), name, value, sizeof value - 1);
    if (n > 0 && std::string_view(value, static_cast<std::size_t>(n)) == "1") {
      return true;
    }
  }
  return false;
}

// Our path and directory in the v2 hierarchy, when /proc/self/cgroup has the "0::" line and a
// cgroup2 mount shows it.
std::optional<std::pair<std::string, std::string>> own_v2(const CgroupSystemView& view) {
  const auto lines = sys::parse_proc_cgroup(view.proc_self_cgroup);
  const auto line = std::find_if(lines.begin(), lines.end(), [](const sys::ProcCgroupLine& l) {
    return l.id == "0" && l.controllers.empty();
  });
  if (line == lines.end()) {
    return std::nullopt;
  }
  for (const auto& m : cgroup_mounts(view.mountinfo)) {
    if (m.fstype == "cgroup2") {
      if (auto dir = own_dir_in(m, line->path, view.root_prefix); dir && is_dir(*dir)) {
        return std::make_pair(line->path, *dir);
      }
    }
  }
  return std::nullopt;
}

// Enables in `dir` those of our controllers that it offers and does not yet enable for its
// children. Names what it enabled in `*enabled`.
Result<void> enable_controllers(const std::string& dir, std::vector<std::string>* enabled) {
  CELLGATE_ASSIGN_OR_RETURN(const std::string offered_text, read_file(dir + "/cgroup.controllers"));
  CELLGATE_ASSIGN_OR_RETURN(const std::string on_text, read_file(dir + "/cgroup.subtree_control"));
  const auto offered = tokens(offered_text);
  const auto on = tokens(on_text);
  std::vector<std::string> add;
  for (const auto controller : kControllers) {
    const std::string c(controller);
    if (contains(offered, c) && !contains(on, c)) {
      add.push_back("+" + c);
      enabled->push_back(c);
    }
  }
  if (add.empty()) {
    return ok_result();
  }
  return write_file(dir + "/cgroup.subtree_control", join(add, " "));
}

std::vector<pid_t> procs_of(const std::string& dir) {
  std::vector<pid_t> out;
  if (auto text = read_file(dir + "/cgroup.procs")) {
    for (const auto line : split(*text, '\n')) {
      if (const auto pid = parse_int<pid_t>(line); pid && *pid > 0) {
        out.push_back(*pid);
      }
    }
  }
  return out;
}

std::string not_delegated_message(const std::string& own_path, uid_t euid,
                                  const std::string& command_line) {
  std::string m =
      "kernels need cgroups of their own with the memory, pids and cpu controllers, "
      "but this process's cgroup " +
      own_path +
      " is not delegated to it (cgroup v2 enables controllers for child cgroups only "
      "where nobody else manages them and no process sits, and systemd did not "
      "delegate this one). ";
  const std::string cmd = command_line.empty() ? "cellgate serve …" : command_line;
  const bool session =
      own_path.find("/session-") != std::string::npos && own_path.ends_with(".scope");
  if (own_path.ends_with(".service")) {
    m += "Add Delegate=yes to the unit's [Service] section (scripts/systemd/cellgate.service is "
         "one that works), or start it in a delegated scope: ";
  } else if (session) {
    m += "Started from a login shell: run it in a scope that systemd delegates: ";
  } else {
    m += "Run it in a cgroup that systemd delegates: ";
  }
  m += std::string("systemd-run ") + (euid != 0 ? "--user " : "") +
       "--scope -p Delegate=yes --quiet -- " + cmd +
       " (or name a cgroup delegated to the gateway with --cgroup-parent)";
  return m;
}

}  // namespace

Result<KernelCgroupPlacement> place_kernel_cgroups(const CgroupPlacementRequest& request,
                                                   const CgroupSystemView& view) {
  CELLGATE_TRY(check_name("leaf", request.leaf_name));
  auto host = CgroupHost::detect(view.proc_self_cgroup, view.mountinfo, view.root_prefix,
                                 request.requested_parent);
  const bool have_all = host && std::all_of(kControllers.begin(), kControllers.end(),
                                            [&](auto c) { return host->has_controller(c); });

  if (!request.requested_parent.empty()) {
    if (!host) {
      return std::move(host).error();
    }
    if (host->version() == CgroupVersion::kV2 && !have_all) {
      // An operator-delegated parent: ours to enable controllers in, as long as it holds no
      // processes (the operator's to arrange).
      const std::string dir = host->base_dirs().front();
      std::vector<std::string> enabled;
      if (auto r = enable_controllers(dir, &enabled); !r) {
        Error e = std::move(r).error();
        e.code = ErrorCode::kFailedPrecondition;
        e.message = "--cgroup-parent " + request.requested_parent + ": enabling " +
                    join(enabled, ", ") + " for its children failed (" + e.message +
                    "); a delegated parent must hold no processes of its own";
        return e;
      }
      CELLGATE_ASSIGN_OR_RETURN(
          host, CgroupHost::detect(view.proc_self_cgroup, view.mountinfo, view.root_prefix,
                                   request.requested_parent));
    }
    return KernelCgroupPlacement{request.requested_parent,
                                 "kernels' cgroups below --cgroup-parent " +
                                     request.requested_parent + ": " + host->describe()};
  }

  // Nothing to arrange: no cgroups (launchers fail closed, naming why), v1, or a v2 cgroup whose
  // children already get every controller.
  if (!host || host->version() == CgroupVersion::kV1 || have_all) {
    return KernelCgroupPlacement{"", host ? host->describe() : host.error().message};
  }
  const auto own = own_v2(view);
  if (!own) {
    return KernelCgroupPlacement{"", host->describe()};
  }
  const auto& [own_path, dir] = *own;

  std::vector<std::string> enabled;
  if (own_path == "/" && !exists(dir + "/cgroup.type")) {
    // The hierarchy's true root (only it lacks cgroup.type): no internal-process rule there.
    CELLGATE_TRY(enable_controllers(dir, &enabled));
    return KernelCgroupPlacement{
        "", "cgroup v2 root " + dir + ": enabled " +
                (enabled.empty() ? std::string("nothing new") : join(enabled, ", ")) +
                " for kernels' cgroups"};
  }
  struct stat procs_st {};
  const bool owned = view.euid != 0 && ::stat((dir + "/cgroup.procs").c_str(), &procs_st) == 0 &&
                     procs_st.st_uid == view.euid;
  const bool delegated =
      own_path == "/" /* a cgroup namespace's root: a container runtime gave us the whole tree */ ||
      owned || (view.delegated ? view.delegated(dir) : delegated_by_xattr(dir));
  if (!delegated) {
    return make_error(ErrorCode::kFailedPrecondition, "cgroup_not_delegated",
                      not_delegated_message(own_path, view.euid, request.command_line));
  }

  // Delegated: move everything out of our cgroup into a leaf, then enable the controllers.
  const std::string leaf = dir + "/" + request.leaf_name;
  if (::mkdir(leaf.c_str(), 0755) == 0) {
    if (view.after_mkdir) {
      view.after_mkdir(leaf);
    }
  } else if (errno != EEXIST) {
    const int err = errno;
    return errno_error(sys::code_for_errno(err), kIoReason, "mkdir('" + leaf + "', 0755)", err);
  }
  Result<void> enabling = ok_result();
  std::vector<pid_t> left;
  for (int round = 0; round < kMoveRounds; ++round) {
    std::vector<pid_t> pids = procs_of(dir);
    // Ourselves first: whatever else happens, the gateway no longer blocks its own cgroup.
    std::erase(pids, view.self);
    pids.insert(pids.begin(), view.self);
    for (const pid_t pid : pids) {
      auto moved = write_file(leaf + "/cgroup.procs", std::to_string(pid));
      if (!moved && pid == view.self) {
        return std::move(moved).error();
      }  // another process may have ended meanwhile (ESRCH)
    }
    enabled.clear();
    enabling = enable_controllers(dir, &enabled);
    if (enabling) {
      break;
    }
    left = procs_of(dir);
  }
  if (!enabling) {
    std::string pids;
    for (const pid_t p : left) {
      pids += (pids.empty() ? "" : " ") + std::to_string(p);
    }
    Error e = std::move(enabling).error();
    e.code = ErrorCode::kFailedPrecondition;
    e.message = "moved the gateway into " + leaf + " but could not enable " + join(enabled, ", ") +
                " in " + dir + " for kernels' cgroups: " + e.message +
                (pids.empty() ? std::string() : " (processes still in it: " + pids + ")");
    return e;
  }
  return KernelCgroupPlacement{
      own_path, "cgroup v2, delegated " + own_path + ": the gateway moved into " + leaf +
                    (enabled.empty() ? std::string() : ", enabled " + join(enabled, ", ")) +
                    "; kernels' cgroups go beside it"};
}

Result<KernelCgroupPlacement> place_kernel_cgroups(const CgroupPlacementRequest& request) {
  CgroupPlacementRequest r = request;
  if (r.command_line.empty()) {
    // Our own command line, quoted for a shell, for the "run it like this" hint.
    if (auto cmdline = read_file("/proc/self/cmdline")) {
      for (const auto arg : split(*cmdline, '\0')) {
        if (arg.empty()) {
          continue;
        }
        const bool plain = std::all_of(arg.begin(), arg.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) ||
                 std::string_view("-_./=:,@+%").find(c) != std::string_view::npos;
        });
        std::string quoted = "'";
        for (const char c : arg) {
          quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
        }
        r.command_line +=
            (r.command_line.empty() ? "" : " ") + (plain ? std::string(arg) : quoted + "'");
      }
    }
  }
  CgroupSystemView view;
  CELLGATE_ASSIGN_OR_RETURN(view.proc_self_cgroup, read_file("/proc/self/cgroup"));
  CELLGATE_ASSIGN_OR_RETURN(view.mountinfo, read_file("/proc/self/mountinfo"));
  view.self = ::getpid();
  view.euid = ::geteuid();
  return place_kernel_cgroups(r, view);
}

}  // namespace cellgate::jail
