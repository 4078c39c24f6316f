// Readers of /proc (proc(5)), each a pure parser of the file's text plus a reader of a live
// process, so the parsers are tested on fixed text and the readers on our own process.
//
//   CELLGATE_ASSIGN_OR_RETURN(sys::ProcStat st, sys::read_proc_stat(pid));   // st.start_time
//   auto rss = sys::status_field(text, "VmRSS");                            // "1234 kB"
//   for (const auto& line : sys::parse_proc_cgroup(text)) { ... }
//
// Untrusted text: a process chooses its own command name (which may hold spaces and ')'), its
// environment and, inside a mount namespace, what mountinfo lists. Parsers never throw; a
// malformed line is skipped, a malformed file is an error.
//
// Thread-safety: functions without shared state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::sys {

// /proc/<pid>/stat: the fields cellgate reads.
struct ProcStat {
  pid_t pid = 0;
  std::string comm;         // field 2, without the parentheses
  char state = '?';         // field 3
  pid_t ppid = 0;           // field 4
  std::uint64_t utime = 0;  // fields 14-17, in clock ticks
  std::uint64_t stime = 0;
  std::uint64_t cutime = 0;
  std::uint64_t cstime = 0;
  std::string start_time;  // field 22, ticks since boot, as text (compared, never computed)
  // utime + stime + cutime + cstime in microseconds.
  std::uint64_t cpu_usec() const;
};
Result<ProcStat> parse_proc_stat(std::string_view text);
Result<ProcStat> read_proc_stat(pid_t pid, const std::string& proc = "/proc");
// Field `field` (1-based, as proc(5) numbers them; >= 3) of a stat text, "" when absent.
std::string proc_stat_field(std::string_view text, int field);

// The value of "Key:\tvalue" in a status text (/proc/<pid>/status), trimmed; nullopt if absent.
std::optional<std::string> status_field(std::string_view text, std::string_view key);
// "Uid:" of a status text: real, effective, saved, filesystem (empty if absent or malformed).
std::vector<uid_t> status_ids(std::string_view text, std::string_view key);
// status_field of /proc/<pid>/status ("self" for our own).
std::optional<std::string> read_status_field(const std::string& pid, std::string_view key,
                                             const std::string& proc = "/proc");

// /proc/<pid>/cgroup: "hierarchy-ID:controller-list:cgroup-path" (the path may hold ':').
struct ProcCgroupLine {
  std::string id;
  std::vector<std::string> controllers;  // empty for the v2 line "0::/path"
  std::string path;
};
std::vector<ProcCgroupLine> parse_proc_cgroup(std::string_view text);

// /proc/<pid>/mountinfo: "id parent maj:min root mountpoint options [optional…] - fstype source
// superoptions"; octal escapes (\040) undone.
struct MountInfo {
  std::string root;        // the mounted subtree of the filesystem
  std::string mountpoint;  // where it is mounted
  std::string fstype;
  std::string source;
  std::vector<std::string> super_options;
};
std::vector<MountInfo> parse_mountinfo(std::string_view text);
// mountinfo's \ooo escapes (space, tab, newline, backslash) undone.
std::string unescape_octal(std::string_view s);

// /proc/<pid>/environ: NUL-separated NAME=value; entries without '=' are skipped, and at most
// `max_entries` are kept.
std::map<std::string, std::string> parse_environ(std::string_view text,
                                                 std::size_t max_entries = 4096);
Result<std::map<std::string, std::string>> read_environ(pid_t pid,
                                                        const std::string& proc = "/proc");

// /proc/<pid>/cmdline: the NUL-separated arguments.
std::vector<std::string> parse_cmdline(std::string_view text);

// The pids listed in /proc (its numeric entries).
std::vector<pid_t> list_pids(const std::string& proc = "/proc");

// The descriptors this process has open (<proc>/self/fd), without the one that lists them;
// empty when the directory cannot be read.
std::vector<int> open_fds(const std::string& proc = "/proc");

}  // namespace cellgate::sys
