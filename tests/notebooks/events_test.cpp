// A cell's events kept within bounds until it ends (notebooks/src/events.hpp): what is kept, that
// the outputs made from it are the ones all the events would make, and what is said when
// something is cut. A remote gateway's NDJSON answer is read by the client seam
// (tests/unit/client_test.cpp).
#include "events.hpp"

#include <gtest/gtest.h>

#include <string>

#include "outputs.hpp"

namespace cellgate::notebooks {
namespace {

using nlohmann::json;

json display(const std::string& type, json data, const std::string& id = "") {
  json e = {{"type", type}, {"data", std::move(data)}, {"metadata", json::object()}};
  if (!id.empty()) {
    e["display_id"] = id;
  }
  return e;
}

json stream(const std::string& text, const std::string& name = "stdout") {
  return {{"type", "stream"}, {"name", name}, {"text", text}};
}

json clear(bool wait) {
  return {{"type", "clear_output"}, {"wait", wait}};
}

// cells[0] (shows "id1" and "id2") and cells[1], whose outputs are made from `events`.
json cells_after(const json& events, std::vector<std::string>* notices = nullptr) {
  json cells = json::array({{{"cell_type", "code"}, {"outputs", json::array()}},
                            {{"cell_type", "code"}, {"outputs", json::array()}}});
  NotebookOutputs outputs(cells);
  outputs.apply(0, json::array({display("display_data", {{"text/plain", "first"}}, "id1"),
                                display("display_data", {{"text/plain", "first"}}, "id2")}));
  auto said = outputs.apply(1, events);
  if (notices != nullptr) {
    *notices = said;
  }
  return cells;
}

json kept(const json& events) {
  CellEvents cell;
  for (const auto& e : events) {
    cell.add(e);
  }
  EXPECT_TRUE(cell.notices().empty());
  return cell.take();
}

// Issue 24: a cell that calls update_display_data 10,000 times with 1 MB each kept every event
// until it ended (10 GB). An update only replaces data and metadata, so it folds into the event
// that shows its display: one event, ~1 MB, is kept, and the outputs are the same.
TEST(CellEvents, UpdatesOfOneDisplayFoldIntoOneEvent) {
  CellEvents events;
  events.add(display("display_data", {{"text/plain", "start"}}, "bar"));
  // 1,000 updates of 1 MB: a gigabyte kept whole if updates did not fold (10,000 took 90 s
  // under ASan for no more proof).
  const std::size_t mb = 1000000;
  constexpr int kUpdates = 1000;
  for (int i = 0; i < kUpdates; ++i) {
    events.add(display("update_display_data",
                       {{"text/plain", std::string(mb, static_cast<char>('a' + i % 26))}}, "bar"));
  }
  EXPECT_EQ(events.size(), 1u);
  EXPECT_GT(events.bytes(), mb);
  EXPECT_LT(events.bytes(), mb + 4096);
  EXPECT_TRUE(events.notices().empty());
  json cells = json::array({{{"outputs", json::array()}}});
  NotebookOutputs(cells).apply(0, events.take());
  ASSERT_EQ(cells[0]["outputs"].size(), 1u);
  EXPECT_EQ(cells[0]["outputs"][0]["data"]["text/plain"],
            std::string(mb, static_cast<char>('a' + (kUpdates - 1) % 26)));
}

// An update of a display shown by an earlier cell is kept once, with its last data.
TEST(CellEvents, UpdatesOfAnEarlierCellsDisplayKeepTheLast) {
  json events = json::array();
  for (int i = 0; i < 1000; ++i) {
    events.push_back(display("update_display_data", {{"text/plain", std::to_string(i)}}, "id1"));
  }
  const json folded = kept(events);
  EXPECT_EQ(folded.size(), 1u);
  EXPECT_EQ(cells_after(folded), cells_after(events));
  EXPECT_EQ(cells_after(folded)[0]["outputs"][0]["data"]["text/plain"], "999");
}

// clear_output(wait=True) and a new frame, 10,000 times (an animation, a progress bar): the
// frames a clear removed are not kept.
TEST(CellEvents, AnAnimationLoopKeepsTheLastFrame) {
  CellEvents events;
  const std::string frame(100000, 'f');
  for (int i = 0; i < 10000; ++i) {
    events.add(clear(true));
    events.add(display("display_data", {{"image/png", frame + std::to_string(i)}}));
  }
  EXPECT_EQ(events.size(), 1u);
  EXPECT_LT(events.bytes(), frame.size() + 4096);
  json cells = json::array({{{"outputs", json::array()}}});
  NotebookOutputs(cells).apply(0, events.take());
  ASSERT_EQ(cells[0]["outputs"].size(), 1u);
  EXPECT_EQ(cells[0]["outputs"][0]["data"]["image/png"], frame + "9999");
}

// What is kept makes the outputs that all the events make: in this cell and in earlier cells'
// displays, across clears at once and clears that wait, with updates before and after them.
TEST(CellEvents, KeptEventsMakeTheSameOutputs) {
  const std::vector<json> sequences = {
      json::array({display("display_data", {{"text/plain", "A"}}, "id1"), stream("s"),
                   display("update_display_data", {{"text/plain", "B"}}, "id1")}),
      json::array({display("display_data", {{"text/plain", "A"}}, "id1"),
                   display("display_data", {{"text/plain", "C"}}, "id1"),
                   display("update_display_data", {{"text/plain", "B"}}, "id1")}),
      json::array({display("display_data", {{"text/plain", "A"}}, "id1"), clear(false),
                   display("update_display_data", {{"text/plain", "B"}}, "id1"), stream("x")}),
      json::array({display("display_data", {{"text/plain", "A"}}, "id2"), clear(true),
                   display("update_display_data", {{"text/plain", "B"}}, "id2")}),
      json::array({display("display_data", {{"text/plain", "A"}}, "id2"), clear(true),
                   stream("after"), display("update_display_data", {{"text/plain", "B"}}, "id2"),
                   stream("more"), stream("err", "stderr"), stream("again")}),
      json::array({display("execute_result", {{"text/plain", "A"}}, "id1"), clear(true),
                   clear(false), display("update_display_data", {{"text/plain", "B"}}, "id1"),
                   clear(true)}),
      json::array({stream("a"),
                   {{"type", "keepalive"}},
                   stream("b"),
                   {{"type", "notice"}},
                   display("update_display_data", {{"text/plain", "none"}}),
                   {{"type", "error"}, {"ename", "E"}, {"evalue", "v"}, {"traceback", {"t"}}}}),
  };
  for (const auto& events : sequences) {
    EXPECT_EQ(cells_after(kept(events)), cells_after(events)) << events.dump();
  }
}

// Past the byte budget events are dropped, and the cell ends with a stderr note; the run's
// warnings get the notice. An 8 MiB image shown 100 times keeps 7 (56 MiB of 64).
TEST(CellEvents, PastTheBudgetEventsAreDroppedWithANote) {
  CellEvents events;
  const json shown =
      display("display_data", {{"image/png", std::string(std::size_t{8} << 20, 'p')}}, "img");
  for (int i = 0; i < 100; ++i) {
    events.add(shown);
  }
  events.add(clear(true));
  EXPECT_EQ(events.size(), 7u + 1u);
  EXPECT_LE(events.bytes(), kMaxCellEventBytes);
  const std::string notice =
      "the cell's outputs are over the limit of 64 MiB per cell: 93 of "
      "its events (" +
      std::to_string(93 * json_size(shown).bytes) + " bytes) were dropped";
  EXPECT_EQ(events.notices(), std::vector<std::string>{notice});
  CellAnswer answer;
  answer.result.notices = {"from the gateway"};
  events.finish(answer);
  EXPECT_EQ(json(answer.result.notices), json::array({"from the gateway", notice}));
  // The clear_output(wait=True) no output followed does not wipe the outputs for the note.
  json cells = json::array({{{"outputs", json::array()}}});
  NotebookOutputs(cells).apply(0, *answer.events);
  const json& outputs = cells[0]["outputs"];
  ASSERT_EQ(outputs.size(), 8u);
  EXPECT_EQ(outputs[7], (json{{"output_type", "stream"},
                              {"name", "stderr"},
                              {"text", "[cellgate run: " + notice + "]\n"}}));
}

// An event nested deeper than kMaxEventDepth would make a notebook that parse() refuses: it is
// dropped and said.
TEST(CellEvents, TooDeepEventsAreDropped) {
  json value = json::array();
  for (std::size_t i = 0; i < kMaxEventDepth - 3; ++i) {  // the event and its data are 2 more
    value = json::array({std::move(value)});
  }
  CellEvents events;
  events.add(display("display_data", {{"application/json", value}}));
  events.add(display("display_data", {{"application/json", json::array({value})}}));
  EXPECT_EQ(events.size(), 1u);
  EXPECT_EQ(events.notices(), (std::vector<std::string>{
                                  "1 of the cell's outputs nest deeper than 252 levels and were "
                                  "dropped"}));
  EXPECT_EQ(json_size(display("display_data", {{"application/json", value}})).depth,
            kMaxEventDepth);
}

}  // namespace
}  // namespace cellgate::notebooks
