// JailSpec: everything the jail applies to one kernel, as a value. Its JSON form (the launcher's
// --spec file, a zygote request) belongs to the launcher: cellgate/launcher/spec_json.hpp.
//
//   JailSpec spec;                       // the defaults: 1 CPU, 1 GiB, 256 pids, no network, …
//   spec.work_dir = "/var/lib/cellgate/k1/work";
//   spec.env = {{"PATH", "/usr/bin:/bin"}};
//   CELLGATE_TRY(spec.validate());
//
// Inside the jail the kernel sees: / (read-only tmpfs) with /usr, /bin, /lib… bound read-only,
// a synthesized /etc (passwd, group, hosts) plus a few read-only host files (etc_binds), shared
// caches such as /var/cache/fontconfig read-only (system_binds), a fresh /proc,
// a minimal /dev with a /dev/shm tmpfs, a size-capped /tmp, its work dir at /home/kernel
// (writable, size-capped) and its connection dir at /run/kernel (writable, noexec).
//
// Limits a host cannot enforce stop the kernel from starting unless named in `optional`:
// "memory", "swap", "pids", "cpu", "work_size" (a tmpfs for the work dir), "landlock" (the
// filesystem policy of landlock.hpp; required by default: Debian 12's 6.1 kernel has ABI 2).
//
// Thread-safety: a value type.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::jail {

inline constexpr const char* kJailWorkDir = "/home/kernel";
inline constexpr const char* kJailConnDir = "/run/kernel";
// Per-kernel uids are kUidBase + the launcher's pid unless the spec names one: unique among live
// kernels (pids are), never a host user's, never 0.
inline constexpr uid_t kUidBase = 1000000;

struct BindMount {
  std::string source;  // host path
  std::string target;  // path inside the jail
  bool writable = false;
};

struct JailSpec {
  // cgroup limits
  std::uint64_t memory_bytes = 1ull << 30;
  std::int64_t pids = 256;
  double cpus = 1.0;
  // filesystem sizes
  std::uint64_t tmp_bytes = 64ull << 20;
  std::uint64_t work_bytes = 512ull << 20;
  std::uint64_t shm_bytes = 16ull << 20;
  std::uint64_t tmp_inodes = 16384;
  // rlimits
  std::uint64_t nofile = 1024;
  std::uint64_t fsize_bytes = 1ull << 30;
  std::uint64_t memlock_bytes = 64ull << 10;
  // wall-clock limit for the whole kernel; 0: none
  double time_limit_seconds = 0;

  std::optional<uid_t> uid;  // default kUidBase + launcher pid
  std::optional<gid_t> gid;  // default = uid
  // The group of an unprivileged gateway (serve --user): it becomes the kernel's gid (in place
  // of `gid`), the kernel's connection dir (0710) and work dir (a 0770 tmpfs) are that group's,
  // and the kernel's umask is 002, so that gateway can use the kernel's sockets and read and
  // write its files without being root. Its supplementary groups stay empty. The kernels of one
  // gateway share the gid (their uids and namespaces keep them apart). nullopt: the conn and work
  // dirs stay the kernel's alone (0700).
  std::optional<gid_t> access_gid;
  std::string hostname = "jail";
  std::string name;  // the kernel's name, used for its cgroup; default "k<launcher pid>"
  std::string cgroup_group = "cellgate";
  // The cgroup (a path as /proc/self/cgroup shows them) below which cgroup_group is made; ""
  // = the launcher's own cgroup. A gateway on cgroup v2 sets it to its delegated cgroup after
  // moving itself into a leaf (place_kernel_cgroups in cgroup.hpp).
  std::string cgroup_parent;

  // Host directory bound at /home/kernel. "" means a private tmpfs (lost when the kernel ends).
  // When set, the launcher mounts a tmpfs of work_bytes on it (in the host's mount namespace,
  // unless it already is a mount point) so the size cap holds and the gateway can see the files.
  std::string work_dir;
  std::vector<BindMount> binds;  // extra mounts (e.g. a probe binary in tests)
  // Host files and dirs under /etc bound read-only when they exist (ld.so.cache, fonts, …); one
  // that is a symlink into /usr (localtime) is made the same symlink.
  // "R": Debian's /usr/lib/R/etc/{Renviron,ldpaths,Rprofile.site,…} are symlinks into /etc/R,
  // and the `R` wrapper script of an R kernelspec stops without ldpaths. "timezone": the zone's
  // name, which R's Sys.timezone() reads.
  std::vector<std::string> etc_binds = {
      "ld.so.cache",  "ld.so.conf", "ld.so.conf.d", "nsswitch.conf",
      "localtime",    "timezone",   "protocols",    "services",
      "matplotlibrc", "mime.types", "alternatives", "fonts",
      "python3",      "python3.11", "ssl",          "R"};
  // Host paths outside /usr and /etc bound read-only at the same place when they exist: shared,
  // secret-free caches a kernel would otherwise rebuild in its work dir on every start.
  // fontconfig's serves R's png()/cairo devices (without it each R kernel's first plot scans
  // the fonts, ~25 ms here and seconds on hosts with many fonts, and writes ~/.cache/fontconfig).
  std::vector<std::string> system_binds = {"/var/cache/fontconfig"};

  // A loopback-only network (jail/README.md, "Loopback network"): the kernel still gets a
  // network namespace of its own, but with `lo` brought up in it by pid 1 before anything of the
  // kernel runs (no other interface, so no route out), and its seccomp filter lets it open
  // AF_INET/AF_INET6 stream and datagram sockets (TCP, UDP) — what debugpy, ipykernel's debugger,
  // needs. Raw, packet, netlink and every other family stay refused. false: `lo` stays down and
  // every family but AF_UNIX is refused.
  bool loopback_network = false;

  // The kernel's entire environment.
  std::map<std::string, std::string> env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"},
                                            {"LANG", "C.UTF-8"}};
  std::set<std::string> optional;

  // What the jail relies on and a spec from outside could break: positive limits, a kernel uid
  // and gid other than 0, plain names for the cgroups, absolute bind targets without "..", no
  // /etc/shadow (or the like) bound in, system_binds absolute and clear of the directories the
  // jail builds itself or that hold users' data (/etc, /proc, /sys, /dev, /run, /tmp, /home,
  // /root). kInvalidArgument "bad_jail_spec" naming the first.
  Result<void> validate() const;
};

// A name that is one path component of a cgroup and nothing more: 1-128 of [A-Za-z0-9_@-].
// What JailSpec::validate() asks of `name` and `cgroup_group`.
bool is_plain_name(const std::string& s);

}  // namespace cellgate::jail
