// Running one cell for an agent: POST /api/kernels/{id}/execute.
//
//   {"code": "...", "timeout": 30, "stdin": ["line", ...], "store_history": true}
//   → {"status": "ok"|"error"|"timeout"|"aborted"|"dead", "execution_count", "stdout", "stderr",
//      "outputs": [nbformat outputs], "result": {mime bundle}|null,
//      "error": {"ename", "evalue", "traceback": [ANSI stripped], "line"}|null,
//      "truncated": {"stdout", "stderr", "outputs", "dropped_bytes"}, "state_lost", "metrics"}
//
// The timeout holds on the server: at the deadline the cell is interrupted; if the kernel is not
// idle within the grace period it is restarted and the answer says state_lost: true. Output is
// capped per stream and per output while it arrives, so a cell that prints without end costs
// the gateway a bounded amount of memory.
//
// Thread-safety: execute_cell() blocks; call it from the blocking pool, never a network thread.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/server/kernel_manager.hpp"

namespace cellgate::server {

struct ExecuteRequest {
  std::string code;
  double timeout_seconds = 30;
  std::vector<std::string> stdin_lines;  // answers to input(), in order; none: input() raises
  bool store_history = true;

  static Result<ExecuteRequest> from_json(const nlohmann::json& body, double max_timeout);
};

struct ExecuteLimits {
  std::size_t stream_bytes = 1u << 20;   // stdout and stderr, each
  std::size_t output_bytes = 8u << 20;   // one display_data / execute_result
  std::size_t outputs = 1000;            // outputs kept
  std::chrono::milliseconds grace{5000}; // after the interrupt, before a restart
};

Result<nlohmann::json> execute_cell(KernelManager& manager, const std::string& kernel_id,
                                    const ExecuteRequest& request, const ExecuteLimits& limits);

// The line of the cell an IPython traceback points at ("----> 3 ..." or "line 3"), 0 if none.
int failing_line(const std::vector<std::string>& traceback);

}  // namespace cellgate::server
