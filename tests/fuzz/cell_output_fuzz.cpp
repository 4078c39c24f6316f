// What a kernel's output becomes: one cell's iopub messages through the collector (caps,
// artifacts off, the traceback scan), its events through E2B's translator, and its answer
// through MCP's content builder (gateway/execute/src/collector.cpp, api/src/e2b.cpp,
// mcp/src/content.cpp). The kernel chooses every byte here: ename, evalue, traceback lines (IPython
// takes them from an exception's _render_traceback_()), MIME bundles, display ids.
//
// Input: messages separated by "\0\0" (fuzz_util.hpp). The first byte of the input picks the
// limits (tight or the defaults); the first byte of each message its type (execute_input, stream
// as a frame, stream as a DOM, execute_result, display_data, update_display_data, error,
// clear_output), the rest is its content frame, checked as an envelope checks it (valid JSON, an
// object, at most protocol::kMaxJsonDepth = 256 levels) before it is parsed. Invariants:
//   - stdout and stderr hold at most stream_bytes each; at most `outputs` outputs are kept;
//   - an error's ename holds at most 1 KiB, its evalue 64 KiB, its traceback about stream_bytes;
//   - every event is an object with a string "type", and every E2B line too;
//   - the answer dumps to JSON that parses back, and MCP's result has content.
// Run with -max_len of a few MiB (the CTest entry does): a megabyte traceback line is the case
// that crashed the gateway.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cellgate/api/e2b.hpp"
#include "cellgate/protocol/envelope.hpp"
#include "cellgate/protocol/message.hpp"
#include "collector.hpp"  // gateway/execute/src
#include "content.hpp"    // gateway/mcp/src
#include "fuzz_util.hpp"

namespace {

using cellgate::fuzz::check;
using nlohmann::json;

constexpr const char* kTypes[] = {"execute_input",  "stream",       "stream",
                                  "execute_result", "display_data", "update_display_data",
                                  "error",          "clear_output"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  std::string_view data(reinterpret_cast<const char*>(bytes), size);
  if (data.empty()) {
    return 0;
  }
  cellgate::execute::ExecuteLimits limits;
  if (data[0] & 1) {
    limits.stream_bytes = 4096;
    limits.output_bytes = 64u << 10;
    limits.outputs = 20;
    limits.total_output_bytes = 256u << 10;
  }
  data.remove_prefix(1);

  cellgate::api::e2b::Translator e2b;
  std::size_t events = 0;
  auto sink = [&](const json& event) {
    ++events;
    check(event.is_object() && event.contains("type") && event["type"].is_string(),
          "an event without a string type", event.dump().substr(0, 500));
    for (const json& line : e2b.translate(event)) {
      check(line.is_object() && line.contains("type"), "an E2B line without a type",
            line.dump().substr(0, 500));
      (void)cellgate::api::e2b::ndjson_line(line);
    }
  };
  cellgate::execute::Collector collector(limits, sink, nullptr, "fuzz-kernel");
  for (std::string_view message : cellgate::fuzz::split_frames(data)) {
    if (message.empty()) {
      continue;
    }
    const auto pick = static_cast<unsigned char>(message[0]) % std::size(kTypes);
    message.remove_prefix(1);
    if (!cellgate::protocol::is_valid_json(message)) {
      continue;  // an envelope with this frame is dropped before any cell sees it
    }
    if (pick == 1 && collector.on_stream_frame(message)) {
      continue;
    }
    const json content = json::parse(message, nullptr, /*allow_exceptions=*/false);
    collector.on_message(kTypes[pick], content);
  }

  cellgate::execute::CellResult result;
  result.status = collector.error() ? cellgate::execute::CellStatus::kError
                                    : cellgate::execute::CellStatus::kOk;
  collector.fields(result);
  const json answer = result.to_json();
  check(answer["stdout"].get_ref<const std::string&>().size() <= limits.stream_bytes,
        "stdout over its cap");
  check(answer["stderr"].get_ref<const std::string&>().size() <= limits.stream_bytes,
        "stderr over its cap");
  check(answer["outputs"].size() <= limits.outputs, "more outputs than the cap");
  if (const json& error = answer["error"]; error.is_object()) {
    check(error["ename"].get_ref<const std::string&>().size() <= 1024, "ename over 1 KiB");
    check(error["evalue"].get_ref<const std::string&>().size() <= (64u << 10),
          "evalue over 64 KiB");
    std::size_t traceback = 0;
    for (const json& line : error["traceback"]) {
      traceback += line.get_ref<const std::string&>().size();
    }
    check(traceback <= limits.stream_bytes + 64, "traceback over the stream cap",
          std::to_string(traceback));
  }
  const std::string text = cellgate::protocol::dump_json(answer);
  const json parsed = json::parse(text, nullptr, false);
  check(!parsed.is_discarded(), "the answer does not parse back", text.substr(0, 500));
  // What a remote client reads back is the answer the executor made.
  auto back = cellgate::execute::CellResult::from_json(parsed);
  check(back.ok() && back->to_json() == parsed, "the answer does not read back as itself",
        text.substr(0, 500));
  json end = {{"type", "end"}, {"answer", answer}};
  for (const json& line : e2b.translate(end)) {
    check(line.is_object(), "an E2B end line is not an object");
  }
  const json mcp =
      cellgate::mcp::run_code_result(result, {.session = "s", .kernel_id = "k"}, "/a/");
  check(mcp["content"].is_array() && !mcp["content"].empty(), "MCP content is empty",
        mcp.dump().substr(0, 500));
  (void)events;
  return 0;
}
