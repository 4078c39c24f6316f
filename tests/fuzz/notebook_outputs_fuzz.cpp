// A notebook's outputs from a remote gateway's streamed answers (gateway/client/src/ndjson.cpp,
// notebooks/src/events.cpp, outputs.cpp): the input is up to kCells cells' NDJSON bodies, separated
// by two NUL bytes, each read as `cellgate run --url` reads POST /api/kernels/{id}/execute (fed in
// pieces, depth-checked lines, the events kept by CellEvents with a small budget so that cuts
// happen) and applied to a notebook of kCells code cells and a markdown cell, cell after cell
// (displays of earlier cells are updated by later ones). Invariants:
//   - every body gives an answer (an end line is appended), and no more than the budget is kept;
//   - when nothing was cut, the outputs made from the kept events are the outputs made from all
//     the events as they came (folding updates, dropping what a clear removed and joining
//     streams change nothing), and apply() says the same;
//   - the notebook validates, each cell has at most kMaxOutputs outputs, each stream output at
//     most kMaxStreamBytes, and dump() → parse() gives it back unchanged (kept events are shallow
//     enough for the notebook to be read back).
// libFuzzer runs it with -max_len of 4 MiB (tests/fuzz/CMakeLists.txt): bigger than the budget.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/notebooks/notebook.hpp"
#include "events.hpp"
#include "fuzz_util.hpp"
#include "ndjson.hpp"  // gateway/client/src
#include "outputs.hpp"

namespace {

using cellgate::fuzz::check;
using nlohmann::json;
namespace nb = cellgate::notebooks;
namespace client = cellgate::client;

constexpr std::size_t kCells = 4;
constexpr std::size_t kLineBytes = std::size_t{1} << 20;     // a line over it is skipped
constexpr std::size_t kEventBytes = std::size_t{512} << 10;  // per cell, then events are dropped
const std::string kEnd = "\n{\"type\": \"end\", \"answer\": {\"status\": \"ok\"}}\n";

json notebook_of(std::size_t cells) {
  json list = json::array();
  for (std::size_t i = 0; i < cells; ++i) {
    list.push_back({{"cell_type", "code"},
                    {"execution_count", nullptr},
                    {"metadata", json::object()},
                    {"outputs", json::array()},
                    {"source", "cell " + std::to_string(i)}});
  }
  list.push_back({{"cell_type", "markdown"}, {"metadata", json::object()}, {"source", "# end"}});
  return {{"nbformat", 4}, {"nbformat_minor", 5}, {"metadata", json::object()}, {"cells", list}};
}

// The events of a body as they came: every line that parses to an object, but the end line.
json all_events(std::string_view body) {
  json events = json::array();
  while (!body.empty()) {
    const auto nl = body.find('\n');
    json event = client::parse_bounded(body.substr(0, nl));
    if (event.is_object() && !(event.contains("type") && event["type"] == "end")) {
      events.push_back(std::move(event));
    }
    body.remove_prefix(nl == std::string_view::npos ? body.size() : nl + 1);
  }
  return events;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> bodies = cellgate::fuzz::split_frames(input);
  if (bodies.size() > kCells) {
    bodies.resize(kCells);
  }
  json kept_nb = notebook_of(bodies.size());
  json all_nb = kept_nb;
  nb::NotebookOutputs kept_outputs(kept_nb["cells"]);
  nb::NotebookOutputs all_outputs(all_nb["cells"]);
  bool cut = false;

  for (std::size_t i = 0; i < bodies.size(); ++i) {
    const std::string body = std::string(bodies[i]) + kEnd;
    nb::CellEvents kept(kEventBytes);
    client::NdjsonAnswer lines([&kept](json event) { kept.add(std::move(event)); }, kLineBytes);
    // In three pieces, cut where the input says: lines and escapes split anywhere.
    const std::size_t a = size > 0 ? data[0] % (body.size() + 1) : 0;
    const std::size_t b = a + (size > 1 ? data[1] : 0) * 97 % (body.size() - a + 1);
    lines.feed(std::string_view(body).substr(0, a));
    lines.feed(std::string_view(body).substr(a, b - a));
    lines.feed(std::string_view(body).substr(b));
    check(kept.bytes() <= kEventBytes, "more than the budget was kept",
          std::to_string(kept.bytes()));
    auto result = lines.answer();
    check(result.ok(), "no answer although the body ends with one",
          result ? "" : result.error().describe());
    nb::CellAnswer answer{std::move(result).value(), std::nullopt};
    kept.finish(answer);
    const json& events = answer.events ? *answer.events : json::array();
    check(events.is_array(), "the answer's events are not a list");
    const auto kept_notices = kept_outputs.apply(i, events);
    cut = cut || !answer.result.notices.empty();
    if (!cut) {
      const auto all_notices = all_outputs.apply(i, all_events(body));
      check(kept_notices == all_notices, "apply() says other things",
            kept_notices.empty() ? "" : kept_notices[0]);
      check(kept_nb == all_nb, "the kept events make other outputs than all the events",
            body.substr(0, 2000));
    }
  }

  auto valid = nb::notebook::validate(kept_nb);
  check(valid.ok(), "the notebook does not validate", valid ? "" : valid.error().describe());
  for (const auto& cell : kept_nb["cells"]) {
    if (!cell.contains("outputs")) {
      continue;
    }
    check(cell["outputs"].size() <= nb::kMaxOutputs, "more outputs than kMaxOutputs");
    for (const auto& output : cell["outputs"]) {
      if (output["output_type"] == "stream") {
        check(output["text"].get_ref<const std::string&>().size() <= nb::kMaxStreamBytes,
              "a stream output over kMaxStreamBytes");
      }
    }
  }
  const std::string text = nb::notebook::dump(kept_nb);
  auto again = nb::notebook::parse(text);
  check(again.ok(), "dump() wrote a notebook parse() refuses",
        (again ? "" : again.error().describe()) + "\n" + text.substr(0, 2000));
  check(*again == kept_nb, "the notebook changed in dump() and parse()", text.substr(0, 2000));
  return 0;
}
