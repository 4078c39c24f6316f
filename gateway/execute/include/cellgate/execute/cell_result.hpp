// CellResult: what one agent cell came to, as a value — the executor's answer, which REST, E2B,
// MCP, `cellgate run` and `cellgate exec` render, and which the remote clients read back from a
// gateway's JSON. Its JSON (the agent API's answer, executor.hpp) is written in one place,
// to_json(), and read in one place, from_json().
//
//   CellResult r;                               // the executor fills it (cell.cpp, collector.cpp)
//   r.status = CellStatus::kError;
//   http::json_response(req, Status::ok, r.to_json());
//   CELLGATE_ASSIGN_OR_RETURN(CellResult back, CellResult::from_json(answer_from_a_gateway));
//
// from_json reads a gateway's answer as hostile input: it throws nothing, needs only an object
// with a string "status", and treats every other field of the wrong type as absent (as the front
// ends read the JSON before this type existed). Its depth is the caller's to bound before
// parsing (http::parse_json with kMaxKernelJsonDepth); what it keeps is no bigger than what it
// was given.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/store/files.hpp"

namespace cellgate::execute {

// How a cell ended. kOther keeps a status this build does not know as it was said (a kernel's
// execute_reply status outside the messaging spec's "ok" / "error" / "aborted", or a newer
// gateway's): the answer repeats it, and front ends say it is unknown.
enum class CellStatus { kOk, kError, kTimeout, kAborted, kDead, kOther };

// "ok", "error", "timeout", "aborted", "dead"; "" for kOther.
const char* to_string(CellStatus status);
// The status of `name`: kOther for any other text.
CellStatus cell_status_of(std::string_view name);

// The cell's exception (the kernel's iopub error, ANSI stripped and capped), or the one only the
// execute_reply names.
struct CellError {
  std::string ename;
  std::string evalue;
  std::vector<std::string> traceback;
  int line = 0;  // the cell's line the traceback points at (failing_line); 0: not known
};

// What was cut to keep the answer under ExecuteLimits.
struct Truncation {
  bool stdout_cut = false;
  bool stderr_cut = false;
  bool outputs_cut = false;
  std::uint64_t dropped_bytes = 0;
};

struct CellMetrics {
  std::int64_t wall_ms = 0;
  std::optional<std::uint64_t> cpu_ms;  // none when the cgroup does not say (or state was lost)
  std::optional<std::uint64_t> memory_peak_bytes;
  std::optional<std::uint64_t> memory_current_bytes;
};

struct CellResult {
  CellStatus status = CellStatus::kOk;
  std::string other_status;  // the status's text when kOther
  std::string message;       // why it ended so, for timeout/aborted/dead; "" : none
  std::optional<std::int64_t> execution_count;
  std::string stdout_text;
  std::string stderr_text;
  nlohmann::json outputs = nlohmann::json::array();  // nbformat outputs, in order
  std::optional<nlohmann::json> result;              // the execute_result's mime bundle
  std::optional<CellError> error;
  // Artifact records (store::ArtifactRecord::to_json; a figure's PNG with its "chart"), E2B
  // charts and DataFrames' columns ({column: [values]}), as the kernel's formatters made them.
  nlohmann::json artifacts = nlohmann::json::array();
  nlohmann::json charts = nlohmann::json::array();
  nlohmann::json data = nlohmann::json::array();
  std::vector<store::files::Change> files;  // work-dir changes (not directories)
  std::vector<std::string> notices;         // caps reached, messages dropped, …
  Truncation truncated;
  bool state_lost = false;  // the kernel was restarted (or died): variables are gone
  CellMetrics metrics;
  std::string kernel_id;  // a one-shot run's kernel; "" otherwise (then absent from the JSON)

  // "ok", …, or other_status.
  std::string status_name() const;
  bool ok() const { return status == CellStatus::kOk; }

  // The agent API's answer (executor.hpp): the same bytes, key for key, the routes have always
  // sent (nlohmann::json orders keys, so the order is the names').
  nlohmann::json to_json() const;
  // Parts of to_json(), for front ends that show some of the answer as the API does.
  nlohmann::json files_json() const;
  nlohmann::json truncated_json() const;
  nlohmann::json metrics_json() const;
  // Errors: kUnavailable "bad_answer" when `answer` is not an object with a string "status".
  static Result<CellResult> from_json(const nlohmann::json& answer);
};

}  // namespace cellgate::execute
