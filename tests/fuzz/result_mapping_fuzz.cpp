// The chart and data mapping: an answer and its events as a REMOTE gateway sends them (cellgate
// exec/run/mcp --url read them off the network, so every field may be of any type or size) into
// MCP's tool result (mcp/src/content.cpp: text, images, charts, structuredContent) and E2B's
// NDJSON lines (api/src/e2b.cpp: results by MIME type, charts, data, errors).
//
// Input: NDJSON; each line that is JSON at most 264 levels deep (http::parse_json, as the
// remote clients read it) is an event for E2B's translator, and the last object line is also
// the answer for MCP (read by CellResult::from_json, as they read it). Invariants: every E2B
// line is an object with a string "type" and dumps as ASCII; a CellResult's JSON reads back;
// MCP's result has a non-empty content array of typed items, a structuredContent object and a
// boolean isError. Run with -max_len of a few MiB (the CTest entry does).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cellgate/api/e2b.hpp"
#include "cellgate/http/limits.hpp"
#include "content.hpp"  // gateway/mcp/src
#include "fuzz_util.hpp"

namespace {

using cellgate::fuzz::check;
using nlohmann::json;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  std::string_view data(reinterpret_cast<const char*>(bytes), size);
  cellgate::api::e2b::Translator e2b;
  json answer = json::object();
  while (!data.empty()) {
    const auto nl = data.find('\n');
    const std::string_view line = data.substr(0, nl);
    data.remove_prefix(nl == std::string_view::npos ? data.size() : nl + 1);
    json event = cellgate::http::parse_json(line, cellgate::http::kMaxKernelJsonDepth);
    if (event.is_discarded()) {
      continue;
    }
    for (const json& out : e2b.translate(event)) {
      check(out.is_object() && out.contains("type") && out["type"].is_string(),
            "an E2B line without a string type", out.dump().substr(0, 500));
      const std::string text = cellgate::api::e2b::ndjson_line(out);
      for (char c : text) {
        check(static_cast<unsigned char>(c) < 0x80, "an E2B line that is not ASCII");
      }
    }
    if (event.is_object()) {
      answer = std::move(event);
    }
  }
  // The remote clients read the answer with CellResult::from_json: one without a status is an
  // error there, and nothing is shown.
  auto result = cellgate::execute::CellResult::from_json(answer);
  if (!result) {
    return 0;
  }
  check(cellgate::execute::CellResult::from_json(result->to_json()).ok(),
        "an answer from_json read does not read back");
  const json r = cellgate::mcp::run_code_result(*result, {.session = "s", .kernel_id = "k"}, "/a/");
  check(r.contains("content") && r["content"].is_array() && !r["content"].empty(),
        "MCP content is empty", r.dump().substr(0, 500));
  for (const json& item : r["content"]) {
    check(item.is_object() && item.contains("type") && item["type"].is_string(),
          "an MCP content item without a type", item.dump().substr(0, 500));
  }
  check(r["structuredContent"].is_object(), "no structuredContent");
  check(r["isError"].is_boolean(), "isError is not a boolean");
  return 0;
}
