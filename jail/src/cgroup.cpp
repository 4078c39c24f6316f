// Per-kernel cgroups on v1 and v2. Kernel docs this follows:
//   v1: Documentation/admin-guide/cgroup-v1/{cgroups,memory,pids}.rst, scheduler/sched-bwc.rst
//   v2: Documentation/admin-guide/cgroup-v2.rst ("Delegation", "No Internal Process Constraint")
//   both: proc(5) /proc/self/cgroup and /proc/self/mountinfo
#include "cellgate/jail/cgroup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <iterator>
#include <sstream>
#include <thread>
#include <utility>

#include "cellgate/unique_fd.hpp"

namespace cellgate::jail {
namespace {

// The controllers cellgate uses, in the order they are enabled and reported.
constexpr std::array<std::string_view, 3> kControllers = {"memory", "pids", "cpu"};
// sched-bwc.rst: the default period is 100 ms; a quota below 1 ms is rejected with EINVAL.
constexpr std::int64_t kCpuPeriodUsec = 100000;
constexpr std::int64_t kCpuMinQuotaUsec = 1000;
constexpr double kMaxCpus = 1 << 20;
constexpr std::size_t kMaxFileBytes = std::size_t{4} << 20;  // cgroup.procs of a big cgroup
constexpr int kMaxTreeDepth = 32;   // sub-cgroups a kernel may have made below its own
constexpr int kCreateAttempts = 4;  // a concurrent remove() may rmdir the group under us
constexpr auto kPollInterval = std::chrono::milliseconds(10);

constexpr const char* kIoReason = "cgroup_io_failed";
constexpr const char* kUnavailableReason = "limit_unavailable";

ErrorCode code_for_errno(int err) {
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS:
      return ErrorCode::kPermissionDenied;
    default:
      return ErrorCode::kInternal;
  }
}

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) {
    return {};
  }
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    const auto pos = s.find(sep);
    out.push_back(s.substr(0, pos));
    if (pos == std::string_view::npos) {
      return out;
    }
    s.remove_prefix(pos + 1);
  }
}

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

template <typename T>
std::optional<T> parse_int(std::string_view s) {
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

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Result<std::string> read_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return errno_error(code_for_errno(err), kIoReason, "open('" + path + "', O_RDONLY)", err);
  }
  std::string out;
  char buf[4096];
  while (out.size() < kMaxFileBytes) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      const int err = errno;
      return errno_error(code_for_errno(err), kIoReason, "read('" + path + "')", err);
    }
    if (n == 0) {
      break;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// The file's text, or nullopt when it does not exist (a file this kernel does not have).
Result<std::optional<std::string>> read_optional(const std::string& path) {
  auto text = read_file(path);
  if (!text) {
    if (!exists(path)) {
      return std::optional<std::string>();
    }
    return std::move(text).error();
  }
  return std::optional<std::string>(std::move(text).value());
}

// One write(2) of the whole value, as the kernel parses a control file per write. No O_CREAT:
// a control file that does not exist must fail, not appear as a regular file.
Result<void> write_file(const std::string& path, const std::string& value) {
  const std::string call = "write('" + path + "', '" + value + "')";
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return errno_error(code_for_errno(err), kIoReason, call, err);
  }
  ssize_t n = -1;
  do {
    n = ::write(fd.get(), value.data(), value.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int err = errno;
    return errno_error(code_for_errno(err), kIoReason, call, err);
  }
  if (static_cast<std::size_t>(n) != value.size()) {
    return make_error(ErrorCode::kInternal, kIoReason, call + ": short write");
  }
  return ok_result();
}

std::uint64_t number_in(const std::optional<std::string>& text) {
  return text ? parse_int<std::uint64_t>(*text).value_or(0) : 0;
}

// Subdirectories (not following symlinks) of `dir`; nested cgroups a kernel may have made.
std::vector<std::string> subdirs(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    return out;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string_view n = e->d_name;
    if (n == "." || n == "..") {
      continue;
    }
    const std::string path = dir + "/" + std::string(n);
    if (is_dir(path)) {
      out.push_back(path);
    }
  }
  ::closedir(d);
  return out;
}

// The pids in `dir`'s cgroup.procs and in those of its sub-cgroups.
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

// --- detection --------------------------------------------------------------------------------

struct ProcCgroupLine {
  std::string id;
  std::vector<std::string> controllers;  // empty for the v2 line "0::/path"
  std::string path;
};

// proc(5): "hierarchy-ID:controller-list:cgroup-path"; the path may itself contain ':'.
std::vector<ProcCgroupLine> parse_proc_cgroup(std::string_view text) {
  std::vector<ProcCgroupLine> out;
  for (const auto raw : split(text, '\n')) {
    const auto line = trim(raw);
    const auto c1 = line.find(':');
    const auto c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) {
      continue;
    }
    ProcCgroupLine l;
    l.id = std::string(line.substr(0, c1));
    for (const auto c : split(line.substr(c1 + 1, c2 - c1 - 1), ',')) {
      if (!c.empty()) {
        l.controllers.emplace_back(c);
      }
    }
    l.path = std::string(line.substr(c2 + 1));
    out.push_back(std::move(l));
  }
  return out;
}

struct Mount {
  std::string root;                        // the mounted subtree of the hierarchy
  std::string mountpoint;                  // where it is mounted
  std::string fstype;                      // "cgroup" (v1) or "cgroup2"
  std::vector<std::string> super_options;  // v1: the controllers, among "rw", "name=…"
};

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_octal(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const auto oct = s.substr(i + 1, 3);
      if (std::all_of(oct.begin(), oct.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out += static_cast<char>(((oct[0] - '0') << 6) | ((oct[1] - '0') << 3) | (oct[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// proc(5) mountinfo: "id parent maj:min root mountpoint options [optional…] - fstype source
// superoptions". Only cgroup and cgroup2 mounts are kept; malformed lines are skipped.
std::vector<Mount> parse_mountinfo(std::string_view text) {
  std::vector<Mount> out;
  for (const auto raw : split(text, '\n')) {
    std::vector<std::string_view> f;
    for (const auto field : split(trim(raw), ' ')) {
      if (!field.empty()) {
        f.push_back(field);
      }
    }
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (dash == f.end() || dash - f.begin() < 6 || f.end() - dash < 4) {
      continue;
    }
    Mount m;
    m.fstype = std::string(dash[1]);
    if (m.fstype != "cgroup" && m.fstype != "cgroup2") {
      continue;
    }
    m.root = unescape_octal(f[3]);
    m.mountpoint = unescape_octal(f[4]);
    for (const auto o : split(dash[3], ',')) {
      m.super_options.emplace_back(o);
    }
    out.push_back(std::move(m));
  }
  return out;
}

// An absolute path without "." or ".." components (v2 appends " (deleted)" to a removed cgroup,
// and a cgroup namespace shows "/.." for cgroups outside it: neither is one we can use).
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

struct LimitFile {
  std::string controller;
  std::string file;
};

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

}  // namespace

// --- CgroupHost -------------------------------------------------------------------------------

Result<CgroupHost> CgroupHost::detect(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                      std::string root_prefix, const std::string& parent) {
  auto lines = parse_proc_cgroup(proc_self_cgroup);
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
  const auto mounts = parse_mountinfo(mountinfo);
  CgroupHost host;

  // v1: each controller we use lives in the hierarchy that /proc/self/cgroup names it in.
  bool any_v1 = false;
  for (const auto controller : kControllers) {
    const std::string c(controller);
    const auto line = std::find_if(lines.begin(), lines.end(), [&](const ProcCgroupLine& l) {
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
  const auto v2_line = std::find_if(lines.begin(), lines.end(), [](const ProcCgroupLine& l) {
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
      host.missing_[c] = "the " + c + " controller is not delegated to this process's cgroup: " +
                         *v2_dir + "/cgroup.subtree_control lacks it (delegate it, e.g. " +
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
        return errno_error(code_for_errno(err), kIoReason, "mkdir('" + group_dir + "', 0755)", err);
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
        return errno_error(code_for_errno(err), kIoReason, "mkdir('" + leaf + "', 0755)", err);
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

Result<CgroupStats> Cgroup::stats() const {
  if (removed_) {
    return make_error(ErrorCode::kNotFound, "cgroup_removed", "the cgroup was removed");
  }
  for (const auto& dir : paths_) {
    if (!is_dir(dir)) {
      return make_error(ErrorCode::kNotFound, "cgroup_removed", dir + " no longer exists");
    }
  }
  const bool v1 = version_ == CgroupVersion::kV1;
  CgroupStats s;
  const auto read = read_optional;
  if (const auto* dir = dir_for("memory")) {
    CELLGATE_ASSIGN_OR_RETURN(const auto events,
                              read(*dir + (v1 ? "/memory.oom_control" : "/memory.events")));
    // v1: the oom_kill line is there since Linux 4.13; older kernels report 0.
    s.oom_kills = events ? keyed_value(*events, "oom_kill") : 0;
    CELLGATE_ASSIGN_OR_RETURN(const auto current,
                              read(*dir + (v1 ? "/memory.usage_in_bytes" : "/memory.current")));
    s.memory_current_bytes = number_in(current);
    // v2: memory.peak is there since Linux 5.19.
    CELLGATE_ASSIGN_OR_RETURN(const auto peak,
                              read(*dir + (v1 ? "/memory.max_usage_in_bytes" : "/memory.peak")));
    s.memory_peak_bytes = number_in(peak);
  }
  if (const auto* dir = dir_for("pids")) {
    CELLGATE_ASSIGN_OR_RETURN(const auto current, read(*dir + "/pids.current"));
    s.pids_current = current ? parse_int<std::int64_t>(*current).value_or(0) : 0;
    CELLGATE_ASSIGN_OR_RETURN(const auto events, read(*dir + "/pids.events"));
    s.pids_limit_hits = events ? keyed_value(*events, "max") : 0;
  }
  if (v1) {
    // cpuacct.usage (ns) is in the cpu directory only where cpu and cpuacct are co-mounted.
    if (const auto* dir = dir_for("cpu")) {
      CELLGATE_ASSIGN_OR_RETURN(const auto usage, read(*dir + "/cpuacct.usage"));
      s.cpu_usage_usec = number_in(usage) / 1000;
      CELLGATE_ASSIGN_OR_RETURN(const auto stat, read(*dir + "/cpu.stat"));
      add_throttling(s, stat, v1);
    }
  } else if (!paths_.empty()) {
    // v2: cpu.stat's usage_usec is core, there with or without the cpu controller.
    CELLGATE_ASSIGN_OR_RETURN(const auto stat, read(paths_.front() + "/cpu.stat"));
    s.cpu_usage_usec = stat ? keyed_value(*stat, "usage_usec") : 0;
    add_throttling(s, stat, v1);
  }
  return s;
}

Result<CgroupStats> read_cgroup_stats(CgroupVersion version, const std::vector<std::string>& dirs) {
  const bool v1 = version == CgroupVersion::kV1;
  CgroupStats s;
  for (const auto& dir : dirs) {
    if (!is_dir(dir)) {
      return make_error(ErrorCode::kNotFound, "cgroup_removed", dir + " no longer exists");
    }
    CELLGATE_ASSIGN_OR_RETURN(const auto current,
                              read_optional(dir + (v1 ? "/memory.usage_in_bytes" : "/memory.current")));
    if (current) {
      s.memory_current_bytes = number_in(current);
    }
    CELLGATE_ASSIGN_OR_RETURN(const auto peak,
                              read_optional(dir + (v1 ? "/memory.max_usage_in_bytes" : "/memory.peak")));
    if (peak) {
      s.memory_peak_bytes = number_in(peak);
    }
    CELLGATE_ASSIGN_OR_RETURN(const auto events,
                              read_optional(dir + (v1 ? "/memory.oom_control" : "/memory.events")));
    if (events) {
      s.oom_kills = keyed_value(*events, "oom_kill");
    }
    CELLGATE_ASSIGN_OR_RETURN(const auto pids, read_optional(dir + "/pids.current"));
    if (pids) {
      s.pids_current = parse_int<std::int64_t>(*pids).value_or(0);
    }
    if (v1) {
      CELLGATE_ASSIGN_OR_RETURN(const auto usage, read_optional(dir + "/cpuacct.usage"));
      if (usage) {
        s.cpu_usage_usec = number_in(usage) / 1000;
        s.cpu_usage_known = true;
      }
      // In the cpu hierarchy's directory, with or without cpuacct beside it.
      CELLGATE_ASSIGN_OR_RETURN(const auto stat, read_optional(dir + "/cpu.stat"));
      add_throttling(s, stat, v1);
    } else {
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
      std::istringstream pids(*procs);
      for (std::string pid; pids >> pid;) {
        auto stat = read_optional("/proc/" + pid + "/stat");
        if (!stat || !*stat) {
          continue;  // gone meanwhile
        }
        // Fields after the command (which may hold spaces) start after the last ')'.
        const auto close = (*stat)->rfind(')');
        if (close == std::string::npos) {
          continue;
        }
        std::istringstream fields((*stat)->substr(close + 2));
        std::vector<std::string> f(std::istream_iterator<std::string>(fields), {});
        // state is field 3; utime, stime, cutime, cstime are fields 14-17.
        for (std::size_t i = 11; i <= 14 && i < f.size(); ++i) {
          total_ticks += parse_int<std::uint64_t>(f[i]).value_or(0);
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
        return errno_error(code_for_errno(err), kIoReason, "rmdir('" + *it + "')", err);
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
      return errno_error(code_for_errno(err), kIoReason, "rmdir('" + group + "')", err);
    }
  }
  removed_ = true;
  return ok_result();
}

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
  const auto lines = parse_proc_cgroup(view.proc_self_cgroup);
  const auto line = std::find_if(lines.begin(), lines.end(), [](const ProcCgroupLine& l) {
    return l.id == "0" && l.controllers.empty();
  });
  if (line == lines.end()) {
    return std::nullopt;
  }
  for (const auto& m : parse_mountinfo(view.mountinfo)) {
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
  std::string m = "kernels need cgroups of their own with the memory, pids and cpu controllers, "
                  "but this process's cgroup " + own_path +
                  " is not delegated to it (cgroup v2 enables controllers for child cgroups only "
                  "where nobody else manages them and no process sits, and systemd did not "
                  "delegate this one). ";
  const std::string cmd = command_line.empty() ? "cellgate serve …" : command_line;
  const bool session = own_path.find("/session-") != std::string::npos && own_path.ends_with(".scope");
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
      CELLGATE_ASSIGN_OR_RETURN(host, CgroupHost::detect(view.proc_self_cgroup, view.mountinfo,
                                                         view.root_prefix,
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
    return errno_error(code_for_errno(err), kIoReason, "mkdir('" + leaf + "', 0755)", err);
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
          return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("-_./=:,@+%").find(c) != std::string_view::npos;
        });
        std::string quoted = "'";
        for (const char c : arg) {
          quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
        }
        r.command_line += (r.command_line.empty() ? "" : " ") + (plain ? std::string(arg) : quoted + "'");
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
