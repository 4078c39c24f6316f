// Internal to jail/: what the cgroup files share (cgroup.cpp: creating and removing a kernel's
// cgroup; cgroup_host.cpp: detecting the hierarchies; cgroup_stats.cpp: the one stats reader;
// cgroup_placement.cpp: v2 delegation). Text helpers for control files, file access with the
// cgroup errors, the names and limit files. /proc parsing is the sys floor's
// (cellgate/sys/proc.hpp).
#pragma once

#include <sys/types.h>

#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/result.hpp"
#include "cellgate/sys/proc.hpp"
#include "cellgate/sys/text.hpp"

namespace cellgate::jail::cgroup_internal {

// The controllers cellgate uses, in the order they are enabled and reported.
inline constexpr std::array<std::string_view, 3> kControllers = {"memory", "pids", "cpu"};
// sched-bwc.rst: the default period is 100 ms; a quota below 1 ms is rejected with EINVAL.
inline constexpr std::int64_t kCpuPeriodUsec = 100000;
inline constexpr std::int64_t kCpuMinQuotaUsec = 1000;
inline constexpr double kMaxCpus = 1 << 20;
inline constexpr std::size_t kMaxFileBytes = std::size_t{4} << 20;  // cgroup.procs of a big cgroup
inline constexpr int kMaxTreeDepth = 32;   // sub-cgroups a kernel may have made below its own
inline constexpr int kCreateAttempts = 4;  // a concurrent remove() may rmdir the group under us
inline constexpr auto kPollInterval = std::chrono::milliseconds(10);

inline constexpr const char* kIoReason = "cgroup_io_failed";
inline constexpr const char* kUnavailableReason = "limit_unavailable";

using sys::split;  // cellgate/sys/text.hpp
using sys::trim;
// Whitespace-separated tokens, as in cgroup.controllers ("cpu memory pids").
std::vector<std::string> tokens(std::string_view s);
bool contains(const std::vector<std::string>& v, std::string_view x);
std::string join(const std::vector<std::string>& v, std::string_view sep);

template <typename T>
inline std::optional<T> parse_int(std::string_view s) {
  s = trim(s);
  T value{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    return std::nullopt;
  }
  return value;
}

// The value of "key N" in a flat-keyed file (memory.events, pids.events, cpu.stat,
// memory.oom_control); 0 when the key is absent or its value is not a number.
std::uint64_t keyed_value(std::string_view text, std::string_view key);
std::uint64_t number_in(const std::optional<std::string>& text);

bool exists(const std::string& path);
bool is_dir(const std::string& path);
// sys::read_file / read_optional / write_file with the cgroup reason ("cgroup_io_failed") and
// the size bound of a big cgroup.procs.
Result<std::string> read_file(const std::string& path);
Result<std::optional<std::string>> read_optional(const std::string& path);
Result<void> write_file(const std::string& path, const std::string& value);
// Subdirectories (not following symlinks) of `dir`; nested cgroups a kernel may have made.
std::vector<std::string> subdirs(const std::string& dir);
// The pids in `dir`'s cgroup.procs and in those of its sub-cgroups.
void collect_pids(const std::string& dir, int depth, std::vector<pid_t>* pids);

// The cgroup and cgroup2 mounts of a mountinfo text.
using Mount = sys::MountInfo;
std::vector<Mount> cgroup_mounts(std::string_view mountinfo);
// An absolute path without "." or ".." components (v2 appends " (deleted)" to a removed cgroup,
// and a cgroup namespace shows "/.." for cgroups outside it: neither is one we can use).
bool clean_absolute(std::string_view p);
// Our own cgroup's directory in mount `m`, given our path in its hierarchy from
// /proc/self/cgroup; nullopt when this mount does not show our cgroup.
std::optional<std::string> own_dir_in(const Mount& m, const std::string& own_path,
                                      const std::string& prefix);
// Names of a group or kernel cgroup: one path component of ordinary characters, so that it
// cannot climb out of our cgroup or collide with control files ("cgroup.procs", "memory.max").
Result<void> check_name(const std::string& what, const std::string& s);

std::string controller_of(const std::string& limit);
struct LimitFile {
  std::string controller;
  std::string file;
};
// The files that carry `limit`, in the order they must be written.
std::vector<LimitFile> files_for(CgroupVersion v, const std::string& limit);
// What a missing limit file means, for the operator.
std::string missing_file_hint(CgroupVersion v, const std::string& limit);

}  // namespace cellgate::jail::cgroup_internal
