// CellResult's JSON (execute/cell_result.hpp): the agent API's answer byte for byte, read back
// by from_json as the remote clients read a gateway's answer, and hostile answers read without
// throwing. No kernels, no root, no Python.
#include "cellgate/execute/cell_result.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace cellgate::execute {
namespace {

using nlohmann::json;
namespace files = store::files;

CellResult full_result() {
  CellResult r;
  r.status = CellStatus::kError;
  r.message = "";
  r.execution_count = 4;
  r.stdout_text = "a\n";
  r.stderr_text = "w\n";
  r.outputs = json::array({{{"output_type", "stream"}, {"name", "stdout"}, {"text", "a\n"}}});
  r.result = json{{"text/plain", "42"}};
  r.error = CellError{"KeyError", "'k'", {"Traceback", "KeyError: 'k'"}, 3};
  r.artifacts = json::array({{{"sha256", "abc"}, {"mime_type", "image/png"}}});
  r.charts = json::array({{{"type", "line"}}});
  r.data = json::array({{{"x", {1, 2}}}});
  r.files = {files::Change{files::ChangeKind::kCreated, "out.csv", files::FileType::kFile, 12},
             files::Change{files::ChangeKind::kDeleted, "old", files::FileType::kSymlink, 0}};
  r.notices = {"stdout is over the per-cell limit"};
  r.truncated = {.stdout_cut = true, .stderr_cut = false, .outputs_cut = true, .dropped_bytes = 77};
  r.state_lost = false;
  r.metrics = {
      .wall_ms = 15, .cpu_ms = 9, .memory_peak_bytes = 1000, .memory_current_bytes = std::nullopt};
  return r;
}

// The bytes the agent API sent before CellResult existed, for the same cell (nlohmann::json
// orders keys by name).
TEST(CellResultJson, TheAgentApisAnswerByteForByte) {
  EXPECT_EQ(full_result().to_json().dump(),
            R"({"artifacts":[{"mime_type":"image/png","sha256":"abc"}],"charts":[{"type":"line"}],)"
            R"("data":[{"x":[1,2]}],"error":{"ename":"KeyError","evalue":"'k'","line":3,)"
            R"("traceback":["Traceback","KeyError: 'k'"]},"execution_count":4,)"
            R"("files":[{"change":"created","path":"out.csv","size":12,"type":"file"},)"
            R"({"change":"deleted","path":"old","size":0,"type":"symlink"}],)"
            R"("metrics":{"cpu_ms":9,"memory_current_bytes":null,"memory_peak_bytes":1000,)"
            R"("wall_ms":15},"notices":["stdout is over the per-cell limit"],)"
            R"("outputs":[{"name":"stdout","output_type":"stream","text":"a\n"}],)"
            R"("result":{"text/plain":"42"},"state_lost":false,"status":"error","stderr":"w\n",)"
            R"("stdout":"a\n","truncated":{"dropped_bytes":77,"outputs":true,"stderr":false,)"
            R"("stdout":true}})");

  // A cell that never ran ("timeout" in the queue): nulls where nothing is known, a message,
  // and a one-shot run's kernel id.
  CellResult unrun;
  unrun.status = CellStatus::kTimeout;
  unrun.message = "the kernel was busy";
  unrun.kernel_id = "k1";
  EXPECT_EQ(unrun.to_json().dump(),
            R"({"artifacts":[],"charts":[],"data":[],"error":null,"execution_count":null,)"
            R"("files":[],"kernel_id":"k1","message":"the kernel was busy",)"
            R"("metrics":{"cpu_ms":null,"memory_current_bytes":null,"memory_peak_bytes":null,)"
            R"("wall_ms":0},"notices":[],"outputs":[],"result":null,"state_lost":false,)"
            R"("status":"timeout","stderr":"","stdout":"",)"
            R"("truncated":{"dropped_bytes":0,"outputs":false,"stderr":false,"stdout":false}})");
}

TEST(CellResultJson, ReadsBackAsItself) {
  CellResult other;
  other.status = CellStatus::kOther;
  other.other_status = "paused";
  other.state_lost = true;
  other.error = CellError{"E", "", {}, 0};
  for (const CellResult& r : {full_result(), CellResult{}, other}) {
    const json sent = r.to_json();
    auto back = CellResult::from_json(json::parse(sent.dump()));
    ASSERT_TRUE(back) << back.error().describe();
    EXPECT_EQ(back->to_json(), sent);
    EXPECT_EQ(back->status, r.status);
    EXPECT_EQ(back->status_name(), r.status_name());
  }
}

TEST(CellResultJson, StatusNames) {
  for (auto s : {CellStatus::kOk, CellStatus::kError, CellStatus::kTimeout, CellStatus::kAborted,
                 CellStatus::kDead}) {
    EXPECT_EQ(cell_status_of(to_string(s)), s);
  }
  EXPECT_STREQ(to_string(CellStatus::kOther), "");
  EXPECT_EQ(cell_status_of("weird"), CellStatus::kOther);
  EXPECT_EQ(cell_status_of(""), CellStatus::kOther);
  auto weird = CellResult::from_json(json{{"status", "weird"}});
  ASSERT_TRUE(weird);
  EXPECT_EQ(weird->status, CellStatus::kOther);
  EXPECT_EQ(weird->to_json()["status"], "weird");
}

TEST(CellResultJson, AnAnswerWithoutAStringStatusIsAnError) {
  for (const json& bad :
       {json(), json("ok"), json::array({"status", "ok"}), json::object(), json{{"status", 3}},
        json{{"status", nullptr}}, json{{"status", {{"nested", "ok"}}}}}) {
    auto r = CellResult::from_json(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
    EXPECT_EQ(r.error().reason, "bad_answer");
  }
}

// A remote gateway's answer may hold anything: every field of the wrong type reads as absent,
// numbers out of range as unknown, list entries of the wrong type are skipped. Nothing throws.
TEST(CellResultJson, HostileFieldsReadAsAbsent) {
  const json hostile = {
      {"status", "ok"},
      {"message", 1},
      {"execution_count", "7"},
      {"stdout", json::array()},
      {"stderr", 5},
      {"outputs", "not a list"},
      {"result", "text"},
      {"error",
       {{"ename", 1}, {"evalue", nullptr}, {"traceback", {1, "kept", nullptr}}, {"line", "3"}}},
      {"artifacts", {{"not", "a list"}}},
      {"charts", 3},
      {"data", nullptr},
      {"files",
       {{{"path", "a"}, {"change", "exploded"}, {"type", "file"}, {"size", 1}},
        {{"path", "b"}, {"change", "created"}, {"type", "pipe"}, {"size", 1}},
        {{"path", 3}, {"change", "created"}, {"type", "file"}},
        {{"path", "kept"}, {"change", "modified"}, {"type", "file"}, {"size", -5}},
        "not an object"}},
      {"notices", {"kept", 1, {{"message", "an object"}}}},
      {"truncated", {{"stdout", "yes"}, {"stderr", 1}, {"outputs", true}, {"dropped_bytes", -1}}},
      {"state_lost", "yes"},
      {"metrics", {{"wall_ms", 1.5}, {"cpu_ms", -1}, {"memory_peak_bytes", "1"}}},
      {"kernel_id", json::object()}};
  Result<CellResult> read = make_error(ErrorCode::kInternal, "", "");
  ASSERT_NO_THROW(read = CellResult::from_json(hostile));
  ASSERT_TRUE(read);
  const CellResult& r = *read;
  EXPECT_EQ(r.status, CellStatus::kOk);
  EXPECT_EQ(r.message, "");
  EXPECT_FALSE(r.execution_count);
  EXPECT_EQ(r.stdout_text, "");
  EXPECT_EQ(r.stderr_text, "");
  EXPECT_EQ(r.outputs, json::array());
  EXPECT_FALSE(r.result);
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->ename, "");
  EXPECT_EQ(r.error->traceback, std::vector<std::string>{"kept"});
  EXPECT_EQ(r.error->line, 0);
  EXPECT_EQ(r.artifacts, json::array());
  EXPECT_EQ(r.charts, json::array());
  EXPECT_EQ(r.data, json::array());
  ASSERT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.files[0].path, "kept");
  EXPECT_EQ(r.files[0].kind, files::ChangeKind::kModified);
  EXPECT_EQ(r.files[0].size, 0u);
  EXPECT_EQ(r.notices, std::vector<std::string>{"kept"});
  EXPECT_FALSE(r.truncated.stdout_cut);
  EXPECT_FALSE(r.truncated.stderr_cut);
  EXPECT_TRUE(r.truncated.outputs_cut);
  EXPECT_EQ(r.truncated.dropped_bytes, 0u);
  EXPECT_FALSE(r.state_lost);
  EXPECT_EQ(r.metrics.wall_ms, 0);
  EXPECT_FALSE(r.metrics.cpu_ms);
  EXPECT_FALSE(r.metrics.memory_peak_bytes);
  EXPECT_EQ(r.kernel_id, "");
  // What it read renders as a well-formed answer.
  EXPECT_NO_THROW((void)r.to_json().dump());
}

TEST(CellResultJson, NumbersOutOfRangeAreUnknown) {
  const auto huge = std::numeric_limits<std::uint64_t>::max();
  auto r =
      CellResult::from_json(json{{"status", "error"},
                                 {"execution_count", huge},
                                 {"error", {{"ename", "E"}, {"line", std::int64_t{1} << 40}}},
                                 {"truncated", {{"dropped_bytes", huge}}},
                                 {"metrics", {{"wall_ms", huge}, {"memory_peak_bytes", huge}}}});
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->execution_count);
  EXPECT_EQ(r->error->line, 0);
  EXPECT_EQ(r->truncated.dropped_bytes, huge);  // what the gateway said it dropped
  EXPECT_EQ(r->metrics.wall_ms, 0);
  EXPECT_EQ(r->metrics.memory_peak_bytes, huge);
  auto negative = CellResult::from_json(
      json{{"status", "ok"}, {"execution_count", -3}, {"error", {{"line", -2}}}});
  ASSERT_TRUE(negative);
  EXPECT_EQ(negative->execution_count, -3);  // as the gateway said it; the API passes it on
  EXPECT_EQ(negative->error->line, 0);
}

// Big and deep answers (as deep as http::parse_json lets one through) are read and written
// without trouble; what is kept is what was sent.
TEST(CellResultJson, BigAndDeepAnswers) {
  json deep = "leaf";
  for (int i = 0; i < 250; ++i) {
    deep = json::array({deep});
  }
  json answer = {
      {"status", "ok"},
      {"stdout", std::string(8u << 20, 'x')},
      {"outputs",
       json::array({{{"output_type", "display_data"}, {"data", {{"application/json", deep}}}}})},
      {"notices", json(std::vector<std::string>(100000, "n"))}};
  auto r = CellResult::from_json(answer);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stdout_text.size(), 8u << 20);
  EXPECT_EQ(r->notices.size(), 100000u);
  EXPECT_EQ(r->outputs[0]["data"]["application/json"], deep);
  const json back = r->to_json();
  EXPECT_EQ(back["outputs"], answer["outputs"]);
}

}  // namespace
}  // namespace cellgate::execute
