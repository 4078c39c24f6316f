#include "cellgate/jail/spec.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>

namespace cellgate::jail {
namespace {

constexpr std::array<std::string_view, 6> kKnownOptional = {"memory", "swap",      "pids",
                                                            "cpu",    "work_size", "landlock"};

Error bad(const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, "bad_jail_spec", what);
}

}  // namespace

bool is_plain_name(const std::string& s) {
  if (s.empty() || s == "." || s == ".." || s.size() > 128) {
    return false;
  }
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '@')) {
      return false;
    }
  }
  return true;
}

namespace {

// A system bind is a plain absolute path ("/a/b": no "", "." or ".." components) outside what
// the jail builds itself (/proc, /dev, /tmp, /run, /home) or names one by one (/etc), and
// outside users' data (/root, /home) and the host's kernel interfaces (/sys).
Result<void> check_system_bind(const std::string& path) {
  if (path.size() < 2 || path.front() != '/' || path.back() == '/') {
    return bad("system_binds are absolute paths below / ('" + path + "')");
  }
  for (std::size_t start = 1; start <= path.size();) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) {
      end = path.size();
    }
    const std::string part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") {
      return bad("system_binds must be plain paths without '', '.' or '..' parts ('" + path + "')");
    }
    start = end + 1;
  }
  for (const char* top : {"/etc", "/proc", "/sys", "/dev", "/run", "/tmp", "/home", "/root"}) {
    const std::string t = top;
    if (path == t || path.starts_with(t + "/")) {
      return bad("system_binds may not reach into " + t + " ('" + path + "')" +
                 (t == "/etc" ? "; name /etc entries in etc_binds" : ""));
    }
  }
  return {};
}

}  // namespace

Result<void> JailSpec::validate() const {
  if (pids <= 0 || cpus <= 0 || memory_bytes < (16ull << 20)) {
    return bad("limits must be positive (memory at least 16 MiB)");
  }
  if (uid && *uid == 0) {
    return bad("the kernel's uid must not be 0");
  }
  if (gid && *gid == 0) {
    return bad("the kernel's gid must not be 0");
  }
  if (access_gid && *access_gid == 0) {
    return bad("the access gid must not be 0 (root's group)");
  }
  for (const auto& limit : optional) {
    if (std::find(kKnownOptional.begin(), kKnownOptional.end(), limit) == kKnownOptional.end()) {
      return bad("unknown optional limit '" + limit +
                 "' (known: memory, swap, pids, cpu, work_size, landlock)");
    }
  }
  if (!is_plain_name(cgroup_group)) {
    return bad("cgroup_group must be a plain name ([A-Za-z0-9_@-])");
  }
  if (!cgroup_parent.empty() &&
      (cgroup_parent.front() != '/' || cgroup_parent.size() > 4096 ||
       cgroup_parent.find("/../") != std::string::npos || cgroup_parent.ends_with("/..") ||
       cgroup_parent.find("/./") != std::string::npos || cgroup_parent.ends_with("/.") ||
       cgroup_parent.find('\0') != std::string::npos ||
       cgroup_parent.find('\n') != std::string::npos)) {
    return bad("cgroup_parent must be an absolute cgroup path without '.' or '..' parts");
  }
  if (!name.empty() && !is_plain_name(name)) {
    return bad("name must be a plain name ([A-Za-z0-9_@-])");
  }
  for (const auto& b : binds) {
    if (b.source.empty() || b.target.empty() || b.target.front() != '/' ||
        b.target.find("..") != std::string::npos) {
      return bad("bind mounts need a source and an absolute target without '..'");
    }
  }
  for (const auto& e : etc_binds) {
    if (e.empty() || e.find('/') != std::string::npos || e == "." || e == "..") {
      return bad("etc_binds are names directly under /etc");
    }
    if (e == "shadow" || e == "gshadow" || e == "ssh" || e == "sudoers") {
      return bad("/etc/" + e + " is never bound into a jail");
    }
  }
  for (const auto& path : system_binds) {
    CELLGATE_TRY(check_system_bind(path));
  }
  return {};
}

}  // namespace cellgate::jail
