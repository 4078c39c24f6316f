// Cell: one agent call on one kernel, as a state machine on its own strand. Kernel messages,
// timers, the client leaving and the offload pool's results are posted to the strand; nothing
// waits for the cell.
//
//   auto cell = Cell::launch(context, loop.strand(), {.kernel_id = id, .request = r, …}, done);
//   cell->cancel();                                     // the client left (any thread)
//
// States and transitions (every transition runs on the cell's strand):
//
//   (launched) ──kernel not found──────────────────────────────────────▶ done (error, 404)
//       │ joins the kernel's FIFO (KernelQueues); deadline and keepalive timers set
//       ▼
//   kQueued ──deadline──▶ done "timeout" (did not run)
//       │   ──cancel────▶ done "aborted" (did not run)
//       │   ──its turn, kernel gone──────▶ done "dead" (did not run)
//       │   ──its turn, no connection────▶ done (error 503: the kernel is restarting)
//       │ its turn, kernel hibernated: resumed on the offload pool (once), then its turn again;
//       │   a failed resume ends it with the registry's error
//       │ its turn: cgroup stats and work-dir snapshot taken
//       ▼
//   kSetup (only with setup_code: sent silently) ──reply not ok──▶ done (error setup_failed)
//       │ reply ok                      ──ended without a reply (kernel died)──▶ finish
//       ▼
//   kRunning (execute_request sent; iopub and stdin arrive here) ──ended──▶ kTeardown / finish
//       │ deadline or cancel (also from kSetup): interrupt (registry: SIGINT; message-mode
//       │ kernels: an interrupt_request on control, not waited for), grace timer set
//       ▼
//   kStopping ──the request ended within the grace──▶ kTeardown / finish   (state kept)
//       │ grace timer: while the kernel's cgroup used CPU through the last grace period (it may
//       │ be handling the interrupt: IPython formats its first traceback in seconds on a slow,
//       │ CPU-capped host), another grace period, at most kGraceExtensions times
//       ▼
//   kRestarting (registry.restart on the offload pool; state_lost) ──restarted or failed──▶ finish
//
//   kTeardown (only with teardown_code, the kernel alive and its state kept: sent silently)
//       ──ended, or max(deadline, now) + 2 s passed──▶ finish
//
//   finish: status and message decided, cgroup stats and work-dir diff taken, the answer made,
//   the audit line written, the FIFO turn passed on, then done → kDone. The status, first that
//   applies: "timeout" (the deadline stopped it), "aborted" (cancel stopped it), "dead" (its
//   request ended without a reply: the kernel died or was deleted; state_lost), else the reply's.
//
//   abandon() (the executor is going away), from any state: → done "aborted" at once (a running
//   cell is sent an interrupt, nothing is waited for).
//
// In every state but kDone a keepalive timer emits {"type":"keepalive"} every
// RunOptions::keepalive. Messages of a request the cell no longer waits for (a late setup
// reply, output after the answer) are dropped. Kernel messages reach the strand through an
// Inbox (inbox.hpp): while more than a few MiB wait for the strand, the kernel's I/O thread
// waits, so a flood stays in the kernel's queues instead of the gateway's memory.
//
// Silent cells (Executor::run_silently) take the same path with no outputs, no history, no
// stats, no audit line; they answer {"status":"ok"} or an error.
//
// Lifetime: a cell is owned by its CellContext's live set until it is done; handlers and timers
// hold it weakly (offload work strongly, for its duration). What it shares with the executor is
// held by shared_ptr, so an executor that goes away leaves no callback pointing into it; the
// registry, artifact store, audit log and loop must outlive the executor and the offload work
// it queued (the composition root joins the offload pool first).
//
// Thread-safety: launch(), cancel() and abandon() may be called from any thread; the rest runs
// on the cell's strand.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cellgate/execute/executor.hpp"
#include "cellgate/jail/cgroup.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/store/files.hpp"
#include "cellgate/util/loop.hpp"
#include "collector.hpp"
#include "inbox.hpp"
#include "queue.hpp"

namespace cellgate::execute {

class Cell;

// What an executor's cells share with it and with each other.
struct CellContext {
  // Spelled out because clang 14 lacks parenthesized aggregate init (P0960), which make_shared
  // needs here.
  CellContext(kernels::KernelRegistry& registry_in, store::ArtifactStore& artifacts_in,
              store::AuditLog& audit_in, ExecuteLimits limits_in, util::Loop& loop_in,
              util::Offload offload_in)
      : registry(registry_in),
        artifacts(artifacts_in),
        audit(audit_in),
        limits(limits_in),
        loop(loop_in),
        offload(std::move(offload_in)) {}

  kernels::KernelRegistry& registry;
  store::ArtifactStore& artifacts;
  store::AuditLog& audit;
  const ExecuteLimits limits;
  util::Loop& loop;
  const util::Offload offload;
  KernelQueues queues;
  CellStats stats;

  Mutex mu;
  bool closed CELLGATE_GUARDED_BY(mu) = false;  // the executor is gone
  // cells not done yet: their owners
  std::map<const Cell*, std::shared_ptr<Cell>> live CELLGATE_GUARDED_BY(mu);
};

struct CellParams {
  std::string kernel_id;
  ExecuteRequest request;
  RunOptions options;
  // run_silently: no outputs, no history, no stats or audit line; answers {"status": "ok"} or an
  // error (setup_failed, timeout).
  bool silent = false;
};

class Cell : public std::enable_shared_from_this<Cell> {
 public:
  // Creates the cell, makes it live and starts it on `strand`. `done` is called exactly once, on
  // the strand. Null when the context is closed (done is then not called).
  static std::shared_ptr<Cell> launch(const std::shared_ptr<CellContext>& context,
                                      std::shared_ptr<util::Strand> strand, CellParams params,
                                      Done done);

  // The client left: a queued cell answers "aborted" without running, a running one is stopped.
  void cancel();
  // The executor is going away: the cell answers "aborted" at once (a running one is sent an
  // interrupt first), without waiting for the kernel; its kernel messages are dropped from now.
  void abandon();

  const std::shared_ptr<util::Strand>& strand() const { return strand_; }

  Cell(const std::shared_ptr<CellContext>& context, std::shared_ptr<util::Strand> strand,
       CellParams params, Done done);  // use launch()
  ~Cell();

 private:
  enum class State { kQueued, kSetup, kRunning, kStopping, kRestarting, kTeardown, kDone };
  enum class Phase { kSetup, kCell, kTeardown };

  // Each runs on the strand.
  void begin();
  void on_turn();
  void on_deadline();
  void on_cancel();
  void on_abandon();
  void on_keepalive();
  void on_grace();
  void on_teardown_timeout();
  void on_restarted(const Result<kernels::KernelModel>& restarted);
  void on_envelope(std::uint64_t request, const protocol::EnvelopePtr& envelope);
  void on_request_end(std::uint64_t request, kernel::RequestEnd end);

  void send_setup();
  void send_cell();
  void after_cell();   // the cell's request ended (or was given up): teardown or finish
  void stop();         // interrupt, then the grace timer
  void start_grace();  // (re)arms the grace timer and samples the kernel's CPU time
  std::optional<std::uint64_t> kernel_cpu_usec() const;  // its cgroup's CPU time, if known
  void interrupt();
  // Sends an execute_request whose messages and end are posted back to the strand; 0 when the
  // kernel has no connection.
  std::uint64_t send_execute(nlohmann::json content, bool wait_for_idle);
  std::shared_ptr<kernel::KernelConnection> connection() const { return connection_.lock(); }
  std::shared_ptr<kernels::ManagedKernel> kernel() const;
  // A timer on the strand that calls `fn` if the cell is still there.
  std::shared_ptr<util::Timer> at(util::Clock::time_point when, void (Cell::*fn)());

  // The answer of a cell that never got to run.
  void finish_unrun(const char* status, std::string message, bool state_lost);
  // The answer of a cell that ran (or was stopped).
  void finish();
  void finish_silent();
  // Makes the answer and hands it over: the turn is passed on, timers stopped, done called.
  void complete(Answer answer);
  CellResult answer_of(const std::string& status, const std::string& message, bool ran);

  const std::shared_ptr<CellContext> context_;
  const std::shared_ptr<util::Strand> strand_;
  const CellParams params_;
  Done done_;
  Collector collector_;
  // Kernel messages on their way to the strand, at most a few MiB (inbox.hpp).
  const std::shared_ptr<Inbox> inbox_;

  State state_ = State::kQueued;
  util::Clock::time_point started_;
  util::Clock::time_point deadline_;
  std::optional<KernelQueues::Ticket> ticket_;
  std::weak_ptr<kernels::ManagedKernel> kernel_;
  std::weak_ptr<kernel::KernelConnection> connection_;
  std::deque<std::string> stdin_lines_;

  std::shared_ptr<util::Timer> deadline_timer_;
  std::shared_ptr<util::Timer> keepalive_timer_;
  std::shared_ptr<util::Timer> grace_timer_;
  std::shared_ptr<util::Timer> teardown_timer_;

  std::uint64_t next_request_ = 0;
  std::uint64_t setup_request_ = 0;
  std::uint64_t cell_request_ = 0;
  std::uint64_t teardown_request_ = 0;
  std::uint64_t in_flight_ = 0;  // the setup or cell request the machine waits for
  std::optional<nlohmann::json> setup_reply_;
  std::optional<nlohmann::json> reply_;  // the cell's execute_reply content
  kernel::RequestEnd end_ = kernel::RequestEnd::kComplete;

  bool ran_ = false;  // got its turn
  bool timed_out_ = false;
  bool cancelled_ = false;
  bool abandoned_ = false;
  bool state_lost_ = false;
  // The kernel has begun the cell's request: a message of its handler came (execute_input, or
  // any output; a silent cell's `status: busy`). A SIGINT sent before that reaches a kernel that
  // ignores it (ipykernel sets SIG_IGN between cells and installs its handler only after it has
  // published busy), and the cell then runs past its grace: the interrupt waits for this.
  bool kernel_began_ = false;
  bool interrupt_deferred_ = false;
  bool resume_tried_ = false;  // a hibernated kernel is resumed once per cell
  // The kernel cgroup's CPU time when the grace period began (unknown without a cgroup), and
  // how many times it was extended because the kernel kept working.
  std::optional<std::uint64_t> grace_cpu_usec_;
  int grace_extensions_ = 0;
  static constexpr int kGraceExtensions = 3;
  std::optional<jail::CgroupStats> before_stats_;
  std::optional<store::files::Snapshot> before_files_;
};

}  // namespace cellgate::execute
