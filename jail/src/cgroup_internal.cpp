// The cgroup files' shared helpers (cgroup_internal.hpp).
#include "cgroup_internal.hpp"

#include <sys/stat.h>

#include <algorithm>

#include "cellgate/sys/dir_stream.hpp"
#include "cellgate/sys/file.hpp"

namespace cellgate::jail::cgroup_internal {

// Whitespace-separated tokens, as in cgroup.controllers ("cpu memory pids").

std::vector<std::string> tokens(std::string_view s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    const auto start = s.find_first_not_of(" \t\r\n", i);
    if (start == std::string_view::npos) {
      break;
    }
    const auto end = std::min(s.find_first_of(" \t\r\n", start), s.size());
    out.emplace_back(s.substr(start, end - start));
    i = end;
  }
  return out;
}

bool contains(const std::vector<std::string>& v, std::string_view x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) {
      out += sep;
    }
    out += s;
  }
  return out;
}

std::uint64_t keyed_value(std::string_view text, std::string_view key) {
  for (auto line : split(text, '\n')) {
    line = trim(line);
    const auto space = line.find_first_of(" \t");
    if (space != std::string_view::npos && line.substr(0, space) == key) {
      return parse_int<std::uint64_t>(line.substr(space + 1)).value_or(0);
    }
  }
  return 0;
}

std::uint64_t number_in(const std::optional<std::string>& text) {
  return text ? parse_int<std::uint64_t>(*text).value_or(0) : 0;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Result<std::string> read_file(const std::string& path) {
  return sys::read_file(path, kMaxFileBytes, kIoReason);
}

Result<std::optional<std::string>> read_optional(const std::string& path) {
  return sys::read_optional(path, kMaxFileBytes, kIoReason);
}

// One write(2) of the whole value, as the kernel parses a control file per write.
Result<void> write_file(const std::string& path, const std::string& value) {
  return sys::write_file(path, value, kIoReason);
}

std::vector<std::string> subdirs(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& name : sys::list_dir(dir)) {
    const std::string path = dir + "/" + name;
    if (is_dir(path)) {
      out.push_back(path);
    }
  }
  return out;
}

void collect_pids(const std::string& dir, int depth, std::vector<pid_t>* pids) {
  if (depth > kMaxTreeDepth) {
    return;
  }
  if (auto text = read_file(dir + "/cgroup.procs")) {
    for (const auto line : split(*text, '\n')) {
      const auto pid = parse_int<pid_t>(line);
      if (pid && *pid > 0 && std::find(pids->begin(), pids->end(), *pid) == pids->end()) {
        pids->push_back(*pid);
      }
    }
  }
  for (const auto& sub : subdirs(dir)) {
    collect_pids(sub, depth + 1, pids);
  }
}

std::vector<Mount> cgroup_mounts(std::string_view mountinfo) {
  std::vector<Mount> out;
  for (auto& m : sys::parse_mountinfo(mountinfo)) {
    if (m.fstype == "cgroup" || m.fstype == "cgroup2") {
      out.push_back(std::move(m));
    }
  }
  return out;
}

bool clean_absolute(std::string_view p) {
  if (p.empty() || p.front() != '/' || p.find('\0') != std::string_view::npos ||
      p.find(" (deleted)") != std::string_view::npos) {
    return false;
  }
  for (const auto c : split(p.substr(1), '/')) {
    if (c == "." || c == "..") {
      return false;
    }
  }
  return true;
}

// Our own cgroup's directory in mount `m`, given our path in its hierarchy from
// /proc/self/cgroup; nullopt when this mount does not show our cgroup.
std::optional<std::string> own_dir_in(const Mount& m, const std::string& own_path,
                                      const std::string& prefix) {
  if (!clean_absolute(own_path) || !clean_absolute(m.root) || !clean_absolute(m.mountpoint)) {
    return std::nullopt;
  }
  std::string rel;
  if (m.root == "/") {
    rel = own_path;
  } else if (own_path == m.root) {
    rel = "/";
  } else if (own_path.size() > m.root.size() && own_path.compare(0, m.root.size(), m.root) == 0 &&
             own_path[m.root.size()] == '/') {
    rel = own_path.substr(m.root.size());
  } else {
    return std::nullopt;
  }
  std::string dir = prefix + m.mountpoint;
  while (dir.size() > 1 && dir.back() == '/') {
    dir.pop_back();
  }
  if (rel != "/") {
    dir += rel;
  }
  while (dir.size() > 1 && dir.back() == '/') {
    dir.pop_back();
  }
  return dir;
}

// Names of a group or kernel cgroup: one path component of ordinary characters, so that it
// cannot climb out of our cgroup or collide with control files ("cgroup.procs", "memory.max").
Result<void> check_name(const std::string& what, const std::string& s) {
  const bool ok_chars = std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '@';
  });
  if (s.empty() || s.size() > 200 || !ok_chars) {
    return make_error(ErrorCode::kInvalidArgument, "bad_cgroup_name",
                      "cgroup " + what + " '" + s +
                          "' must be 1-200 characters of [A-Za-z0-9_@-] (no '.' or '/')");
  }
  return ok_result();
}

std::string controller_of(const std::string& limit) {
  return limit == "swap" ? "memory" : limit;
}

// The files that carry `limit`, in the order they must be written.
std::vector<LimitFile> files_for(CgroupVersion v, const std::string& limit) {
  const bool v1 = v == CgroupVersion::kV1;
  if (limit == "memory") {
    return {{"memory", v1 ? "memory.limit_in_bytes" : "memory.max"}};
  }
  if (limit == "swap") {
    return {{"memory", v1 ? "memory.memsw.limit_in_bytes" : "memory.swap.max"}};
  }
  if (limit == "pids") {
    return {{"pids", "pids.max"}};
  }
  if (v1) {
    return {{"cpu", "cpu.cfs_period_us"}, {"cpu", "cpu.cfs_quota_us"}};
  }
  return {{"cpu", "cpu.max"}};
}

// What a missing limit file means, for the operator.
std::string missing_file_hint(CgroupVersion v, const std::string& limit) {
  if (limit == "swap") {
    return v == CgroupVersion::kV1
               ? "swap accounting is off: boot the kernel with swapaccount=1"
               : "swap accounting is off: a kernel with CONFIG_MEMCG_SWAP and swapaccount=1";
  }
  if (limit == "cpu") {
    return "the kernel has no CFS bandwidth control (CONFIG_CFS_BANDWIDTH)";
  }
  return "this kernel does not provide it";
}

}  // namespace cellgate::jail::cgroup_internal
