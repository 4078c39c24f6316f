#include "cellgate/sys/proc.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "cellgate/sys/dir_stream.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/text.hpp"

namespace cellgate::sys {
namespace {

// Whitespace-separated fields.
std::vector<std::string_view> fields(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) {
      ++i;
    }
    const std::size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t' && s[i] != '\n') {
      ++i;
    }
    if (i > start) {
      out.push_back(s.substr(start, i - start));
    }
  }
  return out;
}

template <typename T>
std::optional<T> number(std::string_view s) {
  T value{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    return std::nullopt;
  }
  return value;
}

// The fields after "pid (comm) ", i.e. from field 3 on. The command may hold spaces and ')':
// the fields start after the last ')'.
std::optional<std::vector<std::string_view>> stat_tail(std::string_view text) {
  const auto close = text.rfind(')');
  if (close == std::string_view::npos || close + 2 > text.size()) {
    return std::nullopt;
  }
  return fields(text.substr(close + 2));
}

}  // namespace

std::uint64_t ProcStat::cpu_usec() const {
  const long ticks = ::sysconf(_SC_CLK_TCK);
  if (ticks <= 0) {
    return 0;
  }
  return (utime + stime + cutime + cstime) * 1000000 / static_cast<std::uint64_t>(ticks);
}

Result<ProcStat> parse_proc_stat(std::string_view text) {
  const auto open = text.find(" (");
  const auto close = text.rfind(')');
  auto tail = stat_tail(text);
  if (open == std::string_view::npos || close == std::string_view::npos || close < open || !tail ||
      tail->size() < 20) {
    return make_error(ErrorCode::kInvalidArgument, "proc_stat", "not a /proc/<pid>/stat text");
  }
  ProcStat st;
  st.pid = number<pid_t>(text.substr(0, open)).value_or(0);
  st.comm = std::string(text.substr(open + 2, close - open - 2));
  const auto& f = *tail;  // f[0] is field 3
  st.state = f[0].empty() ? '?' : f[0][0];
  st.ppid = number<pid_t>(f[1]).value_or(0);
  st.utime = number<std::uint64_t>(f[11]).value_or(0);
  st.stime = number<std::uint64_t>(f[12]).value_or(0);
  st.cutime = number<std::uint64_t>(f[13]).value_or(0);
  st.cstime = number<std::uint64_t>(f[14]).value_or(0);
  st.start_time = std::string(f[19]);
  return st;
}

Result<ProcStat> read_proc_stat(pid_t pid, const std::string& proc) {
  auto text = read_file(proc + "/" + std::to_string(pid) + "/stat", 1 << 16, "proc_stat");
  if (!text) {
    return std::move(text).error();
  }
  return parse_proc_stat(*text);
}

std::string proc_stat_field(std::string_view text, int field) {
  auto tail = stat_tail(text);
  if (field < 3 || !tail || static_cast<std::size_t>(field - 3) >= tail->size()) {
    return "";
  }
  return std::string((*tail)[static_cast<std::size_t>(field - 3)]);
}

std::optional<std::string> status_field(std::string_view text, std::string_view key) {
  for (const auto line : split(text, '\n')) {
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ':') {
      return std::string(trim(line.substr(key.size() + 1)));
    }
  }
  return std::nullopt;
}

std::vector<uid_t> status_ids(std::string_view text, std::string_view key) {
  std::vector<uid_t> out;
  const auto value = status_field(text, key);
  if (!value) {
    return out;
  }
  for (const auto f : fields(*value)) {
    const auto id = number<uid_t>(f);
    if (!id) {
      return {};
    }
    out.push_back(*id);
  }
  return out;
}

std::optional<std::string> read_status_field(const std::string& pid, std::string_view key,
                                             const std::string& proc) {
  auto text = read_file(proc + "/" + pid + "/status", 1 << 16, "proc_status");
  if (!text) {
    return std::nullopt;
  }
  return status_field(*text, key);
}

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

std::vector<MountInfo> parse_mountinfo(std::string_view text) {
  std::vector<MountInfo> out;
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
    MountInfo m;
    m.fstype = std::string(dash[1]);
    m.source = unescape_octal(dash[2]);
    m.root = unescape_octal(f[3]);
    m.mountpoint = unescape_octal(f[4]);
    for (const auto o : split(dash[3], ',')) {
      m.super_options.emplace_back(o);
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::map<std::string, std::string> parse_environ(std::string_view text, std::size_t max_entries) {
  std::map<std::string, std::string> out;
  for (const auto entry : split(text, '\0')) {
    if (out.size() >= max_entries) {
      break;
    }
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      continue;
    }
    out.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return out;
}

Result<std::map<std::string, std::string>> read_environ(pid_t pid, const std::string& proc) {
  auto text = read_file(proc + "/" + std::to_string(pid) + "/environ", kDefaultMaxFileBytes,
                        "proc_environ");
  if (!text) {
    return std::move(text).error();
  }
  return parse_environ(*text);
}

std::vector<std::string> parse_cmdline(std::string_view text) {
  std::vector<std::string> out;
  if (!text.empty() && text.back() == '\0') {
    text.remove_suffix(1);
  }
  if (text.empty()) {
    return out;
  }
  for (const auto arg : split(text, '\0')) {
    out.emplace_back(arg);
  }
  return out;
}

std::vector<pid_t> list_pids(const std::string& proc) {
  std::vector<pid_t> out;
  auto dir = DirStream::open(proc);
  if (!dir) {
    return out;
  }
  while (auto e = dir->next()) {
    if (auto pid = number<pid_t>(e->name); pid && *pid > 0) {
      out.push_back(*pid);
    }
  }
  return out;
}

std::vector<int> open_fds(const std::string& proc) {
  std::vector<int> out;
  auto dir = DirStream::open(proc + "/self/fd");
  if (!dir) {
    return out;
  }
  while (auto e = dir->next()) {
    if (auto fd = number<int>(e->name); fd && *fd >= 0 && *fd != dir->fd()) {
      out.push_back(*fd);
    }
  }
  return out;
}

}  // namespace cellgate::sys
