// Per-kernel cgroups, v1 and v2 behind one interface.
//
// A kernel's cgroup is created only below the cgroup the calling process is already in (read from
// /proc/self/cgroup), as <own cgroup>/<group>/<name>, in every hierarchy that holds a controller
// it needs (v1: memory, pids, cpu; v2: the one unified hierarchy). Settings of cgroups we did not
// create are never written. The Cgroup object owns what it created: its destructor kills every
// process in it and removes it.
//
//   auto host = CgroupHost::detect_system();                 // Result<CgroupHost>
//   log(host->describe());                                   // "cgroup v1: memory at …"
//   CgroupLimits limits{.memory_bytes = 1 << 30, .pids = 256, .cpus = 1.0};
//   auto cg = host->create("cellgate", "kernel-42", limits, /*optional=*/{}, &warnings);
//   cg.value()->add_process(pid);
//   auto stats = cg.value()->stats();                        // oom_kills, memory peak, …
//
// Limits are named "memory", "swap", "pids", "cpu". One that the host cannot enforce (no such
// controller, or its file is missing) makes create() fail with kFailedPrecondition and a message
// naming the limit and what the host lacks — unless its name is in `optional`, in which case a
// warning is appended to `warnings` and the cgroup is created without it.
//
// Thread-safety: CgroupHost is immutable; a Cgroup has one owner.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::jail {

enum class CgroupVersion { kV1, kV2 };

struct CgroupLimits {
  std::optional<std::uint64_t> memory_bytes;  // v1 memory.limit_in_bytes / v2 memory.max
  bool swap_off = true;  // v1 memory.memsw.limit_in_bytes = memory / v2 memory.swap.max = 0
  std::optional<std::int64_t> pids;  // pids.max
  std::optional<double> cpus;        // v1 cpu.cfs_quota_us / cfs_period_us; v2 cpu.max
};

struct CgroupStats {
  std::uint64_t oom_kills = 0;  // v1 memory.oom_control "oom_kill"; v2 memory.events "oom_kill"
  std::uint64_t memory_current_bytes = 0;
  std::uint64_t memory_peak_bytes =
      0;  // v1 memory.max_usage_in_bytes; v2 memory.peak (0 if absent)
  std::int64_t pids_current = 0;
  std::uint64_t pids_limit_hits = 0;  // pids.events "max"
  std::uint64_t cpu_usage_usec = 0;  // v1 cpuacct.usage / 1000 if available; v2 cpu.stat usage_usec
  // Whether cpu_usage_usec was measured. Where v1 has no cpuacct next to
  // cpu, it is the user+system time of the cgroup's processes (and their reaped children).
  bool cpu_usage_known = false;
  // The quota's doing (cpu.stat; 0 without the cpu controller): periods in which the cgroup had
  // runnable work and was stopped at its quota, and for how long. Growing figures mean work is
  // waiting to run: a kernel whose heartbeats stop meanwhile is starved by its own cell, not
  // dead (kernel/progress.hpp).
  std::uint64_t cpu_nr_throttled = 0;    // v1 and v2 nr_throttled
  std::uint64_t cpu_throttled_usec = 0;  // v1 throttled_time / 1000; v2 throttled_usec
};

class Cgroup;

class CgroupHost {
 public:
  // Reads /proc/self/cgroup and /proc/self/mountinfo. `root_prefix` is prepended to every
  // filesystem path (a fake cgroupfs tree in tests; "" for the real one). `parent`, a cgroup path
  // as /proc/self/cgroup writes them ("/system.slice/cellgate.service"), takes the place of our
  // own cgroup in every hierarchy: kernels' cgroups go below it (JailSpec::cgroup_parent, set by a
  // gateway that moved itself into a leaf of its delegated cgroup; see place_kernel_cgroups).
  static Result<CgroupHost> detect(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                   const std::string& root_prefix = "",
                                   const std::string& parent = "");
  static Result<CgroupHost> detect_system(const std::string& parent = "");

  CgroupVersion version() const;
  bool has_controller(std::string_view controller) const;  // "memory", "pids", "cpu"
  // One line for the start-up log: version, and where each controller is.
  std::string describe() const;
  // The directories kernels' groups are made in (our cgroup, or the parent), one per hierarchy.
  std::vector<std::string> base_dirs() const;

  Result<std::unique_ptr<Cgroup>> create(const std::string& group, const std::string& name,
                                         const CgroupLimits& limits,
                                         const std::set<std::string>& optional,
                                         std::vector<std::string>* warnings) const;

 private:
  friend class CgroupTestPeer;  // unit tests play the kernel's part in a fake cgroupfs tree

  // A hook on a directory path; see after_mkdir_ / before_rmdir_.
  using DirHook = std::function<void(const std::string& dir)>;

  // One mounted hierarchy that holds controllers we use, and our own cgroup's directory in it.
  struct Hierarchy {
    std::vector<std::string> controllers;  // the usable ones of "memory", "pids", "cpu"
    std::string own_dir;                   // root_prefix + mount point + own cgroup path
  };

  CgroupHost() = default;
  const Hierarchy* hierarchy_for(std::string_view controller) const;
  // Why `limit` cannot be enforced, or "" when it can (as far as the controllers go).
  std::string controller_gap(const std::string& limit) const;

  CgroupVersion version_ = CgroupVersion::kV1;
  std::vector<Hierarchy> hierarchies_;
  // controller -> what the host lacks for it ("no memory hierarchy is mounted"), for describe()
  // and for create()'s limit_unavailable messages.
  std::map<std::string, std::string> missing_;
  std::string note_;  // extra for describe(), e.g. an unused v2 hierarchy on a hybrid host
  // A real cgroupfs fills a new directory with control files and empties it on rmdir; a fake tree
  // needs the test to do that. Both are empty in production.
  DirHook after_mkdir_;
  DirHook before_rmdir_;
  // How long kill_all() waits for cgroup.procs to empty, and remove() for rmdir to stop EBUSY.
  std::chrono::milliseconds settle_timeout_{3000};
};

// --- where a gateway's kernels get their cgroups (cgroup v2 delegation) -------------------------
//
// cgroup v2 lets a cgroup enable controllers for its children only while it holds no process of
// its own ("no internal processes"). A gateway started by systemd with Delegate=yes sits in its
// service's cgroup D with processes in it, so kernels' cgroups below D could never get memory,
// pids or cpu. place_kernel_cgroups() arranges it once, before any kernel starts:
//   * v1, or v2 where D already enables memory, pids and cpu for its children: nothing to do;
//     kernels go below each launcher's own cgroup, as always.
//   * `requested_parent` (--cgroup-parent): an operator-delegated cgroup; the controllers it
//     offers and lacks are enabled in it (it must hold no processes), kernels go below it.
//   * v2 and D delegated to us (systemd's trusted.delegate / user.delegate xattr, a cgroup
//     namespace root as in a container, or, not root, a cgroup we own): every process of D
//     moves into the leaf D/<leaf_name>, memory/pids/cpu are enabled in D, kernels go below D,
//     beside the leaf.
//   * the true root of a v2 hierarchy: the controllers are enabled there; nothing moves.
//   * otherwise (a login session's scope, a unit without Delegate=yes): kFailedPrecondition
//     "cgroup_not_delegated", saying what to run instead (systemd-run … -p Delegate=yes).
struct KernelCgroupPlacement {
  std::string parent;   // for JailSpec::cgroup_parent; "" = each launcher's own cgroup
  std::string summary;  // one line for the start-up log
};

struct CgroupPlacementRequest {
  std::string requested_parent;  // --cgroup-parent; "" = decide from our own cgroup
  std::string leaf_name = "gateway";
  // The command that started us, quoted, for the "run it like this" hint.
  std::string command_line;
};

Result<KernelCgroupPlacement> place_kernel_cgroups(const CgroupPlacementRequest& request);

// The same on a given view of the system (tests: a fake cgroupfs tree under `root_prefix`).
struct CgroupSystemView {
  std::string proc_self_cgroup;
  std::string mountinfo;
  std::string root_prefix;
  pid_t self = 0;
  uid_t euid = 0;
  // Whether systemd (or whoever set up the tree) delegated `dir` to us; default: the
  // trusted.delegate / user.delegate xattr is "1".
  std::function<bool(const std::string& dir)> delegated;
  // Called after each mkdir (tests: the fake fills in the control files a kernel would).
  std::function<void(const std::string& dir)> after_mkdir;
};
Result<KernelCgroupPlacement> place_kernel_cgroups(const CgroupPlacementRequest& request,
                                                   const CgroupSystemView& view);

// The figures of a cgroup someone else created (a kernel's, named by its launcher), read from
// whichever of `dirs` holds each file. Only reads; kNotFound once the cgroup is gone.
Result<CgroupStats> read_cgroup_stats(CgroupVersion version, const std::vector<std::string>& dirs);
// The CPU limit of such a cgroup as its file says it (v1 cpu.cfs_quota_us, v2 cpu.max, from
// whichever of `dirs` has it), to be written back as read: a kernel throttled while its tenant is
// past its CPU budget (gateway/tenants/cpu_budget.hpp) gets its own limit again after.
Result<std::string> read_cpu_quota(CgroupVersion version, const std::vector<std::string>& dirs);
Result<void> write_cpu_quota(CgroupVersion version, const std::vector<std::string>& dirs,
                             const std::string& value);
// That file's value for the least CPU the kernel allows: 1% of one CPU, in the jail's period.
std::string least_cpu_quota(CgroupVersion version);

class Cgroup {
 public:
  // A handle on a kernel's cgroup that another process made: a launcher the gateway lost and
  // finds again through the kernel's record, to end what is left in it. kill_all(), remove()
  // (and the destructor) as for one of ours; dirs that are gone already are skipped.
  static std::unique_ptr<Cgroup> adopt(CgroupVersion version, std::vector<std::string> dirs);
  ~Cgroup();                            // kill_all(), then remove()
  Result<void> add_process(pid_t pid);  // into every hierarchy
  Result<CgroupStats> stats() const;
  // v2: cgroup.kill when present; otherwise (and on v1) SIGKILL every pid in cgroup.procs until
  // it is empty (bounded retries).
  Result<void> kill_all();
  Result<void>
  remove();  // rmdir every directory it created (the leaf, and its group parent if now empty)
  const std::vector<std::string>& paths() const;  // one directory per hierarchy
  CgroupVersion version() const { return version_; }

 private:
  friend class CgroupHost;
  friend class CgroupTestPeer;

  Cgroup(CgroupVersion version, std::function<void(const std::string&)> before_rmdir,
         std::chrono::milliseconds settle_timeout);
  Cgroup(const Cgroup&) = delete;
  Cgroup& operator=(const Cgroup&) = delete;

  // The leaf directory holding `controller`, or nullptr.
  const std::string* dir_for(std::string_view controller) const;
  Result<void> remove_tree(const std::string& dir);

  CgroupVersion version_;
  std::vector<std::string> paths_;                     // leaves, one per hierarchy
  std::vector<std::vector<std::string>> controllers_;  // parallel to paths_
  std::vector<std::string> groups_;  // group parents, removed when empty (even without a leaf)
  std::function<void(const std::string&)> before_rmdir_;
  std::chrono::milliseconds settle_timeout_;
  // Set once remove() succeeded: a new cgroup may take the same path, and must not be touched.
  bool removed_ = false;
};

}  // namespace cellgate::jail
