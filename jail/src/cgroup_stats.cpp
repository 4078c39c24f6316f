// The one reader of a cgroup's figures (memory, pids, cpu, throttling), for the launcher's own
// cgroup and for the gateway reading a launcher's from outside. v1 and v2 file names differ;
// the numbers mean the same.
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

namespace {

// cpu.stat's throttling figures (sched-bwc.rst): v1 throttled_time is in ns, v2's in usec. The
// v2 file has them only where the cpu controller is enabled.
void add_throttling(CgroupStats& s, const std::optional<std::string>& stat, bool v1) {
  if (!stat) {
    return;
  }
  s.cpu_nr_throttled = keyed_value(*stat, "nr_throttled");
  s.cpu_throttled_usec =
      v1 ? keyed_value(*stat, "throttled_time") / 1000 : keyed_value(*stat, "throttled_usec");
}

}  // namespace

Result<CgroupStats> Cgroup::stats() const {
  if (removed_) {
    return make_error(ErrorCode::kNotFound, "cgroup_removed", "the cgroup was removed");
  }
  return read_cgroup_stats(version_, paths_);
}

// Each figure from whichever directory has its file: on v1 the memory, pids and cpu hierarchies
// are separate directories (in any order), on v2 there is one.
Result<CgroupStats> read_cgroup_stats(CgroupVersion version, const std::vector<std::string>& dirs) {
  const bool v1 = version == CgroupVersion::kV1;
  CgroupStats s;
  for (const auto& dir : dirs) {
    if (!is_dir(dir)) {
      return make_error(ErrorCode::kNotFound, "cgroup_removed", dir + " no longer exists");
    }
    CELLGATE_ASSIGN_OR_RETURN(const auto current, read_optional(dir + (v1 ? "/memory.usage_in_bytes"
                                                                          : "/memory.current")));
    if (current) {
      s.memory_current_bytes = number_in(current);
    }
    // v2: memory.peak is there since Linux 5.19.
    CELLGATE_ASSIGN_OR_RETURN(
        const auto peak, read_optional(dir + (v1 ? "/memory.max_usage_in_bytes" : "/memory.peak")));
    if (peak) {
      s.memory_peak_bytes = number_in(peak);
    }
    // v1: the oom_kill line is there since Linux 4.13; older kernels report 0.
    CELLGATE_ASSIGN_OR_RETURN(const auto events,
                              read_optional(dir + (v1 ? "/memory.oom_control" : "/memory.events")));
    if (events) {
      s.oom_kills = keyed_value(*events, "oom_kill");
    }
    CELLGATE_ASSIGN_OR_RETURN(const auto pids, read_optional(dir + "/pids.current"));
    if (pids) {
      s.pids_current = parse_int<std::int64_t>(*pids).value_or(0);
    }
    CELLGATE_ASSIGN_OR_RETURN(const auto pids_events, read_optional(dir + "/pids.events"));
    if (pids_events) {
      s.pids_limit_hits = keyed_value(*pids_events, "max");
    }
    if (v1) {
      // cpuacct.usage (ns) is in the cpu directory only where cpu and cpuacct are co-mounted.
      CELLGATE_ASSIGN_OR_RETURN(const auto usage, read_optional(dir + "/cpuacct.usage"));
      if (usage) {
        s.cpu_usage_usec = number_in(usage) / 1000;
        s.cpu_usage_known = true;
      }
      // In the cpu hierarchy's directory, with or without cpuacct beside it.
      CELLGATE_ASSIGN_OR_RETURN(const auto stat, read_optional(dir + "/cpu.stat"));
      add_throttling(s, stat, v1);
    } else {
      // v2: cpu.stat's usage_usec is core, there with or without the cpu controller.
      CELLGATE_ASSIGN_OR_RETURN(const auto stat, read_optional(dir + "/cpu.stat"));
      if (stat) {
        s.cpu_usage_usec = keyed_value(*stat, "usage_usec");
        s.cpu_usage_known = true;
      }
      add_throttling(s, stat, v1);
    }
  }
  if (!s.cpu_usage_known && !dirs.empty()) {
    // No CPU accounting in the cgroup: add up its processes' times from /proc.
    CELLGATE_ASSIGN_OR_RETURN(const auto procs, read_optional(dirs.front() + "/cgroup.procs"));
    if (procs) {
      const long ticks = ::sysconf(_SC_CLK_TCK);
      std::uint64_t total_ticks = 0;
      for (const auto line : split(*procs, '\n')) {
        const auto pid = parse_int<pid_t>(line);
        if (!pid || *pid <= 0) {
          continue;
        }
        if (auto st = sys::read_proc_stat(*pid)) {  // else gone meanwhile
          total_ticks += st->utime + st->stime + st->cutime + st->cstime;
        }
      }
      if (ticks > 0) {
        s.cpu_usage_usec = total_ticks * 1000000 / static_cast<std::uint64_t>(ticks);
        s.cpu_usage_known = true;
      }
    }
  }
  return s;
}

}  // namespace cellgate::jail

namespace cellgate::jail {

using namespace cgroup_internal;  // NOLINT(google-build-using-namespace): this room's helpers

namespace {

// The directory of `dirs` holding the CPU quota file, and the file's path.
Result<std::string> cpu_quota_file(CgroupVersion version, const std::vector<std::string>& dirs) {
  // The file the jail writes the quota to: the last of the CPU limit's files.
  const std::string name = files_for(version, "cpu").back().file;
  for (const auto& dir : dirs) {
    if (!is_dir(dir)) {
      return make_error(ErrorCode::kNotFound, "cgroup_removed", dir + " no longer exists");
    }
    if (exists(dir + "/" + name)) {
      return dir + "/" + name;
    }
  }
  return make_error(ErrorCode::kFailedPrecondition, "cpu_limit_unavailable",
                    "the kernel's cgroup has no CPU limit file (" + name + ")");
}

}  // namespace

Result<std::string> read_cpu_quota(CgroupVersion version, const std::vector<std::string>& dirs) {
  CELLGATE_ASSIGN_OR_RETURN(const std::string path, cpu_quota_file(version, dirs));
  CELLGATE_ASSIGN_OR_RETURN(std::string text, cgroup_internal::read_file(path));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.pop_back();
  }
  return text;
}

Result<void> write_cpu_quota(CgroupVersion version, const std::vector<std::string>& dirs,
                             const std::string& value) {
  CELLGATE_ASSIGN_OR_RETURN(const std::string path, cpu_quota_file(version, dirs));
  return cgroup_internal::write_file(path, value);
}

std::string least_cpu_quota(CgroupVersion version) {
  // The smallest quota the kernel takes, in the period the jail writes: 1% of one CPU.
  return version == CgroupVersion::kV1 ? std::to_string(cgroup_internal::kCpuMinQuotaUsec)
                                       : std::to_string(cgroup_internal::kCpuMinQuotaUsec) + " " +
                                             std::to_string(cgroup_internal::kCpuPeriodUsec);
}

}  // namespace cellgate::jail
