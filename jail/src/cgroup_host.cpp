// Detecting the cgroup hierarchies this process can make kernels' cgroups in (v1 and v2), from
// proc(5) /proc/self/cgroup and /proc/self/mountinfo.
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
#include "cgroup_internal.hpp"

namespace cellgate::jail {

using namespace cgroup_internal;  // NOLINT(google-build-using-namespace): this room's helpers

// --- CgroupHost -------------------------------------------------------------------------------

Result<CgroupHost> CgroupHost::detect(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                      const std::string& root_prefix, const std::string& parent) {
  auto lines = sys::parse_proc_cgroup(proc_self_cgroup);
  if (!parent.empty()) {
    if (!clean_absolute(parent)) {
      return make_error(ErrorCode::kInvalidArgument, "bad_cgroup_parent",
                        "cgroup parent '" + parent +
                            "' must be an absolute cgroup path without '.' or '..' parts");
    }
    for (auto& l : lines) {
      l.path = parent;
    }
  }
  const auto mounts = cgroup_mounts(mountinfo);
  CgroupHost host;

  // v1: each controller we use lives in the hierarchy that /proc/self/cgroup names it in.
  bool any_v1 = false;
  for (const auto controller : kControllers) {
    const std::string c(controller);
    const auto line = std::find_if(lines.begin(), lines.end(), [&](const sys::ProcCgroupLine& l) {
      return l.id != "0" && contains(l.controllers, c);
    });
    if (line == lines.end()) {
      continue;
    }
    any_v1 = true;
    std::optional<std::string> dir;
    for (const auto& m : mounts) {
      if (m.fstype == "cgroup" && contains(m.super_options, c)) {
        dir = own_dir_in(m, line->path, root_prefix);
        if (dir) {
          break;
        }
      }
    }
    if (!dir) {
      host.missing_[c] = "no mount of the cgroup v1 " + c + " hierarchy shows this process's " + c +
                         " cgroup '" + line->path + "' (/proc/self/mountinfo)";
      continue;
    }
    if (!is_dir(*dir)) {
      host.missing_[c] = "this process's cgroup v1 " + c + " directory " + *dir + " does not exist";
      continue;
    }
    auto same = std::find_if(host.hierarchies_.begin(), host.hierarchies_.end(),
                             [&](const Hierarchy& h) { return h.own_dir == *dir; });
    if (same != host.hierarchies_.end()) {
      same->controllers.push_back(c);
    } else {
      host.hierarchies_.push_back(Hierarchy{{c}, *dir});
    }
  }

  // v2: the line "0::/path" and a cgroup2 mount that shows it.
  std::optional<std::string> v2_dir;
  const auto v2_line = std::find_if(lines.begin(), lines.end(), [](const sys::ProcCgroupLine& l) {
    return l.id == "0" && l.controllers.empty();
  });
  if (v2_line != lines.end()) {
    for (const auto& m : mounts) {
      if (m.fstype == "cgroup2") {
        v2_dir = own_dir_in(m, v2_line->path, root_prefix);
        if (v2_dir && is_dir(*v2_dir)) {
          break;
        }
        v2_dir.reset();
      }
    }
  }

  if (any_v1) {
    host.version_ = CgroupVersion::kV1;
    for (const auto controller : kControllers) {
      const std::string c(controller);
      if (host.hierarchy_for(c) == nullptr && host.missing_.count(c) == 0) {
        host.missing_[c] = "no cgroup v1 " + c + " hierarchy (/proc/self/cgroup does not list " +
                           c + "; cellgate does not mix v1 and v2 controllers)";
      }
    }
    if (v2_dir) {
      host.note_ = "; a cgroup v2 hierarchy at " + *v2_dir + " is not used";
    }
    return host;
  }
  if (!v2_dir) {
    return make_error(ErrorCode::kFailedPrecondition, "cgroup_unavailable",
                      "no cgroup v1 or v2 hierarchy is mounted where /proc/self/cgroup says this "
                      "process is (mount cgroup2 at /sys/fs/cgroup)");
  }
  host.version_ = CgroupVersion::kV2;
  // cgroup-v2.rst: a child can use a controller only if its parent lists it in
  // cgroup.subtree_control. Our own cgroup's is the delegator's to set, never ours.
  std::vector<std::string> offered;
  std::vector<std::string> delegated;
  if (auto text = read_file(*v2_dir + "/cgroup.controllers")) {
    offered = tokens(*text);
  }
  if (auto text = read_file(*v2_dir + "/cgroup.subtree_control")) {
    delegated = tokens(*text);
  }
  Hierarchy h{{}, *v2_dir};
  for (const auto controller : kControllers) {
    const std::string c(controller);
    if (contains(delegated, c)) {
      h.controllers.push_back(c);
    } else if (contains(offered, c)) {
      // cgroup-v2.rst "No Internal Process Constraint": only a cgroup without processes (or the
      // root) can enable controllers for its children.
      host.missing_[c] = "the " + c +
                         " controller is not delegated to this process's cgroup: " + *v2_dir +
                         "/cgroup.subtree_control lacks it (delegate it, e.g. " +
                         "systemd Delegate=yes on the gateway's unit, and enable " + c +
                         " there; v2 allows that only in a cgroup with no processes of its own)";
    } else {
      host.missing_[c] = "the cgroup v2 hierarchy does not offer the " + c + " controller (" +
                         *v2_dir + "/cgroup.controllers: '" + join(offered, " ") + "')";
    }
  }
  host.hierarchies_.push_back(std::move(h));
  return host;
}

Result<CgroupHost> CgroupHost::detect_system(const std::string& parent) {
  CELLGATE_ASSIGN_OR_RETURN(const std::string cgroup, read_file("/proc/self/cgroup"));
  CELLGATE_ASSIGN_OR_RETURN(const std::string mountinfo, read_file("/proc/self/mountinfo"));
  return detect(cgroup, mountinfo, "", parent);
}

CgroupVersion CgroupHost::version() const {
  return version_;
}

bool CgroupHost::has_controller(std::string_view controller) const {
  return hierarchy_for(controller) != nullptr;
}

const CgroupHost::Hierarchy* CgroupHost::hierarchy_for(std::string_view controller) const {
  for (const auto& h : hierarchies_) {
    if (contains(h.controllers, controller)) {
      return &h;
    }
  }
  return nullptr;
}

std::string CgroupHost::describe() const {
  std::string out = version_ == CgroupVersion::kV1 ? "cgroup v1: " : "cgroup v2";
  if (version_ == CgroupVersion::kV2) {
    const auto& h = hierarchies_.front();
    out += " at " + h.own_dir + ": " +
           (h.controllers.empty() ? "no controllers" : join(h.controllers, ", ")) + " delegated";
  } else {
    std::vector<std::string> where;
    for (const auto controller : kControllers) {
      if (const auto* h = hierarchy_for(controller)) {
        where.push_back(std::string(controller) + " at " + h->own_dir);
      }
    }
    out += where.empty() ? "no controllers" : join(where, ", ");
  }
  for (const auto& [controller, why] : missing_) {
    out += "; " + controller + " unavailable: " + why;
  }
  return out + note_;
}

std::vector<std::string> CgroupHost::base_dirs() const {
  std::vector<std::string> out;
  for (const auto& h : hierarchies_) {
    out.push_back(h.own_dir);
  }
  return out;
}

std::string CgroupHost::controller_gap(const std::string& limit) const {
  const std::string c = controller_of(limit);
  if (hierarchy_for(c) != nullptr) {
    return "";
  }
  const auto it = missing_.find(c);
  return it != missing_.end() ? it->second : "the host has no " + c + " controller";
}

}  // namespace cellgate::jail
