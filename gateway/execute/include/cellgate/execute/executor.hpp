// Running cells for agents: POST /api/kernels/{id}/execute, the one-shot POST /api/execute, and
// the E2B-compatible POST /execute all run through one Executor.
//
//   {"code": "...", "timeout": 30, "stdin": ["line", ...], "store_history": true}
//   → {"status": "ok"|"error"|"timeout"|"aborted"|"dead", "execution_count", "stdout", "stderr",
//      "outputs": [nbformat outputs], "result": {mime bundle}|null,
//      "error": {"ename", "evalue", "traceback": [ANSI stripped], "line"}|null,
//      "artifacts": [records; a figure's PNG has its "chart"], "charts": [E2B charts],
//      "data": [{column: [values]} of DataFrames], "files": [work-dir changes], "notices": [...],
//      "truncated": {"stdout", "stderr", "outputs", "dropped_bytes"}, "state_lost",
//      "metrics": {"wall_ms", "cpu_ms", "memory_peak_bytes", "memory_current_bytes"}}
// — a CellResult (cell_result.hpp), whose to_json() writes exactly that.
//
// While the cell runs, RunOptions::on_event receives the same things as events, in order:
//   {"type":"stream","name":"stdout"|"stderr","text"}      (only what is kept under the caps)
//   {"type":"execute_result"|"display_data"|"update_display_data","data","metadata",
//    "execution_count"?, "artifacts"?: [records]}
//   {"type":"error","ename","evalue","traceback","line"?}
//   {"type":"clear_output","wait"}
//   {"type":"notice","message"}                               (a cap was reached)
//   {"type":"keepalive"}                                      (every RunOptions::keepalive)
// and then `done` is called once with the answer above (or an error: no such kernel, …).
//
//   auto cell = executor.run(id, request, {.on_event = write_event}, [](Answer answer) {…});
//   exchange->watch([cell] { cell->cancel(); });              // the client left
//
// Each cell is a state machine on its own strand of the event loop, driven by the kernel's
// messages and timers — no thread waits for it (gateway/execute/src/cell.hpp draws it): queued
// (one FIFO per kernel: agent calls on one kernel run one at a time in arrival order; a call that
// cannot start within its timeout answers "timeout", one whose client leaves first "aborted",
// one whose kernel is deleted first "dead", all without running) → running → at the deadline (or
// cancel()) interrupted → after the grace period the kernel is restarted (on the offload pool)
// and the answer says state_lost: true. Deleting the kernel ends its running cell with "dead".
// Output is capped per stream and per output while it arrives, so a cell that prints without end
// costs the gateway a bounded amount of memory. Kernel messages are parsed, artifacts decoded,
// hashed and written, and the work dir compared on the cell's strand, never on the kernel's I/O
// thread.
//
// Thread-safety: every method may be called from any thread; the blocking ones (*_and_wait)
// never from the loop's threads (they wait for the loop). on_event and done are called on the
// cell's strand, one at a time; they must not block. The registry, artifact store, audit log and
// loop must outlive the executor and the offload work it queued; cells still on their way when
// the executor goes answer "aborted" on their strands.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/execute/cell_result.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/loop.hpp"
#include "cellgate/util/metrics.hpp"

namespace cellgate::store {
class ArtifactStore;
class AuditLog;
}  // namespace cellgate::store

namespace cellgate::execute {

struct ExecuteRequest {
  std::string code;
  double timeout_seconds = 30;
  std::vector<std::string> stdin_lines;  // answers to input(), in order; none: input() raises
  bool store_history = true;
  // Run silently (no outputs, no history) just before and after the cell, within its timeout:
  // the E2B endpoint sets and restores per-call environment variables this way.
  std::string setup_code;
  std::string teardown_code;

  static Result<ExecuteRequest> from_json(const nlohmann::json& body, double max_timeout);
};

// POST /api/execute: a fresh kernel, files placed in its work dir, one cell, torn down.
struct OneShotRequest {
  ExecuteRequest cell;
  std::string kernel_name;                   // "" : the default kernelspec
  std::map<std::string, std::string> files;  // work-dir path → bytes

  static Result<OneShotRequest> from_json(const nlohmann::json& body, double max_timeout,
                                          std::size_t max_file_bytes);
};

struct ExecuteLimits {
  std::size_t stream_bytes = 1u << 20;         // stdout and stderr, each
  std::size_t output_bytes = 8u << 20;         // one display_data / execute_result
  std::size_t outputs = 1000;                  // outputs kept
  std::size_t total_output_bytes = 64u << 20;  // every output kept, together (1000 x 8 MiB is
                                               // 8 GiB otherwise)
  std::chrono::milliseconds grace{5000};       // after the interrupt, before a restart (Cell: up
                                               // to 3 more while the kernel uses CPU)
};

struct RunOptions {
  std::function<void(const nlohmann::json& event)> on_event;  // must not block
  std::chrono::milliseconds keepalive{0};                     // 0: no keepalive events
  std::string client;                                         // who asked, for the audit log
};

using Answer = Result<CellResult>;
using Done = std::function<void(Answer)>;

// A cell on its way; cancel() stops it as a timeout would (the client left), and the answer
// says "aborted": a queued cell does not run, a running one is interrupted (then its kernel
// restarted after the grace period if it does not stop). A cancel after the cell ended does
// nothing.
class CellHandle {
 public:
  virtual ~CellHandle() = default;
  virtual void cancel() = 0;
};

// What the executor's cells came to (GET /metrics): agent and one-shot cells, not silent set-up.
struct CellStats {
  util::LabeledCounter by_status;  // ok, error, timeout, aborted, dead
  util::Histogram duration_seconds{
      {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}};
  util::Counter dropped_output_bytes;  // over the cell's stream and output caps
};

class Executor {
 public:
  // Nothing starts here. `offload` runs blocking work (kernel starts, restarts and shutdowns).
  Executor(kernels::KernelRegistry& registry, store::ArtifactStore& artifacts,
           store::AuditLog& audit, ExecuteLimits limits, util::Loop& loop, util::Offload offload);
  ~Executor();

  std::shared_ptr<CellHandle> run(const std::string& kernel_id, ExecuteRequest request,
                                  RunOptions options, Done done);
  // A fresh kernel (started on the offload pool), files put in its work dir, one cell, the kernel
  // shut down; the answer has its kernel_id too.
  std::shared_ptr<CellHandle> run_once(OneShotRequest request, RunOptions options, Done done);
  // Code with no outputs and no history (set-up such as os.chdir), in the kernel's FIFO like a
  // cell; an error if it raised (setup_failed) or ran past `timeout` (then it is interrupted).
  // No audit line.
  void run_silently(const std::string& kernel_id, std::string code,
                    std::chrono::milliseconds timeout, std::function<void(Result<void>)> done);

  // Blocking forms of the above, for callers on the offload pool or a CLI thread (never a
  // network thread or the loop's). `cancelled` is looked at every 50 ms; once true, the cell is
  // cancelled.
  Answer run_and_wait(const std::string& kernel_id, ExecuteRequest request, RunOptions options,
                      const std::shared_ptr<std::atomic<bool>>& cancelled = nullptr);
  Result<void> run_silently_and_wait(const std::string& kernel_id, std::string code,
                                     std::chrono::milliseconds timeout);

  store::ArtifactStore& artifacts() { return artifacts_; }
  const CellStats& stats() const;
  const ExecuteLimits& limits() const { return limits_; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  store::ArtifactStore& artifacts_;
  ExecuteLimits limits_;
};

// The line of the cell an IPython traceback points at ("----> 3 ..." or "Cell In[4], line 3"), 0
// if none. The kernel chooses the text (IPython takes it from an exception's
// _render_traceback_()): scanned by hand in one pass, any length, no regex.
int failing_line(const std::vector<std::string>& traceback);

}  // namespace cellgate::execute
