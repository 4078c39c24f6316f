// Running cells for agents: POST /api/kernels/{id}/execute, the one-shot POST /api/execute, and
// the E2B-compatible POST /execute all run through one Executor.
//
//   {"code": "...", "timeout": 30, "stdin": ["line", ...], "store_history": true}
//   → {"status": "ok"|"error"|"timeout"|"aborted"|"dead", "execution_count", "stdout", "stderr",
//      "outputs": [nbformat outputs], "result": {mime bundle}|null,
//      "error": {"ename", "evalue", "traceback": [ANSI stripped], "line"}|null,
//      "artifacts": [records], "files": [work-dir changes], "notices": [...],
//      "truncated": {"stdout", "stderr", "outputs", "dropped_bytes"}, "state_lost",
//      "metrics": {"wall_ms", "cpu_ms", "memory_peak_bytes", "memory_current_bytes"}}
//
// While the cell runs, RunOptions::on_event receives the same things as events, in order:
//   {"type":"stream","name":"stdout"|"stderr","text"}      (only what is kept under the caps)
//   {"type":"execute_result"|"display_data"|"update_display_data","data","metadata",
//    "execution_count"?, "artifacts"?: [records]}
//   {"type":"error","ename","evalue","traceback","line"?}
//   {"type":"clear_output","wait"}
//   {"type":"notice","message"}                               (a cap was reached)
//   {"type":"keepalive"}                                      (every RunOptions::keepalive)
//   {"type":"end","answer":{...the answer above...}}          (last)
//
// The timeout holds on the server: at the deadline the cell is interrupted; if the kernel is not
// idle within the grace period it is restarted and the answer says state_lost: true. A client
// that leaves (RunOptions::cancelled) gets the same treatment at once, so the kernel is free for
// the next call. Output is capped per stream and per output while it arrives, so a cell that
// prints without end costs the gateway a bounded amount of memory. Agent calls on one kernel run
// one at a time; a call that cannot start within its timeout answers "timeout" without running.
//
// Thread-safety: Executor's methods block; call them from the blocking pool, never a network
// thread. on_event is called from kernel I/O threads and the calling thread, one at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/server/kernel_manager.hpp"

namespace cellgate::server {

class ArtifactStore;
class AuditLog;

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
  std::string kernel_name;                    // "" : the default kernelspec
  std::map<std::string, std::string> files;   // work-dir path → bytes

  static Result<OneShotRequest> from_json(const nlohmann::json& body, double max_timeout,
                                          std::size_t max_file_bytes);
};

struct ExecuteLimits {
  std::size_t stream_bytes = 1u << 20;    // stdout and stderr, each
  std::size_t output_bytes = 8u << 20;    // one display_data / execute_result
  std::size_t outputs = 1000;             // outputs kept
  std::chrono::milliseconds grace{5000};  // after the interrupt, before a restart

  static ExecuteLimits from(const ServeOptions& options);
};

struct RunOptions {
  std::function<void(const nlohmann::json& event)> on_event;  // must not block
  std::shared_ptr<std::atomic<bool>> cancelled;              // set when the client left
  std::chrono::milliseconds keepalive{0};                    // 0: no keepalive events
  std::string client;                                         // who asked, for the audit log
};

class Executor {
 public:
  // Opens the artifact store and the audit log under the manager's state dir (as configured).
  static Result<std::unique_ptr<Executor>> create(KernelManager& manager);
  ~Executor();

  Result<nlohmann::json> run(const std::string& kernel_id, const ExecuteRequest& request,
                             const RunOptions& run = {});
  Result<nlohmann::json> run_once(const OneShotRequest& request, const RunOptions& run = {});
  // Runs code with no outputs and no history (set-up such as os.chdir); an error if it raised.
  Result<void> run_silently(const std::string& kernel_id, const std::string& code,
                            std::chrono::milliseconds timeout);

  ArtifactStore& artifacts() { return *artifacts_; }
  const ExecuteLimits& limits() const { return limits_; }

 private:
  Executor(KernelManager& manager, std::unique_ptr<ArtifactStore> artifacts,
           std::unique_ptr<AuditLog> audit);

  KernelManager& manager_;
  ExecuteLimits limits_;
  std::unique_ptr<ArtifactStore> artifacts_;
  std::unique_ptr<AuditLog> audit_;
};

// The line of the cell an IPython traceback points at ("----> 3 ..." or "line 3"), 0 if none.
int failing_line(const std::vector<std::string>& traceback);

}  // namespace cellgate::server
