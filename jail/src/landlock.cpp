// Landlock: the jail's filesystem policy as a table, applied with the raw syscalls (glibc has no
// wrappers). See include/cellgate/jail/landlock.hpp.
#include "cellgate/jail/landlock.hpp"

#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "cellgate/unique_fd.hpp"

// Rights newer than the build host's <linux/landlock.h> (Debian 12's stops at REFER): the values
// are ABI, fixed by the kernel.
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef LANDLOCK_ACCESS_FS_IOCTL_DEV
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL << 15)
#endif

namespace cellgate::jail {
namespace {

constexpr std::uint64_t kExecute = LANDLOCK_ACCESS_FS_EXECUTE;
constexpr std::uint64_t kRead = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
constexpr std::uint64_t kWriteFile = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_TRUNCATE;
// Scratch space: everything but making device nodes (the mounts are nodev anyway).
constexpr std::uint64_t kScratch =
    kExecute | kRead | kWriteFile | LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
    LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK |
    LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_SYM | LANDLOCK_ACCESS_FS_REFER;
// The rights a rule on a file (not a directory) may carry; others make landlock_add_rule EINVAL.
constexpr std::uint64_t kFileRights =
    kExecute | LANDLOCK_ACCESS_FS_READ_FILE | kWriteFile | LANDLOCK_ACCESS_FS_IOCTL_DEV;
// Bits 0-12 are ABI 1's rights.
constexpr std::uint64_t kAbi1 = (1ULL << 13) - 1;

// Every filesystem right the ABI knows, so none is left unhandled (= allowed everywhere).
std::uint64_t handled_for(int abi) {
  std::uint64_t handled = kAbi1;
  if (abi >= 2) {
    handled |= LANDLOCK_ACCESS_FS_REFER;
  }
  if (abi >= 3) {
    handled |= LANDLOCK_ACCESS_FS_TRUNCATE;
  }
  if (abi >= 5) {
    handled |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
  }
  return handled;
}

long create_ruleset(const landlock_ruleset_attr* attr, std::size_t size, std::uint32_t flags) {
  return ::syscall(SYS_landlock_create_ruleset, attr, size, flags);
}

Error landlock_error(const std::string& call) {
  return errno_error(ErrorCode::kInternal, "landlock", call, errno);
}

}  // namespace

std::vector<LandlockRule> landlock_policy(const JailSpec& spec) {
  std::vector<LandlockRule> rules = {
      {"/usr", kRead | kExecute, "the system: interpreters, libraries, kernelspecs, fonts"},
      // On a merged-/usr host these are links into /usr (the rule then lands on /usr/bin, …);
      // elsewhere they are read-only binds of the host's directories.
      {"/bin", kRead | kExecute, "merged-/usr link or bound dir"},
      {"/sbin", kRead | kExecute, "merged-/usr link or bound dir"},
      {"/lib", kRead | kExecute, "merged-/usr link or bound dir (ld.so)"},
      {"/lib32", kRead | kExecute, "merged-/usr link or bound dir"},
      {"/lib64", kRead | kExecute, "merged-/usr link or bound dir (ld.so)"},
      {"/libx32", kRead | kExecute, "merged-/usr link or bound dir"},
      // The jail's /etc is synthesized (passwd, group, hosts, hostname) plus etc_binds, nothing
      // else: all of it is meant to be read (ld.so.cache, ssl, fonts, matplotlibrc, R, …).
      {"/etc", kRead, "the jail's own /etc: synthesized files and etc_binds"},
      {"/proc", kRead, "the jail's own procfs (/proc/sys read-only): psutil, os.cpu_count(), ..."},
      {"/sys", kRead, "when a jail has one"},
      // Device nodes the jail creates (null, zero, full, random, urandom) and the /dev/fd links;
      // `> /dev/null` opens with O_TRUNC, isatty() is an ioctl.
      {"/dev", kRead | kWriteFile | LANDLOCK_ACCESS_FS_IOCTL_DEV, "device nodes"},
      // ipykernel binds its ZeroMQ ipc:// sockets here (zmq unlinks a stale one first) and,
      // after binding, removes and rewrites the connection file (jupyter_core's secure_write).
      // No directories, fifos, links or execution.
      {kJailConnDir,
       kRead | kWriteFile | LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK |
           LANDLOCK_ACCESS_FS_REMOVE_FILE,
       "connection file and ZeroMQ ipc sockets"},
      {kJailWorkDir, kScratch, "the work dir (HOME): notebooks' files, ~/.cache, ~/.config"},
      {"/tmp", kScratch, "size-capped scratch"},
      {"/dev/shm", kScratch, "POSIX shared memory and semaphores (multiprocessing)"},
  };
  for (const auto& path : spec.system_binds) {
    rules.push_back({path, kRead, "system_bind: a shared read-only cache"});
  }
  for (const auto& b : spec.binds) {
    rules.push_back({b.target, b.writable ? kScratch : kRead | kExecute, "the spec's bind"});
  }
  return rules;
}

int landlock_abi() {
  const long abi = create_ruleset(nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return abi > 0 ? static_cast<int>(abi) : 0;
}

Result<int> apply_landlock(const JailSpec& spec) {
  const long abi = create_ruleset(nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi <= 0) {
    if (errno != ENOSYS && errno != EOPNOTSUPP) {
      return landlock_error("landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)");
    }
    const std::string why =
        std::string("landlock unavailable: the kernel lacks it or boots without lsm=…landlock (") +
        (errno == ENOSYS ? "ENOSYS" : "EOPNOTSUPP") + ")";
    if (spec.optional.count("landlock") == 0) {
      return make_error(ErrorCode::kFailedPrecondition, "landlock",
                        why + "; fix the host, or list \"landlock\" as optional to run without it");
    }
    (void)std::fprintf(stderr,
                       "cellgate-kernel: warning: landlock is not applied (allowed as "
                       "optional): %s\n",
                       why.c_str());
    return 0;
  }
  const std::uint64_t handled = handled_for(static_cast<int>(abi));
  // Only the first field: this build's struct may be older or newer than the kernel's, and the
  // kernel accepts any prefix it knows.
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = handled;
  UniqueFd ruleset(static_cast<int>(create_ruleset(&attr, sizeof attr.handled_access_fs, 0)));
  if (!ruleset) {
    return landlock_error("landlock_create_ruleset(handled_access_fs=" + std::to_string(handled) +
                          ")");
  }
  for (const auto& rule : landlock_policy(spec)) {
    UniqueFd fd(::open(rule.path.c_str(), O_PATH | O_CLOEXEC));
    if (!fd) {
      if (errno == ENOENT) {
        continue;  // not in this jail (no /sys, no lib32): nothing to allow
      }
      return landlock_error("open('" + rule.path + "', O_PATH)");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
      return landlock_error("fstat('" + rule.path + "')");
    }
    landlock_path_beneath_attr beneath{};
    beneath.allowed_access = rule.access & handled & (S_ISDIR(st.st_mode) ? ~0ULL : kFileRights);
    beneath.parent_fd = fd.get();
    if (::syscall(SYS_landlock_add_rule, ruleset.get(), LANDLOCK_RULE_PATH_BENEATH, &beneath, 0) !=
        0) {
      return landlock_error("landlock_add_rule('" + rule.path + "', " +
                            std::to_string(beneath.allowed_access) + ")");
    }
  }
  if (::syscall(SYS_landlock_restrict_self, ruleset.get(), 0) != 0) {
    return landlock_error("landlock_restrict_self()");
  }
  return static_cast<int>(abi);  // `ruleset` closes here: no descriptor outlives the step
}

}  // namespace cellgate::jail
