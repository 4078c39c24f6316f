// A kernel's cgroup on v1 and v2: created below our own with its limits written, processes
// added, killed (cgroup.kill or by pid) and removed. Kernel docs this follows:
//   v1: Documentation/admin-guide/cgroup-v1/{cgroups,memory,pids}.rst, scheduler/sched-bwc.rst
//   v2: Documentation/admin-guide/cgroup-v2.rst ("Delegation", "No Internal Process Constraint")
#include "cellgate/jail/cgroup.hpp"

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

#include "cellgate/sys/file.hpp"
#include "cgroup_internal.hpp"

namespace cellgate::jail {

using namespace cgroup_internal;  // NOLINT(google-build-using-namespace): this room's helpers

Result<std::unique_ptr<Cgroup>> CgroupHost::create(const std::string& group,
                                                   const std::string& name,
                                                   const CgroupLimits& limits,
                                                   const std::set<std::string>& optional,
                                                   std::vector<std::string>* warnings) const {
  CELLGATE_TRY(check_name("group", group));
  CELLGATE_TRY(check_name("name", name));
  if (limits.memory_bytes && *limits.memory_bytes == 0) {
    return make_error(ErrorCode::kInvalidArgument, "bad_limit", "memory limit must be > 0 bytes");
  }
  if (limits.memory_bytes && *limits.memory_bytes > static_cast<std::uint64_t>(INT64_MAX)) {
    return make_error(ErrorCode::kInvalidArgument, "bad_limit", "memory limit is too large");
  }
  if (limits.pids && *limits.pids < 1) {
    return make_error(ErrorCode::kInvalidArgument, "bad_limit", "pids limit must be >= 1");
  }
  std::int64_t cpu_quota = 0;
  if (limits.cpus) {
    const double cpus = *limits.cpus;
    if (!std::isfinite(cpus) || cpus <= 0 || cpus > kMaxCpus ||
        std::llround(cpus * kCpuPeriodUsec) < kCpuMinQuotaUsec) {
      return make_error(ErrorCode::kInvalidArgument, "bad_limit",
                        "cpus must be a number from 0.01 to " + std::to_string(kMaxCpus));
    }
    cpu_quota = std::llround(cpus * kCpuPeriodUsec);
  }

  std::vector<std::string> wanted;
  if (limits.memory_bytes) {
    wanted.emplace_back("memory");
    if (limits.swap_off) {
      wanted.emplace_back("swap");
    }
  }
  if (limits.pids) {
    wanted.emplace_back("pids");
  }
  if (limits.cpus) {
    wanted.emplace_back("cpu");
  }

  // Fail closed: a limit we cannot enforce stops the kernel unless the operator allowed it.
  std::vector<std::string> gaps;
  std::vector<std::string> apply;
  auto unavailable = [&](const std::string& limit, const std::string& why) {
    if (optional.count(limit) != 0) {
      if (warnings != nullptr) {
        warnings->push_back("cgroup limit '" + limit +
                            "' is not enforced (allowed as optional): " + why);
      }
    } else {
      gaps.push_back(limit + " limit unavailable: " + why);
    }
  };
  auto fail = [&]() -> Error {
    return make_error(
        ErrorCode::kFailedPrecondition, kUnavailableReason,
        join(gaps, "; ") + " (fix the host, or list the limit as optional to run without it)");
  };
  for (const auto& limit : wanted) {
    if (auto why = controller_gap(limit); why.empty()) {
      apply.push_back(limit);
    } else {
      unavailable(limit, why);
    }
  }
  if (!gaps.empty()) {
    return fail();
  }

  // From here on `cg` owns whatever exists: returning early removes it.
  auto cg = std::unique_ptr<Cgroup>(new Cgroup(version_, before_rmdir_, settle_timeout_));
  for (const auto& h : hierarchies_) {
    const std::string group_dir = h.own_dir + "/" + group;
    const std::string leaf = group_dir + "/" + name;
    bool made_leaf = false;
    for (int attempt = 0; attempt < kCreateAttempts && !made_leaf; ++attempt) {
      bool made_group = false;
      if (::mkdir(group_dir.c_str(), 0755) == 0) {
        made_group = true;
        if (after_mkdir_) {
          after_mkdir_(group_dir);
        }
      } else if (errno != EEXIST) {
        const int err = errno;
        return errno_error(sys::code_for_errno(err), kIoReason, "mkdir('" + group_dir + "', 0755)",
                           err);
      }
      if (!contains(cg->groups_, group_dir)) {
        cg->groups_.push_back(group_dir);
      }
      if (version_ == CgroupVersion::kV1 && made_group && contains(h.controllers, "memory")) {
        // cgroup-v1/memory.rst: with use_hierarchy 0 (old kernels' default) the group would not
        // account its children. Each leaf's own limit holds either way, so this is best effort.
        // It must be set while the group has no children.
        const std::string file = group_dir + "/memory.use_hierarchy";
        if (auto text = read_file(file); text && trim(*text) == "0") {
          if (auto r = write_file(file, "1"); !r && warnings != nullptr) {
            warnings->push_back(r.error().message);
          }
        }
      }
      if (version_ == CgroupVersion::kV2 && !h.controllers.empty()) {
        // Enable our controllers for the group's children. Only the group we made is written:
        // our own cgroup's subtree_control is the delegator's (checked at detect()). A group that
        // already existed is ours too (a sibling kernel's), so only what it lacks is added.
        const std::string file = group_dir + "/cgroup.subtree_control";
        std::vector<std::string> enabled;
        if (!made_group) {
          CELLGATE_ASSIGN_OR_RETURN(const std::string text, read_file(file));
          for (auto t : tokens(text)) {
            enabled.push_back(t.front() == '+' ? t.substr(1) : t);
          }
        }
        std::vector<std::string> enable;
        for (const auto& c : h.controllers) {
          if (!contains(enabled, c)) {
            enable.push_back("+" + c);
          }
        }
        if (!enable.empty()) {
          CELLGATE_TRY(write_file(file, join(enable, " ")));
        }
      }
      if (::mkdir(leaf.c_str(), 0755) == 0) {
        made_leaf = true;
        cg->paths_.push_back(leaf);
        cg->controllers_.push_back(h.controllers);
        if (after_mkdir_) {
          after_mkdir_(leaf);
        }
      } else if (errno == EEXIST) {
        // Not ours: maybe a kernel of an earlier gateway. Leave it alone.
        Error e = errno_error(ErrorCode::kFailedPrecondition, "cgroup_exists",
                              "mkdir('" + leaf + "', 0755)", EEXIST);
        e.message += "; a cgroup named '" + name + "' already exists in group '" + group +
                     "' (pick another name, or remove the stale cgroup)";
        return e;
      } else if (errno != ENOENT || attempt + 1 == kCreateAttempts) {
        // ENOENT: another Cgroup's remove() took the empty group away; make it again.
        const int err = errno;
        return errno_error(sys::code_for_errno(err), kIoReason, "mkdir('" + leaf + "', 0755)", err);
      }
    }
  }

  // Every limit file must be there: a controller can lack one (v1 memsw without swapaccount=1).
  std::vector<std::string> applied;
  for (const auto& limit : apply) {
    if (version_ == CgroupVersion::kV1 && limit == "swap" && !contains(applied, "memory")) {
      // v1 memsw is a limit on memory+swap; without the memory limit it cannot stop swapping.
      unavailable(limit, "it needs the memory limit, which is unavailable");
      continue;
    }
    std::string missing;
    for (const auto& lf : files_for(version_, limit)) {
      const std::string* dir = cg->dir_for(lf.controller);
      const std::string path = (dir != nullptr ? *dir : std::string("?")) + "/" + lf.file;
      if (dir == nullptr || !exists(path)) {
        missing = "the host lacks " + path + " (" + missing_file_hint(version_, limit) + ")";
        break;
      }
    }
    if (missing.empty()) {
      applied.push_back(limit);
    } else {
      unavailable(limit, missing);
    }
  }
  if (!gaps.empty()) {
    return fail();
  }

  const bool v1 = version_ == CgroupVersion::kV1;
  for (const auto& limit : applied) {
    const auto files = files_for(version_, limit);
    const std::string dir = *cg->dir_for(files.front().controller) + "/";
    if (limit == "memory") {
      CELLGATE_TRY(write_file(dir + files[0].file, std::to_string(*limits.memory_bytes)));
    } else if (limit == "swap") {
      // v1: memory+swap = memory, i.e. no swap; it must be written after memory.limit_in_bytes,
      // as the kernel keeps memsw >= memory (EINVAL otherwise). v2: swap on its own.
      CELLGATE_TRY(
          write_file(dir + files[0].file, v1 ? std::to_string(*limits.memory_bytes) : "0"));
    } else if (limit == "pids") {
      CELLGATE_TRY(write_file(dir + files[0].file, std::to_string(*limits.pids)));
    } else if (v1) {
      CELLGATE_TRY(write_file(dir + files[0].file, std::to_string(kCpuPeriodUsec)));
      CELLGATE_TRY(write_file(dir + files[1].file, std::to_string(cpu_quota)));
    } else {
      CELLGATE_TRY(write_file(dir + files[0].file,
                              std::to_string(cpu_quota) + " " + std::to_string(kCpuPeriodUsec)));
    }
  }
  return cg;
}

// --- Cgroup -----------------------------------------------------------------------------------

Cgroup::Cgroup(CgroupVersion version, std::function<void(const std::string&)> before_rmdir,
               std::chrono::milliseconds settle_timeout)
    : version_(version), before_rmdir_(std::move(before_rmdir)), settle_timeout_(settle_timeout) {}

std::unique_ptr<Cgroup> Cgroup::adopt(CgroupVersion version, std::vector<std::string> dirs) {
  std::unique_ptr<Cgroup> cg(new Cgroup(version, nullptr, std::chrono::milliseconds(3000)));
  for (auto& dir : dirs) {
    if (is_dir(dir)) {
      cg->paths_.push_back(std::move(dir));
      cg->controllers_.emplace_back();
    }
  }
  return cg;
}

Cgroup::~Cgroup() {
  static_cast<void>(kill_all());
  static_cast<void>(remove());
}

const std::vector<std::string>& Cgroup::paths() const {
  return paths_;
}

const std::string* Cgroup::dir_for(std::string_view controller) const {
  for (std::size_t i = 0; i < paths_.size(); ++i) {
    if (contains(controllers_[i], controller)) {
      return &paths_[i];
    }
  }
  return nullptr;
}

Result<void> Cgroup::add_process(pid_t pid) {
  if (pid <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "bad_pid",
                      "cannot add pid " + std::to_string(pid) + " to a cgroup");
  }
  if (removed_) {
    return make_error(ErrorCode::kFailedPrecondition, "cgroup_removed",
                      "the cgroup was removed; cannot add pid " + std::to_string(pid));
  }
  for (const auto& dir : paths_) {
    CELLGATE_TRY(write_file(dir + "/cgroup.procs", std::to_string(pid)));
  }
  return ok_result();
}

Result<void> Cgroup::kill_all() {
  if (removed_ || paths_.empty()) {
    return ok_result();
  }
  const auto deadline = std::chrono::steady_clock::now() + settle_timeout_;
  if (version_ == CgroupVersion::kV2) {
    // cgroup-v2.rst (Linux 5.14+): writing 1 to cgroup.kill SIGKILLs the whole subtree, racing
    // no fork. The loop below then only waits for it to empty.
    const std::string kill_file = paths_.front() + "/cgroup.kill";
    if (exists(kill_file)) {
      CELLGATE_TRY(write_file(kill_file, "1"));
    }
  }
  const pid_t self = ::getpid();
  while (true) {
    std::vector<pid_t> pids;
    for (const auto& dir : paths_) {
      collect_pids(dir, 0, &pids);
    }
    if (pids.empty()) {
      return ok_result();
    }
    if (std::find(pids.begin(), pids.end(), self) != pids.end()) {
      return make_error(ErrorCode::kFailedPrecondition, "cgroup_holds_self",
                        "this process (pid " + std::to_string(self) + ") is in " + paths_.front() +
                            "; not killing it");
    }
    // Every pid here is in a cgroup we created, so a process we (or our kernel) started. A pid
    // that exited meanwhile gives ESRCH; zombies leave cgroup.procs when they exit.
    for (const pid_t pid : pids) {
      ::kill(pid, SIGKILL);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<std::string> left;
      left.reserve(pids.size());
      for (const pid_t pid : pids) {
        left.push_back(std::to_string(pid));
      }
      return make_error(ErrorCode::kDeadlineExceeded, "cgroup_busy",
                        "pids " + join(left, ", ") + " still in " + paths_.front() +
                            " after SIGKILL for " + std::to_string(settle_timeout_.count()) +
                            " ms");
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

Result<void> Cgroup::remove_tree(const std::string& dir) {
  // Sub-cgroups first: rmdir of a cgroup with children fails (EBUSY).
  std::vector<std::pair<std::string, int>> stack{{dir, 0}};
  std::vector<std::string> order;  // parents before children
  while (!stack.empty()) {
    auto [d, depth] = stack.back();
    stack.pop_back();
    order.push_back(d);
    if (depth < kMaxTreeDepth) {
      for (auto& sub : subdirs(d)) {
        stack.emplace_back(std::move(sub), depth + 1);
      }
    }
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const auto deadline = std::chrono::steady_clock::now() + settle_timeout_;
    if (before_rmdir_ && is_dir(*it)) {
      before_rmdir_(*it);
    }
    while (::rmdir(it->c_str()) != 0) {
      const int err = errno;
      if (err == ENOENT) {
        break;
      }
      // EBUSY while a killed task is still exiting; it clears within milliseconds.
      if (err != EBUSY || std::chrono::steady_clock::now() >= deadline) {
        return errno_error(sys::code_for_errno(err), kIoReason, "rmdir('" + *it + "')", err);
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  return ok_result();
}

Result<void> Cgroup::remove() {
  if (removed_) {
    return ok_result();
  }
  for (const auto& leaf : paths_) {
    CELLGATE_TRY(remove_tree(leaf));
  }
  for (const auto& group : groups_) {
    // The group stays while other kernels' cgroups are in it (EBUSY; ENOTEMPTY in a fake tree).
    if (before_rmdir_ && is_dir(group)) {
      before_rmdir_(group);
    }
    if (::rmdir(group.c_str()) != 0 && errno != ENOENT && errno != EBUSY && errno != ENOTEMPTY) {
      const int err = errno;
      return errno_error(sys::code_for_errno(err), kIoReason, "rmdir('" + group + "')", err);
    }
  }
  removed_ = true;
  return ok_result();
}

}  // namespace cellgate::jail
