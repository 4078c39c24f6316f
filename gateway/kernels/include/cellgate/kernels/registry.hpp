// KernelRegistry: the gateway's live kernels (start, find, list, interrupt, restart, shut down)
// with the warm pool, the death monitor and the culler beside it. Kernels are started through an
// injected kernel::KernelBackend (the launcher and ZeroMQ for real, a fake in unit tests), and
// idle times are measured on an injected clock.
//
//   kernel::ProcessBackend backend({.zygote = …});           // the composition root builds it
//   KernelRegistry registry(options, backend);
//   registry.start();                                  // backend, monitor and pool threads
//   auto model = registry.start("python3", env);       // blocking: until kernel_info answers
//   auto kernel = registry.find(model->id);            // shared_ptr<ManagedKernel>
//   kernel.value()->attach(listener, session_id);
//
// Where each facility lives (gateway/kernels/src/): registry.cpp (start/find/list/interrupt/
// restart/shutdown), pool.cpp (the warm pool), monitor.cpp (death monitor and culler),
// adoption.cpp (a previous gateway's kernels adopted, its leftovers cleaned up),
// records.cpp (state records), kernelspecs.cpp, env.cpp (the client-env filter), and
// managed_kernel.cpp (one kernel's state machine and its listeners), uid_allocator.cpp (the
// gateway's kernel uid range, leased host-wide; no uid handed out while a process runs as it).
//
// The warm pool (pool_size, pool_kernels): per pooled kernelspec, filler threads keep that many
// kernels fully started (kernel_info answered, one silent cell run) but invisible to clients.
// start() with no client env claims one at once; it is then an ordinary kernel and never goes
// back. A pooled kernel that dies is dropped and replaced, never restarted; ready ones are given
// up when a client start needs the room under max_kernels.
//
// Death and restarts: a kernel whose process ends, or whose heartbeats stop for
// heartbeat_timeout while its process uses no CPU (a kernel starved by its own cell at its CPU
// quota is busy, not dead: kernel/progress.hpp), is restarted (its listeners get status
// "restarting" with the reason on iopub) up to restart_limit times, then it is dead (status
// "dead", the reason in its model) until a client restarts it.
//
// After a crash or an upgrade: start() adopts every client kernel a previous gateway on the same
// state dir left running (same id, uid, env and variables; clients reconnect) and ends the rest
// it left (pooled kernels, kernels whose launcher is gone, unfinished starts).
//
// Thread-safety: every public method is thread-safe. Blocking ones (start, restart, shutdown)
// must not run on network threads. No thread starts before start(); the destructor stops them
// and shuts every kernel down.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/jail/spec.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernels/managed_kernel.hpp"
#include "cellgate/kernels/uid_allocator.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/metrics.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::kernels {

struct Record;  // records.hpp

// What the registry is configured with (the composition root fills it from `cellgate serve`'s
// options).
struct RegistryOptions {
  std::string state_dir;         // kernels/<id>.json records, work dirs, run/ (required)
  // The backend is a privileged broker (broker.hpp) and this gateway is not root: kernels' work
  // dirs are the broker's, <state_dir>/work/<id>, and the files API cannot chown.
  bool privilege_separated = false;
  std::size_t max_kernels = 64;  // live kernels, pooled ones included
  double cull_idle_timeout = 0;  // seconds; 0: never cull
  double cull_interval = 300;
  bool cull_connected = false;
  bool cull_busy = false;
  std::set<std::string> env_allowlist;    // client env names passed besides KERNEL_*
  int restart_limit = 5;                  // auto-restarts of a dying kernel before it is dead
  double kernel_start_timeout = 60;       // seconds until the kernel must answer kernel_info
  // Seconds a kernel may go without answering heartbeats while its process uses no CPU before it
  // is declared dead and restarted (a hung kernel: stopped, deadlocked). Silence while it uses
  // CPU, or is held at its CPU quota with work waiting, never counts.
  double heartbeat_timeout = 3;
  // The largest frame taken from a kernel; a larger one is refused by libzmq before it is
  // buffered, and the clients are told on iopub (kernel/src/client.cpp).
  std::size_t max_kernel_message_bytes = 64u << 20;
  bool no_jail = false;                   // run kernels unjailed (explicit only)
  int pool_size = 0;                      // ready kernels per pooled kernelspec (0: off)
  // Pool starts at once, at most (0: one per CPU); fewer while clients' starts are in flight, so
  // a refill after a burst takes the idle CPUs and never more than one from a client start.
  int pool_parallel = 0;
  std::vector<std::string> pool_kernels;  // kernelspecs pooled; empty: the default one
  jail::JailSpec jail;                    // limits for every kernel
  // ipykernels load cellgate's display formatters (a figure's chart, a DataFrame's data, PIL's
  // show() displayed: src/display_formatters.hpp). `cellgate serve` turns it on; off by default,
  // so notebook runs produce what nbclient would.
  bool display_formatters = false;
  // Paths in the jail where each kernel's work dir is mounted too (E2B's /home/user), so code
  // written for them reads and writes the files the gateway lists. Jailed kernels only.
  std::vector<std::string> work_dir_aliases;
  // The uids kernels run as: this gateway's own range, leased host-wide (uid_allocator.hpp).
  // An empty fallback_lease_dir means <state_dir>/uid-ranges.
  UidRangeOptions uids;
};

// What the registry has done since it started (GET /metrics).
struct RegistryStats {
  util::Counter starts;          // client kernels started, pool claims included
  util::Counter pool_claims;     // of those, from the warm pool
  util::Counter start_failures;  // client starts that failed
  util::Counter restarts;        // automatic restarts after a death
  util::LabeledCounter deaths;   // by reason: oom, signaled, timeout, violation, heartbeat, exited…
  util::Counter adopted;         // kernels of a previous gateway adopted at start
  util::Counter cleaned_up;      // and what it left that was ended and removed
};

class KernelRegistry {
 public:
  // Makes the state dir; starts nothing (see start()). `backend` must outlive the registry.
  KernelRegistry(RegistryOptions options, kernel::KernelBackend& backend,
                 Now now = util::Clock::now);
  ~KernelRegistry();  // stops the threads, shuts every kernel down
  KernelRegistry(const KernelRegistry&) = delete;
  KernelRegistry& operator=(const KernelRegistry&) = delete;

  // Takes the state dir for this gateway alone (an flock on <state_dir>/lock, held for the
  // registry's life): kernels are adopted and cleaned up from it, so two gateways must never
  // share one. kFailedPrecondition, naming the holder's pid, when another process holds it.
  // start() claims it when the caller has not; a caller that must not run without it (serve)
  // calls it first and stops on the error.
  Result<void> claim_state_dir();

  // Starts the backend (the zygote), adopts what a previous gateway on the state dir left
  // running (adoption.cpp), starts the death monitor and culler, and the pool's filler.
  void start();

  // Blocking. env: the client's env (filtered here: KERNEL_* and the allowlist only). With
  // nothing left after filtering, a ready pooled kernel of `name` is claimed instead (a pool hit).
  Result<KernelModel> start(const std::string& name, const nlohmann::json& env);
  Result<std::shared_ptr<ManagedKernel>> find(const std::string& id) const;
  std::vector<KernelModel> list() const;
  Result<void> interrupt(const std::string& id);
  Result<KernelModel> restart(const std::string& id);  // blocking
  Result<void> shutdown(const std::string& id);        // blocking
  // Ends every kernel, pooled ones included, and stops refilling the pool for good.
  void shutdown_all();
  // For a restart or an upgrade: ends the pooled kernels and stops the pool like shutdown_all(),
  // but leaves every client kernel running with its state record, for the next gateway on this
  // state dir to adopt. Their listeners are told the gateway is restarting.
  void hand_over();

  // One pass of the monitor: the backend's upkeep, dead kernels restarted (or declared dead),
  // and, when culling is on and cull_interval has passed on the clock, idle kernels culled.
  // start() runs it every 250 ms (and when a connection reports a death); tests call it.
  void monitor_once();

  const RegistryStats& stats() const { return stats_; }
  // Ready pooled kernels of every pooled kernelspec.
  std::size_t pool_ready_total() const;

  // Pooled kernels of kernelspec `name` ("" : the default) ready to be claimed.
  std::size_t pool_ready(const std::string& name) const;
  // Their kernel pids (host pid namespace), for tests.
  std::vector<pid_t> pool_pids(const std::string& name) const;

  // Kernelspecs: the standard directories, and a built-in python3 when none is installed.
  std::vector<kernel::KernelSpec> kernelspecs() const;
  Result<kernel::KernelSpec> kernelspec(const std::string& name) const;
  const std::string& default_kernel_name() const { return default_kernel_; }
  const RegistryOptions& options() const { return options_; }
  const std::string& state_dir() const { return options_.state_dir; }

 private:
  // ---- registry.cpp ----
  // Starts a process for `k` through the backend and waits until it answers; blocking.
  Result<ManagedKernel::Running> launch(const std::shared_ptr<ManagedKernel>& k);
  // Makes the work dir, launches, and moves `k` to idle (no state record).
  Result<void> start_fresh(const std::shared_ptr<ManagedKernel>& k);
  // A new kernel in state starting, with its uid; mu_ held. Fails when no uid is free.
  Result<void> make_home(const ManagedKernel& k) const;
  // A ManagedKernel with the work dir and file ownership of this gateway's mode.
  std::shared_ptr<ManagedKernel> make_kernel(const std::string& id, kernel::KernelSpec spec,
                                             uid_t uid, std::map<std::string, std::string> env);
  Result<std::shared_ptr<ManagedKernel>> new_kernel_locked(
      kernel::KernelSpec spec, std::map<std::string, std::string> env);
  // Ends a kernel no client ever saw (a failed start, a pooled one): no shutdown_request.
  void discard(const std::shared_ptr<ManagedKernel>& k);
  // Removes its work dir and gives its uid back.
  void release(const ManagedKernel& k);

  kernel::ClientOptions client_options(const std::shared_ptr<ManagedKernel>& k,
                                       const kernel::KernelProcessHandle& process);

  // ---- adoption.cpp ----
  // At start(): every client kernel a previous gateway left running is adopted; the rest it left
  // (pooled kernels, ended ones, unfinished starts) is ended and removed.
  void adopt_kernels();
  Result<void> adopt(const Record& record);
  void clean_up(const Record& record);

  // ---- pool.cpp ----
  bool is_pooled(const std::string& name) const;
  // A ready pooled kernel of `name` moved into kernels_, or null.
  std::shared_ptr<ManagedKernel> claim_pooled(const std::string& name);
  // Ready pooled kernels given up so live + pending + pool fits max_kernels again; mu_ held.
  std::vector<std::shared_ptr<ManagedKernel>> evict_pooled_locked();
  std::size_t pool_total_locked() const;     // ready and starting, every kernelspec
  std::size_t pool_starting_locked() const;  // starts in flight, every kernelspec
  void pool_loop();
  std::size_t pool_parallel() const;  // options_.pool_parallel, or the CPUs
  // Pool starts allowed at once now: pool_parallel() less the client starts in flight, at
  // least 1; mu_ held.
  std::size_t pool_budget_locked() const;
  // Starts one kernel for the pool of `name`; false when it failed.
  bool refill(const std::string& name);
  void reap_dead_pooled();
  void stop_pool();

  // ---- monitor.cpp ----
  void monitor_loop();
  void handle_death(const std::shared_ptr<ManagedKernel>& k, const std::string& reason);
  void cull();

  RegistryOptions options_;
  kernel::KernelBackend& backend_;
  const Now now_;
  std::string default_kernel_ = "python3";

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<ManagedKernel>> kernels_;
  std::size_t pending_ = 0;  // client starts in flight (and claims moving), for max_kernels
  UidAllocator uids_;  // thread-safe itself
  UniqueFd state_lock_;  // <state_dir>/lock, flock()ed; under mu_
  RegistryStats stats_;  // thread-safe itself

  std::vector<std::string> pool_names_;  // the pooled kernelspecs; fixed by the constructor
  // The warm pool, under mu_: ready kernels per kernelspec name (oldest first), starts in flight.
  std::map<std::string, std::vector<std::shared_ptr<ManagedKernel>>> pool_;
  std::map<std::string, std::size_t> pool_starting_;
  // After a failed start, no start of that kernelspec before retry_at (the backoff doubles).
  std::map<std::string, util::Clock::time_point> pool_retry_at_;
  std::map<std::string, util::Clock::duration> pool_backoff_;
  std::condition_variable pool_cv_;  // with mu_; wakes pool_loop: a claim, a death, stopping
  bool pool_stopping_ = false;       // under mu_: no more refills

  std::mutex monitor_mu_;  // with monitor_cv_: wakes monitor_loop
  std::condition_variable monitor_cv_;
  bool stopping_ = false;                // under monitor_mu_: the monitor ends
  std::mutex pass_mu_;                   // one monitor pass at a time
  util::Clock::time_point next_cull_{};  // under pass_mu_
  std::thread monitor_;
  std::vector<std::thread> pool_threads_;  // the fillers, pool_parallel of them
};

}  // namespace cellgate::kernels
