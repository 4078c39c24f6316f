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
// restart/shutdown; registry_impl.hpp holds the parts), admission.hpp (live + pending + pooled
// kernels against max_kernels, one RAII ticket per place), warm_pool.hpp (the warm pool: its own
// lock and fillers, given a launch function), monitor.cpp (death monitor and culler),
// adoption.cpp (a previous gateway's kernels adopted, its leftovers cleaned up),
// records.cpp (state records), kernelspecs.cpp, env.cpp (the client-env filter), and
// managed_kernel.cpp (one kernel's state machine and its listeners), uid_allocator.cpp (the
// gateway's kernel uid range, leased host-wide; no uid handed out while a process runs as it).
//
// The warm pool (pool_size, pool_max, pool_kernels): per pooled kernelspec, filler threads keep
// kernels fully started (kernel_info answered, one silent cell run) but invisible to clients:
// pool_size of them at least, more while recent starts ask for more (up to pool_max;
// warm_pool.hpp says how). start() with no client env claims one at once; it is then an
// ordinary kernel and never goes back. A pooled kernel that dies is dropped and replaced, never
// restarted; ready ones are given up when a client start needs the room under max_kernels.
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

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cellgate/jail/spec.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernels/managed_kernel.hpp"
#include "cellgate/kernels/uid_allocator.hpp"
#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"
#include "cellgate/util/metrics.hpp"

namespace cellgate::kernels {

// What the registry is configured with (the composition root fills it from `cellgate serve`'s
// options).
// serve --seed NOTEBOOK in the jupyter-websocket mode (Kernel Gateway's seed_uri): these code
// cells run, in order, in every new kernel of the language before a client sees it — fresh,
// pooled and restarted kernels; not copies restored from a snapshot or image, which carry the
// state they were seeded with. A cell that fails fails the kernel's start (seed_failed).
struct SeedOptions {
  std::string source;              // the notebook's path, for messages
  std::string language;            // the notebook's language ("": every kernel)
  std::vector<std::string> cells;  // empty: no seeding
};

struct RegistryOptions {
  std::string state_dir;  // kernels/<id>.json records, work dirs, run/ (required)
  // The backend is a privileged broker (broker.hpp) and this gateway is not root: kernels' work
  // dirs are the broker's, <state_dir>/work/<id>, and the files API cannot chown.
  bool privilege_separated = false;
  std::size_t max_kernels = 64;  // live kernels, pooled ones included
  double cull_idle_timeout = 0;  // seconds; 0: never cull
  double cull_interval = 300;
  // Seconds an idle kernel (no cell running, no input_request open) waits before it hibernates
  // on its own (hibernate()); 0: never. Kernels that cannot hibernate are skipped, said once.
  double hibernate_after = 0;
  // Bytes every hibernated kernel's image may take together; 0: no limit. A hibernation that
  // could pass it is refused ("no_space"), the kernel running on.
  std::uint64_t hibernate_disk_max = 0;
  bool cull_connected = false;
  bool cull_busy = false;
  std::set<std::string> env_allowlist;  // client env names passed besides KERNEL_*
  // Set in every kernel's environment, over the defaults and under the client's (a gateway
  // sets KERNEL_GATEWAY=1, as Kernel Gateway does).
  std::map<std::string, std::string> kernel_env;
  // The kernelspec started when a request names none ("": python3, else the first found).
  std::string default_kernel;
  // When set, every start runs this kernelspec, whatever the request names (Kernel Gateway's
  // force_kernel_name); it is the default kernel too.
  std::string force_kernel;
  SeedOptions seed;
  int restart_limit = 5;             // auto-restarts of a dying kernel before it is dead
  double kernel_start_timeout = 60;  // seconds for the launcher's report and the first kernel_info
  // Seconds a kernel may go without answering heartbeats while its process uses no CPU before it
  // is declared dead and restarted (a hung kernel: stopped, deadlocked). Silence while it uses
  // CPU, or is held at its CPU quota with work waiting, never counts.
  double heartbeat_timeout = 3;
  // The largest frame taken from a kernel; a larger one is refused by libzmq before it is
  // buffered, and the clients are told on iopub (kernel/src/client.cpp).
  std::size_t max_kernel_message_bytes = 64u << 20;
  bool no_jail = false;  // run kernels unjailed (explicit only)
  int pool_size = 0;     // ready kernels per pooled kernelspec (0: off)
  // The most ready kernels per pooled kernelspec while recent starts ask for more than
  // pool_size (warm_pool.hpp); at most pool_size (the default, 0): a fixed size.
  int pool_max = 0;
  // Pool starts at once, at most (0: one per CPU); fewer while clients' starts are in flight, so
  // a refill after a burst takes the idle CPUs and never more than one from a client start.
  int pool_parallel = 0;
  std::vector<std::string> pool_kernels;  // kernelspecs pooled; empty: the default one
  jail::JailSpec jail;                    // limits for every kernel
  // Kernels whose kernelspec sets metadata.cellgate.debugger get a loopback network
  // (jail/README.md, "Loopback network"); false: such a kernelspec does not start.
  bool allow_debugger = false;
  // ipykernels load cellgate's display formatters (a figure's chart, a DataFrame's data, PIL's
  // show() displayed: src/display_formatters.hpp). `cellgate serve` turns it on; off by default,
  // so notebook runs produce what nbclient would.
  bool display_formatters = false;
  // Paths in the jail where each kernel's work dir is mounted too (E2B's /home/user), so code
  // written for them reads and writes the files the gateway lists. Jailed kernels only.
  std::vector<std::string> work_dir_aliases;
  // Why kernels cannot hibernate here (501 with this reason), or "" when they can: the composition
  // root says so from engine::PreparedHost::checkpoints (CRIU found and checked, root, jailed)
  // and the gateway's mode (not behind a broker yet).
  std::string checkpoints_unavailable = "this gateway was not set up for checkpoints";
  // The uids kernels run as: this gateway's own range, leased host-wide (uid_allocator.hpp).
  // An empty fallback_lease_dir means <state_dir>/uid-ranges.
  UidRangeOptions uids;
};

// The uids of the kernels a state dir's records say run or lie hibernated (pooled ones aside):
// the range a gateway restarted on that state dir leases first (uid_allocator.hpp).
std::set<uid_t> recorded_kernel_uids(const std::string& state_dir);
// `uids` with `state_dir` as the owner named in its lease file, and another owner counted as
// keeping its range while its state dir has kernel records.
UidRangeOptions owned_by_state_dir(UidRangeOptions uids, const std::string& state_dir);

// What the registry has done since it started (GET /metrics).
struct RegistryStats {
  util::Counter starts;          // client kernels started, pool claims included
  util::Counter pool_claims;     // of those, from the warm pool
  util::Counter start_failures;  // client starts that failed
  util::Counter restarts;        // automatic restarts after a death
  util::LabeledCounter deaths;  // by reason: oom, signaled, timeout, violation, heartbeat, exited…
  util::Counter adopted;        // kernels of a previous gateway adopted at start
  util::Counter cleaned_up;     // and what it left that was ended and removed
  // Seconds a client start took, by kernelspec and source: "pool" (a claim), "zygote" (forked
  // from it, as the launcher reported) or "cold". Successful starts only.
  util::HistogramVec start_seconds{{"kernelspec", "source"},
                                   {0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120}};
};

// A kernel's move between nodes (move_out, move_in): what the receiving node needs besides the
// archive itself.
struct MovedKernel {
  std::string id;           // kept: the router's override map sends it to its new node
  std::string kernel_name;  // a kernelspec both nodes have
  std::string key;          // the connection key the image's kernel holds (the copy is rekeyed)
  std::map<std::string, std::string> env;  // the client env it was started with (its record's)
  std::string archive;                     // a tar of the snapshot dir; removed by move_in
};
// move_out's courier: places the archive (a tar file's path; `moved.archive`) on another node and
// answers a name for where it went, or why not.
using MoveSender = std::function<Result<std::string>(const MovedKernel& moved)>;

// A snapshot as GET /api/snapshots shows it.
struct SnapshotModel {
  std::string id;           // 32 lowercase hex digits
  std::string kernel_id;    // the kernel it was taken of
  std::string kernel_name;  // its kernelspec: a start from it is one of these
  std::string created;      // ISO 8601 UTC
  std::uint64_t bytes = 0;  // on disk
  nlohmann::json to_json() const;
};

class KernelRegistry {
 public:
  // Makes the state dir; starts nothing (see start()). `backend` must outlive the registry.
  KernelRegistry(RegistryOptions options, kernel::KernelBackend& backend,
                 Now now = util::Clock::now);
  // The same, with the monitor's passes run as timers on `loop` (one every 250 ms of its
  // clock, and one posted when a connection reports a death) instead of on a thread of its own,
  // and idle times read from its clock: tests drive the monitor with a util::ManualLoop. The
  // passes block (a restart launches a kernel): never a loop that serves network I/O.
  KernelRegistry(RegistryOptions options, kernel::KernelBackend& backend, util::Loop& loop);
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

  // ---- this node in a cluster (docs/scale-out.md) ----
  // A draining node starts no kernel (start, a snapshot's copy, a fork: 503 "node_draining", so
  // a router retries elsewhere); its kernels run on. Pool kernels it already has stay.
  void set_draining(bool on);
  bool draining() const;
  // Client kernels that may still start, as a percentage of max_kernels (0 when full).
  int room_percent() const;
  // The kernel's resource usage as ipykernel's usage_reply content (usage.cpp): CPU % since
  // the last ask and memory from its cgroup, its limits, the host's CPU and memory.
  Result<nlohmann::json> usage(const std::string& id);
  std::vector<KernelModel> list() const;
  Result<void> interrupt(const std::string& id);
  Result<KernelModel> restart(const std::string& id);  // blocking
  Result<void> shutdown(const std::string& id);        // blocking
  // Blocking (hibernate.cpp). Checkpoints an idle kernel to <state_dir>/kernels/<id>/hibernated
  // (0700, its files 0600): its processes and cgroup end, its model stays (idle, hibernated).
  // 501-mapped "checkpoints_unavailable" where this host or mode cannot; kFailedPrecondition
  // when it is busy or not hibernatable (forked from the zygote); a failed dump leaves it
  // running and connected and returns the error.
  Result<KernelModel> hibernate(const std::string& id);
  // Blocking. Brings a hibernated kernel back (restore, reconnect, kernel_info) and removes its
  // image; nothing for a kernel that is not hibernated. Concurrent calls restore it once. A
  // failed restore leaves it dead with the reason. interrupt() and restart() call it (restart
  // of a hibernated kernel starts it afresh instead); a WebSocket's or a cell's first touch
  // does through the API.
  Result<void> resume(const std::string& id);

  // ---- snapshots and fork (snapshots.cpp; README, "Snapshots and fork") ----
  // Blocking. Checkpoints an idle kernel into <state_dir>/snapshots/<id> (an ImageStore: 0700,
  // 32-hex ids) with its work files; the kernel runs on, its clients stay connected (their
  // messages wait out the dump). Refusals as hibernate(); "no_space" (507) past
  // hibernate_disk_max, which bounds the snapshots together.
  Result<SnapshotModel> snapshot(const std::string& kernel_id);
  std::vector<SnapshotModel> snapshots() const;
  // Bytes on disk of a hibernated kernel's image (0: none, or no such kernel).
  std::uint64_t image_bytes(const std::string& kernel_id) const;
  Result<void> delete_snapshot(const std::string& snapshot_id);  // kNotFound "no_snapshot"
  // Blocking. A new kernel restored from a snapshot: its source's variables and work files, its
  // own id, uid, cgroup, work dir and namespaces (the image rebased: checkpoint/rebase.hpp).
  // `name` "" or the snapshot's kernelspec; no client env (the copy keeps its source's).
  Result<KernelModel> start_from_snapshot(const std::string& snapshot_id, const std::string& name,
                                          const nlohmann::json& env);
  // Blocking. `count` (1..16) copies of a running kernel at once: a snapshot, the copies
  // restored from it together, the snapshot removed. All or none: a copy that fails ends the
  // others.
  Result<std::vector<KernelModel>> fork(const std::string& kernel_id, int count);

  // ---- moving a kernel to another node (moves.cpp; docs/scale-out.md, "Moving kernels") ----
  // Blocking. Checkpoints an idle kernel (a hibernated one resumes first) with its work files
  // into one tar archive and hands it to `send`, which places it on another node; meanwhile the
  // kernel takes no message (they wait, as during a snapshot). When `send` succeeds, the kernel
  // ends here: its listeners are told it moved (to what `send` answered: "node 0002"), its
  // record and home go, and its id answers 503 "kernel_moved" here from then on
  // (protocol::note_moved). When `send` fails, the kernel runs on here as before and the error
  // is returned. Refusals as snapshot().
  Result<void> move_out(const std::string& id, const MoveSender& send);
  // Blocking. Restores a kernel moved here under its own id (another node's tag): its archive
  // (made by another node's move_out, its integrity checked by the caller) unpacked into the
  // snapshot store, rebased onto a uid, cgroup and work dir of this node and restored as a
  // snapshot's copy is; the archive is removed either way. kFailedPrecondition "kernel_exists"
  // when that id runs here already; refused as a start while draining.
  Result<KernelModel> move_in(const MovedKernel& moved);

  // Ends every kernel, pooled ones included, and stops refilling the pool for good.
  void shutdown_all();
  // For a restart or an upgrade: ends the pooled kernels and stops the pool like shutdown_all(),
  // but leaves every client kernel running with its state record, for the next gateway on this
  // state dir to adopt. Their listeners are told the gateway is restarting.
  void hand_over();
  // For a reboot or an upgrade with --hibernate-on-stop: stops the pool, hibernates every kernel
  // that can (idle, cold-started, checkpoints available), leaves those on disk with their
  // records for the next gateway on this state dir (hand_over()'s way), and ends the others,
  // saying why each did not hibernate.
  void hibernate_and_stop();

  // One pass of the monitor: the backend's upkeep, dead kernels restarted (or declared dead),
  // and, when culling is on and cull_interval has passed on the clock, idle kernels culled.
  // start() runs it every 250 ms (and when a connection reports a death), on its own thread or
  // on the monitor loop; tests may call it.
  void monitor_once();

  const RegistryStats& stats() const;
  // Ready pooled kernels of every pooled kernelspec.
  std::size_t pool_ready_total() const;

  // Pooled kernels of kernelspec `name` ("" : the default) ready to be claimed.
  std::size_t pool_ready(const std::string& name) const;
  // How many the pool keeps ready for `name` now: pool_size .. pool_max by recent demand.
  std::size_t pool_target(const std::string& name) const;
  // Their kernel pids (host pid namespace), for tests.
  std::vector<pid_t> pool_pids(const std::string& name) const;

  // Kernelspecs: the standard directories, and a built-in python3 when none is installed.
  std::vector<kernel::KernelSpec> kernelspecs() const;
  Result<kernel::KernelSpec> kernelspec(const std::string& name) const;
  const std::string& default_kernel_name() const;
  const RegistryOptions& options() const;
  const std::string& state_dir() const;

 private:
  // The kernelspec of kernel `id`, for the lifecycle log; "" when there is no such kernel.
  std::string spec_name_of(const std::string& id) const;

  class Impl;  // the parts: gateway/kernels/src/registry_impl.hpp
  std::unique_ptr<Impl> impl_;
};

}  // namespace cellgate::kernels
