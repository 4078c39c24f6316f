// The jail's root filesystem: a fresh tmpfs with read-only binds of what kernels need (/usr,
// listed /etc entries, shared caches), a new /proc, a minimal /dev, size-capped /tmp and work dir,
// the connection dir; then pivot_root and the old root detached.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <filesystem>
#include <fstream>
#include <string>

#include "cellgate/jail/jail.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::jail {
namespace {

Error mount_error(const std::string& call) {
  return errno_error(ErrorCode::kFailedPrecondition, "mount", call, errno);
}

std::string flags_text(unsigned long flags) {
  std::string s;
  auto add = [&](unsigned long f, const char* name) {
    if ((flags & f) != 0) {
      s += s.empty() ? name : std::string("|") + name;
    }
  };
  add(MS_BIND, "MS_BIND");
  add(MS_REC, "MS_REC");
  add(MS_REMOUNT, "MS_REMOUNT");
  add(MS_RDONLY, "MS_RDONLY");
  add(MS_NOSUID, "MS_NOSUID");
  add(MS_NODEV, "MS_NODEV");
  add(MS_NOEXEC, "MS_NOEXEC");
  add(MS_PRIVATE, "MS_PRIVATE");
  return s.empty() ? "0" : s;
}

Result<void> do_mount(const std::string& source, const std::string& target, const char* fstype,
                      unsigned long flags, const std::string& data = "") {
  if (::mount(source.empty() ? nullptr : source.c_str(), target.c_str(), fstype, flags,
              data.empty() ? nullptr : data.c_str()) != 0) {
    return mount_error("mount('" + source + "', '" + target + "', " + (fstype ? fstype : "NULL") +
                       ", " + flags_text(flags) + (data.empty() ? "" : ", '" + data + "'") + ")");
  }
  return {};
}

Result<void> make_dir(const std::string& path, mode_t mode = 0755) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return mount_error("mkdir('" + path + "')");
  }
  return {};
}

Result<void> make_file(const std::string& path, const std::string& content = "",
                       mode_t mode = 0644) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd) {
    return mount_error("open('" + path + "', O_CREAT)");
  }
  if (!content.empty() &&
      ::write(fd.get(), content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
    return mount_error("write('" + path + "')");
  }
  return {};
}

// Binds `source` on `target` (created as a dir or file to match), then remounts it with `flags`
// (a bind mount ignores flags on its first mount).
Result<void> bind_mount(const std::string& source, const std::string& target, unsigned long flags) {
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0) {
    return mount_error("stat('" + source + "')");
  }
  if (S_ISDIR(st.st_mode)) {
    CELLGATE_TRY(make_dir(target));
  } else {
    CELLGATE_TRY(make_file(target));
  }
  CELLGATE_TRY(do_mount(source, target, nullptr, MS_BIND | MS_REC));
  return do_mount("", target, nullptr, MS_REMOUNT | MS_BIND | flags);
}

// The parent directories of `target` (an absolute path inside the jail), made on the root tmpfs.
Result<void> make_parents(const std::string& root, const std::string& target) {
  for (std::size_t pos = 1; (pos = target.find('/', pos)) != std::string::npos; ++pos) {
    CELLGATE_TRY(make_dir(root + target.substr(0, pos)));
  }
  return {};
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// The target of the symlink `path` when it lies under /usr ("" when `path` is no symlink or
// points elsewhere), made absolute and normalized without following further links.
std::string link_into_usr(const std::string& path) {
  char target[PATH_MAX] = {};
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
  if (n <= 0) {
    return "";
  }
  std::filesystem::path to(std::string(target, static_cast<std::size_t>(n)));
  if (to.is_relative()) {
    to = std::filesystem::path(path).parent_path() / to;
  }
  const std::string normal = to.lexically_normal().string();
  return normal.starts_with("/usr/") ? normal : "";
}

Result<void> build_etc(const JailSpec& spec, const std::string& root, uid_t uid, gid_t gid) {
  const std::string etc = root + "/etc";
  CELLGATE_TRY(make_dir(etc));
  const std::string u = std::to_string(uid);
  const std::string g = std::to_string(gid);
  CELLGATE_TRY(make_file(etc + "/passwd",
                         "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                         "kernel:x:" +
                             u + ":" + g + ":kernel:" + kJailWorkDir +
                             ":/usr/sbin/nologin\n"
                             "nobody:x:65534:65534:nobody:/nonexistent:/usr/"
                             "sbin/nologin\n"));
  CELLGATE_TRY(make_file(etc + "/group", "root:x:0:\nkernel:x:" + g + ":\nnogroup:x:65534:\n"));
  CELLGATE_TRY(make_file(etc + "/hostname", spec.hostname + "\n"));
  CELLGATE_TRY(make_file(
      etc + "/hosts", "127.0.0.1 localhost " + spec.hostname + "\n::1 localhost ip6-localhost\n"));
  for (const auto& name : spec.etc_binds) {
    const std::string source = "/etc/" + name;
    if (!exists(source)) {
      continue;
    }
    // A link into /usr (/etc/localtime -> /usr/share/zoneinfo/Etc/UTC) stays a link: the jail
    // sees /usr anyway, and programs read the link itself (R's Sys.timezone() takes the zone's
    // name from it, and without it compares /etc/localtime with every zoneinfo file).
    if (const std::string target = link_into_usr(source); !target.empty()) {
      if (::symlink(target.c_str(), (etc + "/" + name).c_str()) != 0) {
        return mount_error("symlink('" + target + "', '" + etc + "/" + name + "')");
      }
      continue;
    }
    CELLGATE_TRY(bind_mount(source, etc + "/" + name, MS_RDONLY | MS_NOSUID | MS_NODEV));
  }
  return {};
}

Result<void> build_dev(const JailSpec& spec, const std::string& root) {
  const std::string dev = root + "/dev";
  CELLGATE_TRY(make_dir(dev));
  // Not nodev: the device binds below must work. Read-only once populated.
  CELLGATE_TRY(do_mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k"));
  for (const char* node : {"null", "zero", "full", "random", "urandom"}) {
    CELLGATE_TRY(bind_mount(std::string("/dev/") + node, dev + "/" + node, MS_NOSUID | MS_NOEXEC));
  }
  const std::pair<const char*, const char*> links[] = {{"/proc/self/fd", "fd"},
                                                       {"/proc/self/fd/0", "stdin"},
                                                       {"/proc/self/fd/1", "stdout"},
                                                       {"/proc/self/fd/2", "stderr"}};
  for (const auto& [to, name] : links) {
    if (::symlink(to, (dev + "/" + name).c_str()) != 0) {
      return mount_error(std::string("symlink('") + to + "', '" + dev + "/" + name + "')");
    }
  }
  // A private devpts instance: the pseudo-terminals IPython's `!cmd` and pexpect open (without
  // one every shell escape fails with "out of pty devices"). It holds only the ptys this jail
  // makes; the host's are not in it. At most 64 at once: the kernel's pty count (pty/max) is
  // shared by every instance but the host's own reserve, so one jail must not take them all. A
  // host that refuses the mount (a container without CAP_SYS_ADMIN for it) leaves the jail
  // without ptys: a missing convenience, not a weaker jail.
  CELLGATE_TRY(make_dir(dev + "/pts"));
  if (::mount("devpts", (dev + "/pts").c_str(), "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620,max=64") == 0) {
    if (::symlink("pts/ptmx", (dev + "/ptmx").c_str()) != 0) {
      return mount_error("symlink('pts/ptmx', '" + dev + "/ptmx')");
    }
  } else if (errno != EPERM && errno != EACCES) {
    return mount_error("mount('devpts', '" + dev + "/pts')");
  }
  CELLGATE_TRY(make_dir(dev + "/shm", 01777));
  CELLGATE_TRY(do_mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                        "mode=1777,size=" + std::to_string(spec.shm_bytes)));
  return do_mount("", dev, nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC);
}

}  // namespace

Result<std::string> staging_dir() {
  const std::string parent = "/run/cellgate";
  const std::string dir = parent + "/root";
  for (const auto& path : {parent, dir}) {
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      return mount_error("mkdir('" + path + "')");
    }
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      return mount_error("lstat('" + path + "')");
    }
    // A planted symlink or someone else's directory would let them shape our mounts.
    if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0) {
      return make_error(ErrorCode::kFailedPrecondition, "staging_dir",
                        path + " must be a directory owned by root and writable only by it");
    }
  }
  return dir;
}

Result<bool> mount_work_tmpfs(const std::string& work_dir, std::uint64_t bytes, uid_t uid,
                              gid_t gid, std::optional<gid_t> access_gid) {
  struct stat st {};
  struct stat parent {};
  if (::lstat(work_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return mount_error("lstat('" + work_dir + "') (the work dir must be a real directory)");
  }
  if (::stat((work_dir + "/..").c_str(), &parent) != 0) {
    return mount_error("stat('" + work_dir + "/..')");
  }
  if (st.st_dev != parent.st_dev) {
    return false;  // already a mount point: a restarted kernel reuses it, files and all
  }
  CELLGATE_TRY(do_mount("cellgate-work", work_dir, "tmpfs", MS_NOSUID | MS_NODEV,
                        std::string(access_gid ? "mode=0770" : "mode=0700") +
                            ",size=" + std::to_string(bytes) + ",uid=" + std::to_string(uid) +
                            ",gid=" + std::to_string(access_gid.value_or(gid))));
  return true;
}

Result<void> build_root(const JailSpec& spec, const RootPaths& paths, uid_t uid, gid_t gid) {
  // Nothing we mount may propagate back to the host.
  CELLGATE_TRY(do_mount("", "/", nullptr, MS_REC | MS_PRIVATE));
  const std::string& root = paths.staging;
  CELLGATE_TRY(do_mount("cellgate-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m"));

  // /usr read-only; on a merged-/usr host /bin, /lib, /lib64, /sbin are symlinks into it.
  CELLGATE_TRY(bind_mount("/usr", root + "/usr", MS_RDONLY | MS_NOSUID | MS_NODEV));
  for (const char* top : {"bin", "lib", "lib32", "lib64", "libx32", "sbin"}) {
    const std::string host = std::string("/") + top;
    if (!exists(host)) {
      continue;
    }
    if (is_symlink(host)) {
      char target[256] = {};
      ssize_t n = ::readlink(host.c_str(), target, sizeof target - 1);
      if (n <= 0 || ::symlink(target, (root + host).c_str()) != 0) {
        return mount_error("symlink('" + host + "')");
      }
    } else {
      CELLGATE_TRY(bind_mount(host, root + host, MS_RDONLY | MS_NOSUID | MS_NODEV));
    }
  }
  CELLGATE_TRY(build_etc(spec, root, uid, gid));

  CELLGATE_TRY(make_dir(root + "/proc"));
  CELLGATE_TRY(do_mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC));
  // Kernel tunables stay read-only even for a process that somehow became root in here.
  CELLGATE_TRY(bind_mount(root + "/proc/sys", root + "/proc/sys",
                          MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC));
  CELLGATE_TRY(build_dev(spec, root));

  CELLGATE_TRY(make_dir(root + "/tmp", 01777));
  CELLGATE_TRY(do_mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
                        "mode=1777,size=" + std::to_string(spec.tmp_bytes) +
                            ",nr_inodes=" + std::to_string(spec.tmp_inodes)));

  CELLGATE_TRY(make_dir(root + "/home"));
  const std::string work = root + kJailWorkDir;
  if (paths.work_dir.empty()) {
    CELLGATE_TRY(make_dir(work, 0700));
    CELLGATE_TRY(do_mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV,
                          "mode=0700,size=" + std::to_string(spec.work_bytes) +
                              ",uid=" + std::to_string(uid) + ",gid=" + std::to_string(gid)));
  } else {
    CELLGATE_TRY(bind_mount(paths.work_dir, work, MS_NOSUID | MS_NODEV));
  }
  CELLGATE_TRY(make_dir(root + "/run"));
  if (!paths.conn_dir.empty()) {
    CELLGATE_TRY(bind_mount(paths.conn_dir, root + kJailConnDir, MS_NOSUID | MS_NODEV | MS_NOEXEC));
  }
  if (!paths.init_program.empty()) {
    CELLGATE_TRY(bind_mount(paths.init_program, root + kJailInitProgram, MS_RDONLY | MS_NOSUID));
  }
  for (const auto& path : spec.system_binds) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      continue;  // not on this host (no fontconfig, say): nothing to share
    }
    CELLGATE_TRY(make_parents(root, path));
    CELLGATE_TRY(bind_mount(path, root + path, MS_RDONLY | MS_NOSUID | MS_NODEV));
  }
  for (const auto& b : spec.binds) {
    CELLGATE_TRY(make_parents(root, b.target));
    CELLGATE_TRY(
        bind_mount(b.source, root + b.target, MS_NOSUID | MS_NODEV | (b.writable ? 0 : MS_RDONLY)));
  }

  // pivot_root into the new root and detach the old one, so no path leads back to the host.
  if (::chdir(root.c_str()) != 0) {
    return mount_error("chdir('" + root + "')");
  }
  CELLGATE_TRY(make_dir(root + "/.oldroot", 0700));
  if (::syscall(SYS_pivot_root, ".", ".oldroot") != 0) {
    return mount_error("pivot_root('" + root + "', '" + root + "/.oldroot')");
  }
  if (::umount2("/.oldroot", MNT_DETACH) != 0) {
    return mount_error("umount2('/.oldroot', MNT_DETACH)");
  }
  if (::rmdir("/.oldroot") != 0) {
    return mount_error("rmdir('/.oldroot')");
  }
  if (::chdir("/") != 0) {
    return mount_error("chdir('/')");
  }
  return do_mount("", "/", nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV);
}

}  // namespace cellgate::jail
