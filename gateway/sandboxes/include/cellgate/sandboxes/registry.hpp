// SandboxRegistry: E2B's sandboxes over the kernel registry. A sandbox is a jailed kernel (of the
// kernelspec its template names, or restored from a snapshot) and E2B's record of it (model.hpp):
// its owner (tenant), metadata, env vars, times, state, tokens and what its timeout does.
//
//   SandboxRegistry sandboxes(kernels, executor, engine.loop(), engine.offload(), options);
//   sandboxes.start();                                      // records re-read, timers armed
//   auto s = sandboxes.create(caller, request);             // blocking: the kernel starts
//   auto target = sandboxes.find(id);                       // envd's lookup
//
// Lifecycle: a sandbox's end time is a timer on `loop` (not a check per request); when it fires
// the sandbox is killed, or paused (hibernated, KernelRegistry::hibernate) when created with
// autoPause. pause() hibernates the kernel (CRIU: serve needs checkpoints and kernels started
// without the zygote; otherwise a clear 501), connect() resumes it and only ever extends the end
// time. A sandbox whose kernel is gone (deleted through another API, dead) is gone too.
//
// Records: <state_dir>/sandboxes/<id>.json, rewritten atomically on every change, so a restarted
// gateway that re-adopts a sandbox's kernel (or finds it hibernated) keeps the sandbox; records
// whose kernel is gone are removed at start. Metrics are sampled from each running sandbox's
// cgroup every `metrics_interval` and kept in memory only (the last `metrics_kept`).
//
// Blocking methods (create, kill, pause, connect, snapshot, fork) run kernel starts and
// checkpoints: never on a network thread. Thread-safety: every public method is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/execute/executor.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/sandboxes/events.hpp"
#include "cellgate/sandboxes/model.hpp"
#include "cellgate/sandboxes/webhooks.hpp"
#include "cellgate/tenants/cpu_budget.hpp"
#include "cellgate/tenants/disk_limit.hpp"
#include "cellgate/tenants/owners.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::sandboxes {

// What envd's handler needs to serve a sandbox (found by the E2b-Sandbox-Id header).
struct SandboxTarget {
  std::string sandbox_id, kernel_id, access_token /* "" = none */, tenant;
  bool running = false;
};

struct SandboxOptions {
  std::string state_dir;  // records under <state_dir>/sandboxes ("": in memory only)
  Shape shape;            // cpu, memory and disk as the SDK is told
  // Sandboxes one tenant may have at once (running or paused); 0: no limit but max_kernels.
  std::size_t max_per_tenant = 0;
  // Where a tenant's sandbox kernels are recorded as its own, so its key reaches them through
  // the Jupyter and agent routes too; null: nowhere.
  tenants::KernelOwners* owners = nullptr;
  // Each tenant's CPU-seconds: a tenant past its budget creates, forks and resumes nothing (429);
  // null: no budget.
  const tenants::CpuBudget* cpu_budget = nullptr;
  // The disk each tenant may hold: a create or fork needs room for its work dirs (shape.disk_mb
  // each), a snapshot for its image (estimated as the kernel's memory); past it 429. Null: none.
  const tenants::DiskLimit* disk_limit = nullptr;
  Webhooks* webhooks = nullptr;  // lifecycle events; null: none
  std::chrono::milliseconds metrics_interval{5000};
  std::size_t metrics_kept = 720;
  std::chrono::seconds setup_timeout{30};  // the kernel's first silent cell (cwd, env vars)
  // How long a pause, snapshot or fork waits for a kernel still finishing a cell to go idle
  // (a checkpoint is of an idle kernel) before it is refused.
  std::chrono::milliseconds idle_wait{5000};
};

// One sample of GET /sandboxes/{id}/metrics.
struct Metric {
  SystemTime at;
  double cpu_used_pct = 0;  // of the sandbox's CPUs
  std::uint64_t mem_used = 0, mem_total = 0, mem_cache = 0, disk_used = 0, disk_total = 0;
  nlohmann::json to_json(int cpu_count) const;
};

// A snapshot as E2B shows it, with its owner.
struct SnapshotRecord {
  std::string id;  // the kernel registry's snapshot id (32 hex digits)
  std::string tenant;
  std::string sandbox_id;  // taken of
  std::vector<std::string> names;
  std::uint64_t seq = 0;
  nlohmann::json to_json() const;  // {snapshotID, names}
};

class SandboxRegistry {
 public:
  SandboxRegistry(kernels::KernelRegistry& kernels, execute::Executor& executor, util::Loop& loop,
                  util::Offload offload, SandboxOptions options);
  ~SandboxRegistry();
  SandboxRegistry(const SandboxRegistry&) = delete;
  SandboxRegistry& operator=(const SandboxRegistry&) = delete;

  // Re-reads the records of sandboxes whose kernels this gateway has (after the kernel
  // registry's start: adoption), arms their timers and starts sampling metrics.
  void start();
  // Called (blocking context) after a sandbox ended: killed, expired, or its kernel gone.
  void on_ended(std::function<void(const std::string& sandbox_id)> fn);

  // ---- envd's lookup ----
  std::optional<SandboxTarget> find(std::string_view sandbox_id) const;
  std::vector<SandboxTarget> list() const;

  // ---- the control plane (control_plane.cpp); errors kNotFound for a sandbox the caller
  // cannot see, as for one that does not exist ----
  Result<Sandbox> create(const Caller& caller, const CreateRequest& request);  // blocking
  Result<Sandbox> get(const Caller& caller, const std::string& id) const;
  std::vector<Sandbox> visible(const Caller& caller) const;
  Result<void> kill(const Caller& caller, const std::string& id);  // blocking
  // false: it was paused already (E2B's 409).
  Result<bool> pause(const Caller& caller, const std::string& id);  // blocking
  // Resumes a paused sandbox (`resumed` true) and extends its end to now + timeout at least.
  struct Connected {
    Sandbox sandbox;
    bool resumed = false;
  };
  Result<Connected> connect(const Caller& caller, const std::string& id, int timeout_seconds);
  Result<void> set_timeout(const Caller& caller, const std::string& id, int timeout_seconds);
  Result<SnapshotRecord> snapshot(const Caller& caller, const std::string& id,
                                  const std::string& name);  // blocking
  std::vector<SnapshotRecord> snapshots(const Caller& caller) const;
  Result<void> delete_snapshot(const Caller& caller, const std::string& snapshot_id);  // blocking
  // One result per copy (E2B answers each fork on its own).
  Result<std::vector<Result<Sandbox>>> fork(const Caller& caller, const std::string& id,
                                            const ForkRequest& request);  // blocking
  Result<std::vector<Metric>> metrics(const Caller& caller, const std::string& id,
                                      std::optional<SystemTime> start,
                                      std::optional<SystemTime> end);
  // GET /templates/aliases/{alias}: the template it names, if the caller may use it.
  Result<nlohmann::json> template_alias(const Caller& caller, const std::string& alias) const;

  const SandboxOptions& options() const { return options_; }
  // E2B's events API: every sandbox's lifecycle events (events.hpp).
  const EventLog& events() const { return *events_; }

  // One pass of the metrics sampler (start() runs it every metrics_interval); tests may call it.
  void sample_metrics();

 private:
  struct Entry {
    Sandbox sandbox;
    std::shared_ptr<util::Timer> timer;
    std::deque<Metric> metrics;
    std::uint64_t last_cpu_usec = 0;
    std::chrono::steady_clock::time_point last_cpu_at{};
  };

  // The entry `id` if `caller` may see it and its kernel is still there; else kNotFound. A
  // sandbox whose kernel is gone is dropped on the way.
  Result<Sandbox> visible_locked(const Caller& caller, const std::string& id) const
      CELLGATE_REQUIRES(mu_);
  std::string resolve_template(const Caller& caller, const std::string& template_id,
                               std::string& snapshot_id) const;
  // A new sandbox of an already started kernel (created, restored or forked).
  Result<Sandbox> adopt_kernel(const Caller& caller, const std::string& kernel_id,
                               const std::string& template_id, const std::string& alias,
                               const CreateRequest& request, bool set_up);
  Result<void> admit(const Caller& caller) const;
  // kResourceExhausted while the caller's tenant is past its CPU budget, or when `disk_bytes` more
  // would take it past its disk limit.
  Result<void> within_budget(const Caller& caller, std::uint64_t disk_bytes = 0) const;
  std::uint64_t work_dir_bytes() const;  // a sandbox's work dir cap (shape.disk_mb)
  void arm_locked(Entry& entry) CELLGATE_REQUIRES(mu_);
  // A checkpoint's refusal as the SDK reads it: the sandbox named, and a busy or unsuitable
  // kernel (kFailedPrecondition) as 400, since 409 would tell the SDK "paused already".
  static Error checkpoint_refused(Error e, const std::string& id, std::string_view doing);
  // Its kernel hibernated: the record says paused (saved), its timer re-armed, "paused" sent.
  void mark_paused(const std::string& id) CELLGATE_EXCLUDES(mu_);
  void note_owner(const Sandbox& s) const;                    // in options_.owners
  void emit(std::string_view label, const Sandbox& s) const;  // events_, options_.webhooks
  void expire(const std::string& id);
  void save_locked(const Sandbox& s) const CELLGATE_REQUIRES(mu_);
  void save_snapshots_locked() const CELLGATE_REQUIRES(mu_);
  // Removes the record and the entry; ends its kernel when `kill_kernel`; then on_ended.
  void end(const std::string& id, bool kill_kernel);
  std::string records_dir() const;
  // `checkpoint` (a hibernate, snapshot or fork), again while it is refused because the kernel
  // is busy, until options_.idle_wait has passed.
  template <typename T>
  Result<T> when_idle(const std::function<Result<T>()>& checkpoint) const;
  void schedule_sampler();

  kernels::KernelRegistry& kernels_;
  execute::Executor& executor_;
  std::shared_ptr<util::Strand> strand_;
  util::Offload offload_;
  const SandboxOptions options_;
  std::unique_ptr<EventLog> events_;
  std::function<void(const std::string&)> on_ended_;

  mutable Mutex mu_;
  mutable std::map<std::string, Entry> entries_ CELLGATE_GUARDED_BY(mu_);  // by sandbox id
  std::map<std::string, SnapshotRecord> snapshots_ CELLGATE_GUARDED_BY(mu_);
  std::uint64_t seq_ CELLGATE_GUARDED_BY(mu_) = 0;
  std::shared_ptr<util::Timer> sampler_ CELLGATE_GUARDED_BY(mu_);
  bool stopping_ CELLGATE_GUARDED_BY(mu_) = false;
};

}  // namespace cellgate::sandboxes
