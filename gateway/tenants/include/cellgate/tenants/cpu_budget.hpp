// CpuBudget: the CPU-seconds each tenant's kernels may use in a window of time
// (`--tenant-max-cpu-seconds N` per `--tenant-cpu-window`), counted from their cgroups, and held:
// a tenant past it starts nothing more (403 on the Jupyter and agent routes, 429 on E2B's) and its
// running kernels are throttled to a sliver of a CPU until the window ends. Nothing is killed and
// no variable is lost; a tenant's kernels carry on at full speed in the next window.
//
//   CpuBudget budget({.max_cpu_seconds = 600, .window = 1h, .file = dir + "/tenant-cpu.json"},
//                    hooks);
//   budget.sample(now);                 // every few seconds: read, add up, throttle or release
//   if (auto why = budget.refusal("alice", now)) { … 429 … }
//
// What is counted: every process in a tenant's kernels' cgroups (its cells, a sandbox's commands
// and terminals), from each kernel's cumulative cgroup CPU time, as deltas between samples (a
// reading lower than the last is a new cgroup, a restarted kernel: counted from zero). The
// window's totals and each kernel's last reading are written to `file` after every sample that
// changed them, so a restarted gateway neither forgets a tenant's use nor counts it twice; a
// damaged file starts afresh (logged). Windows are fixed, aligned to the Unix epoch.
//
// Thread-safety: every method may be called from any thread; hooks are called without the lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::tenants {

struct CpuBudgetOptions {
  double max_cpu_seconds = 0;  // per tenant per window; 0: no budget
  std::chrono::seconds window{3600};
  std::string file;  // where the window's use is kept; "" : memory only
};

struct CpuBudgetHooks {
  struct Owned {
    std::string kernel_id;
    std::string tenant;
  };
  // The kernels tenants own now.
  std::function<std::vector<Owned>()> owned;
  // A kernel's cumulative CPU time in microseconds; nullopt when unknown (gone, hibernated).
  std::function<std::optional<std::uint64_t>(const std::string& kernel_id)> cpu_usec;
  // Throttles a kernel (true) or gives it its own CPU limit back (false).
  std::function<Result<void>(const std::string& kernel_id, bool throttled)> throttle;
};

class CpuBudget {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  CpuBudget(CpuBudgetOptions options, CpuBudgetHooks hooks);
  ~CpuBudget();
  CpuBudget(const CpuBudget&) = delete;
  CpuBudget& operator=(const CpuBudget&) = delete;

  // Samples every `interval` on `offload` (the reads and the file are blocking work) until
  // stop(), which waits for a sample under way (so the budget may be destroyed after it).
  void start(util::Loop& loop, util::Offload offload, std::chrono::milliseconds interval);
  void stop();

  // One pass: reads every owned kernel, adds what each used since its last reading to its
  // tenant's window, then throttles the kernels of tenants past the budget and releases the rest
  // (a new window releases everyone). A kernel that cannot be throttled is logged each pass.
  void sample(TimePoint now);
  // Adds CPU time a tenant used outside its kernels' cgroups as they are sampled: a one-shot
  // cell's kernel, which is the tenant's for that cell only.
  void charge(const std::string& tenant, std::uint64_t usec, TimePoint now);
  // Why `tenant` may start nothing now, or nullopt when it may.
  std::optional<std::string> refusal(const std::string& tenant, TimePoint now) const;
  // The CPU-seconds `tenant` used in the current window (as of the last sample).
  double used_seconds(const std::string& tenant, TimePoint now) const;
  // The kernels throttled now.
  std::set<std::string> throttled() const;

 private:
  struct Seen {
    std::string tenant;
    std::uint64_t usec = 0;  // its last reading
  };
  std::int64_t window_of(TimePoint now) const;
  void roll_locked(std::int64_t window) CELLGATE_REQUIRES(mu_);
  void load();
  std::string serialize_locked() const CELLGATE_REQUIRES(mu_);

  const CpuBudgetOptions options_;
  const CpuBudgetHooks hooks_;
  mutable Mutex mu_;
  std::int64_t window_ CELLGATE_GUARDED_BY(mu_) = -1;
  std::map<std::string, std::uint64_t> used_usec_ CELLGATE_GUARDED_BY(mu_);  // by tenant
  std::map<std::string, Seen> kernels_ CELLGATE_GUARDED_BY(mu_);             // by kernel id
  std::set<std::string> throttled_ CELLGATE_GUARDED_BY(mu_);
  std::set<std::string> unthrottleable_ CELLGATE_GUARDED_BY(mu_);  // failed, and logged
  bool charged_ CELLGATE_GUARDED_BY(mu_) = false;                  // since the file was written
  void schedule();
  util::Loop* loop_ = nullptr;
  std::shared_ptr<util::Strand> strand_;
  util::Offload offload_;
  std::chrono::milliseconds interval_{0};
  Mutex timer_mu_;
  bool stopping_ CELLGATE_GUARDED_BY(timer_mu_) = false;
  bool sampling_ CELLGATE_GUARDED_BY(timer_mu_) = false;  // a scheduled sample runs
  std::condition_variable_any sampled_;
  std::shared_ptr<util::Timer> timer_ CELLGATE_GUARDED_BY(timer_mu_);
};

}  // namespace cellgate::tenants
