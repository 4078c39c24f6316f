// The E2B code-interpreter protocol, as pure translations: request bodies in, NDJSON lines out.
//
// Agents written for E2B's `@e2b/code-interpreter` SDK (E2B_DEBUG=true: http://localhost:49999)
// talk to cellgate's second listener. This file holds everything about that protocol that is not
// networking; docs/e2b.md says what the SDK sends and parses, with references into its source.
//
//   auto req = e2b::parse_run_code_request(body);            // Result<RunCodeRequest>
//   run silently: e2b::env_code(req->env_vars), then the cell, then e2b::env_restore_code(...)
//   e2b::Translator tr;
//   for (const json& event : executor_events) {
//     for (const json& line : tr.translate(event)) { write(e2b::ndjson_line(line)); }
//   }
//
// Every parse error is an InvalidArgument (HTTP 400). The SDK shows only "400 Bad Request" for
// it, but shows a 404's plain-text body, so answer errors as text/plain with Error::message.
//
// Thread-safety: pure functions; a Translator belongs to one execution.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/execute/cell_result.hpp"
#include "cellgate/result.hpp"

namespace cellgate::api::e2b {

// E2B's default language. Any language with an installed kernelspec runs (E2bApi picks the
// kernelspec by its "language"); the requests only normalize the name.
inline constexpr std::string_view kLanguage = "python";
// Where a context created without "cwd" starts, as on E2B. `cellgate serve` mounts each kernel's
// work dir there too (RegistryOptions::work_dir_aliases), so it is the work dir.
inline constexpr std::string_view kDefaultCwd = "/home/user";

// POST /execute: {"code", "context_id"?, "language"?, "env_vars"?}. The SDK sends at most one of
// context_id and language (JSON.stringify drops undefined ones).
struct RunCodeRequest {
  std::string code;
  std::optional<std::string> context_id;  // none: the default python context
  std::string language = std::string(kLanguage);
  std::map<std::string, std::string> env_vars;  // for this execution only
};

// Errors: "bad_json" (not a JSON object), "bad_code" (code missing or not a string),
// "bad_context_id", "unsupported_language" (not a string), "context_and_language" (both given,
// as E2B's server refuses), "bad_env_vars" (not an object of strings, or a name os.environ
// refuses: empty, '=' or NUL; a value with NUL). The language is normalized as E2B does:
// lower-cased and trimmed, "js" → "javascript", "ts" → "typescript", absent → "python".
Result<RunCodeRequest> parse_run_code_request(std::string_view body);

// POST /contexts: {"language"?, "cwd"?}; an empty body is {}.
struct CreateContextRequest {
  std::string language = std::string(kLanguage);
  std::string cwd = std::string(kDefaultCwd);
};

// Errors: "bad_json", "unsupported_language" (not a string), "bad_cwd" (not a string, not
// absolute, or NUL).
Result<CreateContextRequest> parse_create_context_request(std::string_view body);

// The context model of POST /contexts and of each element of GET /contexts.
nlohmann::json context_model(const std::string& id, const std::string& language,
                             const std::string& cwd);

// The token a request carries: X-Access-Token, else "Authorization: token <t>" (or "Bearer
// <t>"). Empty when neither is there. The SDK in debug mode sends neither (docs/e2b.md §2).
std::string request_token(std::string_view x_access_token, std::string_view authorization);

// Python, run silently before the cell: remembers the current values of vars' names and sets
// them in os.environ. Values travel as JSON inside a JSON string (json.loads), so any text,
// quotes, backslashes, newlines and non-ASCII included, arrives exactly. Empty vars: "".
std::string env_code(const std::map<std::string, std::string>& vars);
// Python, run silently after the cell: puts back what env_code remembered (a name that was unset
// is unset again). If that record is gone (the kernel restarted), unsets vars' names, as E2B does.
std::string env_restore_code(const std::map<std::string, std::string>& vars);
// Code run silently when a context starts (and after each restart), in the context's language:
// makes `cwd` if it is missing (mkdir -p) and changes to it; for python also turns on
// Image.save() displaying the image, as E2B's sandboxes do (the kernel's display formatters,
// gateway/kernels/python/cellgate_display.py). nullopt for a language whose syntax cellgate does
// not know (python and r are known): the context then starts in its kernel's work dir.
std::optional<std::string> context_setup_code(const std::string& language, const std::string& cwd);

// Maps cellgate's execution events to E2B NDJSON objects, one execution at a time:
//   stream           → {"type":"stdout"|"stderr","text"}
//   execute_result   → {"type":"result","is_main_result":true, text/html/markdown/svg/png/jpeg/
//   display_data,      pdf/latex/json/javascript/data/chart, "extra":{other mime types}}; chart
//                      and data come from cellgate's display formatters (application/vnd.
//                      cellgate.chart+json, …data+json) or E2B's own e2b/chart, e2b/data
//   update_display_data  (is_main_result false); text/plain loses one pair of enclosing quotes,
//                        as E2B's server does ('abc' → abc)
//   error            → {"type":"error","name","value","traceback": lines joined with "\n"}
//   notice           → {"type":"stderr","text":"[cellgate] <message>\n"}
//   keepalive        → {"type":"keepalive"}
//   clear_output, unknown types → nothing
//   end              → an error line for status timeout (TimeoutError), dead (DeadKernelError),
//                      aborted (ExecutionAborted), or error when no error line was sent yet (from
//                      answer.error); then {"type":"number_of_executions","execution_count"} if
//                      the count is known; then {"type":"end_of_execution"}.
class Translator {
 public:
  std::vector<nlohmann::json> translate(const nlohmann::json& event);
  // The lines of the cell's end, from its answer ("end" events come here through
  // CellResult::from_json).
  std::vector<nlohmann::json> end(const execute::CellResult& answer);

 private:
  bool error_sent_ = false;
};

// One event on its own, as a fresh Translator sees it.
std::vector<nlohmann::json> translate(const nlohmann::json& event);

// One NDJSON line: the object as ASCII-only JSON plus "\n". ASCII because the SDK decodes each
// network chunk with a fresh TextDecoder, which garbles a UTF-8 character split across chunks.
std::string ndjson_line(const nlohmann::json& object);

}  // namespace cellgate::api::e2b
