// Internal: MCP tool results (CallToolResult) from what the kernels answered — the executor's
// CellResult for run_code, a file's bytes for read_file, a message for the rest.
//
//   json r = run_code_result(answer, {.session = "default", .kernel_id = id, …}, "");
//   // {"content": [{"type":"text",…}, {"type":"image","mimeType":"image/png","data":…}],
//   //  "structuredContent": {"status", "execution_count", "error", "artifacts", …},
//   //  "isError": false}
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cellgate/execute/cell_result.hpp"

namespace cellgate::mcp {

struct RunInfo {
  std::string session;
  std::string kernel_id;
  std::string kernelspec;
  bool new_session = false;  // this call started the session's kernel
  std::string note;          // said first (e.g. why a new kernel replaced a culled one)
};

// Text in output order (stdout and stderr as printed, results' and displays' text/plain, the
// error with its traceback), every displayed PNG (and JPEG, GIF) as image content where it was
// shown, chart data as text, and the details in structuredContent. isError unless status "ok".
// `artifact_base` ("/api/artifacts/" or "") gives each artifact a url.
nlohmann::json run_code_result(const execute::CellResult& answer, const RunInfo& info,
                               const std::string& artifact_base);

// A result with one text item (isError as given) and optional structured content.
nlohmann::json text_result(const std::string& text, bool is_error,
                           nlohmann::json structured = nullptr);

// read_file: a PNG/JPEG/GIF as image content, valid UTF-8 as text, anything else as an
// embedded resource with a base64 blob.
nlohmann::json file_result(const std::string& path, const std::string& bytes,
                           nlohmann::json structured);

bool valid_utf8(std::string_view s);

}  // namespace cellgate::mcp
