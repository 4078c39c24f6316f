// The executor's cells against the fake kernel (tests/support), on a ManualLoop whose time the
// test moves: no root, no Python, no real timeouts. Blocking work (restarts, one-shot starts and
// shutdowns) runs inline on the thread that offloads it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "cellgate/execute/executor.hpp"
#include "cellgate/kernels/display_formatters.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/audit.hpp"
#include "cellgate/testing/fake_kernel.hpp"
#include "cellgate/util/loop.hpp"
#include "inbox.hpp"  // gateway/execute/src
#include "queue.hpp"

namespace cellgate::execute {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::FakeBackend;
using testing::FakeCell;

// A 1×1 PNG.
constexpr const char* kPng =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg"
    "==";

// What one cell gave back: its events in order and its answer.
struct Outcome {
  std::vector<json> events;
  std::optional<Answer> answer;
  int done_calls = 0;
  bool event_after_done = false;

  std::size_t count(const std::string& type) const {
    return static_cast<std::size_t>(std::count_if(
        events.begin(), events.end(), [&](const json& e) { return e["type"] == type; }));
  }
  // The answer's JSON, as the agent API sends it; made once, so references into it stay valid.
  const json& json_answer() const {
    if (!rendered) {
      rendered = answer->value().to_json();
    }
    return *rendered;
  }
  mutable std::optional<json> rendered;
};

class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (std::filesystem::temp_directory_path() / "cellgate-execute-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    state_dir_ = dir;
  }

  void TearDown() override {
    executor_.reset();
    if (registry_) {
      registry_->shutdown_all();
    }
    loop_.run_ready();
    registry_.reset();
    std::error_code ec;
    std::filesystem::remove_all(state_dir_, ec);
  }

  // Builds the registry and executor (after a test has set limits_) and starts one kernel.
  void start(ExecuteLimits limits = {}) {
    kernels::RegistryOptions options;
    options.state_dir = state_dir_;
    options.no_jail = true;
    options.kernel_start_timeout = 5;
    registry_ =
        std::make_unique<kernels::KernelRegistry>(options, fake_, [this] { return loop_.now(); });
    auto audit = store::AuditLog::create({.path = state_dir_ + "/audit.jsonl"});
    ASSERT_TRUE(audit.ok());
    audit_ = std::move(audit).value();
    artifacts_ = std::make_unique<store::ArtifactStore>(state_dir_ + "/artifacts");
    executor_ = std::make_unique<Executor>(*registry_, *artifacts_, *audit_, limits, loop_,
                                           [this](std::function<void()> fn) {
                                             ++offloaded_;
                                             fn();
                                           });
    auto model = registry_->start("python3", json::object());
    ASSERT_TRUE(model.ok()) << model.error().describe();
    id_ = model->id;
  }

  // What the fake kernel does with `code` (anything else: ok, no output).
  void respond(const std::string& code, FakeCell cell) {
    std::lock_guard lock(cells_mu_);
    cells_[code] = std::move(cell);
  }

  std::shared_ptr<Outcome> run(const std::string& code, double timeout = 30,
                               RunOptions options = {}, ExecuteRequest request = {},
                               std::shared_ptr<CellHandle>* handle = nullptr) {
    auto out = std::make_shared<Outcome>();
    request.code = code;
    request.timeout_seconds = timeout;
    options.on_event = [out](const json& event) {
      if (out->done_calls > 0) {
        out->event_after_done = true;
      }
      out->events.push_back(event);
    };
    auto h = executor_->run(id_, std::move(request), std::move(options), [out](Answer answer) {
      ++out->done_calls;
      out->answer = std::move(answer);
    });
    if (handle != nullptr) {
      *handle = h;
    }
    return out;
  }

  // Runs what the loop has (kernel messages arrive from the fake's thread) until `pred` holds.
  bool settle(const std::function<bool()>& pred) {
    return testing::eventually([&] {
      loop_.run_ready();
      return pred();
    });
  }
  bool answered(const std::shared_ptr<Outcome>& out) {
    return settle([&] { return out->answer.has_value(); });
  }
  std::shared_ptr<testing::FakeKernel> kernel(std::size_t i = 0) { return fake_.kernel(i); }
  bool running_in_kernel(std::size_t i = 0) {
    return settle([&] { return kernel(i) && kernel(i)->cell_running(); });
  }

  std::vector<json> audit_lines() {
    std::vector<json> lines;
    std::ifstream in(state_dir_ + "/audit.jsonl");
    for (std::string line; std::getline(in, line);) {
      lines.push_back(json::parse(line));
    }
    return lines;
  }

  std::string state_dir_;
  std::mutex cells_mu_;
  std::map<std::string, FakeCell> cells_;
  FakeBackend fake_{[this](const std::string& code) {
    std::lock_guard lock(cells_mu_);
    auto it = cells_.find(code);
    return it == cells_.end() ? FakeCell() : it->second;
  }};
  util::ManualLoop loop_;  // before the registry: connections post to its strands until they end
  std::unique_ptr<kernels::KernelRegistry> registry_;
  std::unique_ptr<store::ArtifactStore> artifacts_;
  std::unique_ptr<store::AuditLog> audit_;
  std::unique_ptr<Executor> executor_;
  int offloaded_ = 0;
  std::string id_;
};

TEST_F(ExecutorTest, OkCellWithStdoutAndResult) {
  start();
  respond("print('hi'); 1+1",
          FakeCell().out("hi\n").err("careful\n").result({{"text/plain", "2"}}));
  auto out = run("print('hi'); 1+1");
  ASSERT_TRUE(answered(out));
  ASSERT_TRUE(out->answer->ok()) << out->answer->error().describe();
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "ok");
  EXPECT_EQ(a["stdout"], "hi\n");
  EXPECT_EQ(a["stderr"], "careful\n");
  EXPECT_EQ(a["result"], json({{"text/plain", "2"}}));
  EXPECT_EQ(a["execution_count"], 1);
  EXPECT_EQ(a["state_lost"], false);
  EXPECT_FALSE(a.contains("message"));
  ASSERT_EQ(a["outputs"].size(), 3u) << a["outputs"];
  EXPECT_EQ(a["outputs"][0],
            json({{"output_type", "stream"}, {"name", "stdout"}, {"text", "hi\n"}}));
  EXPECT_EQ(a["outputs"][2]["output_type"], "execute_result");
  EXPECT_EQ(a["outputs"][2]["execution_count"], 1);
  EXPECT_TRUE(a["metrics"]["wall_ms"].is_number());
  EXPECT_TRUE(a["metrics"]["cpu_ms"].is_null());  // a fake kernel has no cgroup
  EXPECT_EQ(a["truncated"]["dropped_bytes"], 0);
  EXPECT_EQ(a["files"], json::array());
  // The events, in order, and none after the answer.
  ASSERT_EQ(out->events.size(), 3u);
  EXPECT_EQ(out->events[0], json({{"type", "stream"}, {"name", "stdout"}, {"text", "hi\n"}}));
  EXPECT_EQ(out->events[1]["name"], "stderr");
  EXPECT_EQ(out->events[2]["type"], "execute_result");
  EXPECT_EQ(out->done_calls, 1);
  // One audit line: hashes and figures, never the code.
  auto lines = audit_lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["kernel"], id_);
  EXPECT_EQ(lines[0]["status"], "ok");
  EXPECT_EQ(lines[0]["code_sha256"], store::sha256_hex("print('hi'); 1+1"));
  EXPECT_EQ(lines[0]["output_bytes"]["stdout"], 3);
  EXPECT_EQ(offloaded_, 0) << "an ordinary cell needs no blocking work";
}

TEST_F(ExecutorTest, ErrorHasNameValueStrippedTracebackAndLine) {
  start();
  respond("a = 1\nd = {}\nd['missing']",
          FakeCell().error("KeyError", "'missing'",
                           {"\x1b[0;31m----------------------------------------\x1b[0m",
                            "\x1b[0;31mKeyError\x1b[0m Traceback (most recent call last)\n"
                            "Cell \x1b[0;32mIn[1], line 3\x1b[0m\n"
                            "\x1b[0;32m----> 3\x1b[0m d['missing']",
                            "\x1b[0;31mKeyError\x1b[0m: 'missing'"}));
  auto out = run("a = 1\nd = {}\nd['missing']");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "error");
  EXPECT_EQ(a["error"]["ename"], "KeyError");
  EXPECT_EQ(a["error"]["evalue"], "'missing'");
  EXPECT_EQ(a["error"]["line"], 3);
  for (const auto& line : a["error"]["traceback"]) {
    EXPECT_EQ(line.get<std::string>().find('\x1b'), std::string::npos) << line;
  }
  EXPECT_EQ(a["outputs"].back()["output_type"], "error");
  EXPECT_EQ(out->count("error"), 1u);
  EXPECT_EQ(audit_lines().at(0)["error"], "KeyError");
  // The next call runs (stop_on_error is off).
  auto next = run("print(a)");
  ASSERT_TRUE(answered(next));
  EXPECT_EQ(next->json_answer()["status"], "ok");
}

TEST_F(ExecutorTest, StreamsAndOutputsAreCappedWithNotices) {
  ExecuteLimits limits;
  limits.stream_bytes = 10;
  limits.output_bytes = 64;
  limits.outputs = 3;
  start(limits);
  respond("flood", FakeCell()
                       .out("0123456789abcdef")
                       .out("more")
                       .display({{"text/plain", std::string(100, 'x')}})
                       .display({{"text/plain", "a"}})
                       .display({{"text/plain", "b"}})
                       .display({{"text/plain", "c"}}));
  auto out = run("flood");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "ok");
  EXPECT_EQ(a["stdout"], "0123456789");
  EXPECT_EQ(a["truncated"]["stdout"], true);
  EXPECT_EQ(a["truncated"]["stderr"], false);
  EXPECT_EQ(a["truncated"]["outputs"], true);
  ASSERT_EQ(a["outputs"].size(), 3u);
  EXPECT_NE(a["outputs"][1]["data"]["text/plain"].get<std::string>().find("dropped"),
            std::string::npos);
  // 6 + 4 stdout bytes, the 100-byte bundle (plus its mime), and the fourth output.
  EXPECT_GT(a["truncated"]["dropped_bytes"].get<std::size_t>(), 6u + 4u + 100u);
  ASSERT_EQ(a["notices"].size(), 3u) << a["notices"];  // stdout, output_bytes, outputs: once each
  EXPECT_EQ(out->count("notice"), 3u);
  EXPECT_EQ(out->count("stream"), 1u) << "only what is kept is sent on";
}

// IPython takes a traceback from the exception's _render_traceback_(): the cell chooses the
// text. libstdc++'s std::regex recursed once per character over these and overflowed the stack
// (the gateway died of SIGSEGV); the scan is one pass now, whatever the length.
TEST(FailingLine, MegabyteLinesOfEveryShapeTheScanMatches) {
  const std::size_t mib = 1u << 20;
  EXPECT_EQ(failing_line({std::string(mib, '-')}), 0);
  EXPECT_EQ(failing_line({std::string(mib, '-') + "> 3 x = 1"}), 3);
  EXPECT_EQ(failing_line({std::string(mib, '-') + ">" + std::string(mib, ' ') + "7"}), 7);
  EXPECT_EQ(failing_line({"Cell In [" + std::string(mib, '1') + "], line 3"}), 3);
  EXPECT_EQ(failing_line({"Cell In[4], line " + std::string(mib, '9')}), 0);  // over an int
  EXPECT_EQ(failing_line({"Cell In[4]," + std::string(mib, ' ') + "line 12"}), 12);
  std::string many;
  for (int i = 0; i < 100000; ++i) {
    many += "Cell In[";
  }
  EXPECT_EQ(failing_line({many}), 0);
  EXPECT_EQ(failing_line({many + "Cell In[2], line 5"}), 5);
  EXPECT_EQ(failing_line({std::string(mib, '>')}), 0);
  EXPECT_EQ(failing_line({std::string(mib, '\n')}), 0);
}

TEST(FailingLine, IPythonsShapes) {
  EXPECT_EQ(failing_line({"----> 3 x = d['k']"}), 3);
  EXPECT_EQ(
      failing_line({"KeyError  Traceback", "Cell In[4], line 2\n      1 d = {}\n----> 2 d['k']"}),
      2);
  EXPECT_EQ(failing_line({"Cell In  [], line\t9"}), 9);
  EXPECT_EQ(failing_line({"File <stdin>:1", "  x ----> 3"}), 0);  // an arrow only starts a line
  EXPECT_EQ(failing_line({"Cell In[4], line x", "--> 8"}), 8);
  EXPECT_EQ(failing_line({"Cell In[4],line 2"}), 2);
  EXPECT_EQ(failing_line({"Cell In[4], line2"}), 0);  // "line" and its number need a space
  EXPECT_EQ(failing_line({}), 0);
}

TEST_F(ExecutorTest, AHostileExceptionIsCutWithNotices) {
  start();
  const std::size_t mib = 1u << 20;
  std::vector<std::string> traceback = {std::string(mib, '-') + "> 3 x",
                                        "Cell In [" + std::string(mib, '1') + "], line 3"};
  for (int i = 0; i < 2000; ++i) {
    traceback.push_back(std::string(1000, 'x'));
  }
  respond("boom", FakeCell().error(std::string(mib, 'E'), std::string(3 * mib, 'v'), traceback));
  auto out = run("boom");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "error");
  EXPECT_EQ(a["error"]["ename"].get<std::string>().size(), 1024u);
  EXPECT_EQ(a["error"]["evalue"].get<std::string>().size(), 64u << 10);
  std::size_t kept = 0;
  for (const auto& line : a["error"]["traceback"]) {
    kept += line.get<std::string>().size();
  }
  EXPECT_LE(kept, (1u << 20) + 100);  // the stream cap, and the line that says what was cut
  EXPECT_NE(a["error"]["traceback"].back().get<std::string>().find("bytes of traceback cut"),
            std::string::npos);
  EXPECT_EQ(a["truncated"]["outputs"], true);
  std::string notices = a["notices"].dump();
  for (const char* said : {"exception's name", "exception's value", "traceback is over"}) {
    EXPECT_NE(notices.find(said), std::string::npos) << said << " in " << notices;
  }
  EXPECT_LE(audit_lines().at(0)["error"].get<std::string>().size(), 1024u);
}

TEST_F(ExecutorTest, ABundleOfFiftyThousandMimeTypesKeepsTheFirstFew) {
  start();
  json data = json::object();
  for (int i = 0; i < 50000; ++i) {
    data["application/x-t" + std::to_string(i)] = "v";
  }
  respond("mimes", FakeCell().display(data));
  auto out = run("mimes");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "ok");
  ASSERT_EQ(a["outputs"].size(), 1u);
  EXPECT_EQ(a["outputs"][0]["data"].size(), 128u);
  EXPECT_NE(a["notices"].dump().find("50000 MIME types"), std::string::npos) << a["notices"];
  EXPECT_EQ(a["truncated"]["outputs"], true);
}

TEST_F(ExecutorTest, AMegabyteDisplayIdIsNotTracked) {
  start();
  const std::string id(1u << 20, 'd');
  FakeCell cell;
  cell.iopub("display_data", {{"data", {{"text/plain", "x"}}},
                              {"metadata", json::object()},
                              {"transient", {{"display_id", id}}}});
  // A few updates are enough to show the id is not tracked; each carries the megabyte through the
  // fake transport's signing and parsing, as a real kernel's would.
  for (int i = 0; i < 20; ++i) {
    cell.iopub("update_display_data", {{"data", {{"text/plain", std::to_string(i)}}},
                                       {"metadata", json::object()},
                                       {"transient", {{"display_id", id}}}});
  }
  respond("ids", cell);
  auto out = run("ids");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  ASSERT_EQ(a["outputs"].size(), 1u);
  EXPECT_EQ(a["outputs"][0]["data"]["text/plain"], "x");
  EXPECT_NE(a["notices"].dump().find("display id of 1048576 bytes"), std::string::npos);
  for (const auto& e : out->events) {
    EXPECT_FALSE(e.contains("display_id")) << "an over-long id is not passed on";
  }
}

TEST_F(ExecutorTest, AllOutputsTogetherAreCapped) {
  ExecuteLimits limits;
  limits.total_output_bytes = 300;
  start(limits);
  const json bundle = {{"text/plain", std::string(100, 'y')}};
  respond("many",
          FakeCell()
              .iopub("display_data", {{"data", {{"text/plain", "small"}}},
                                      {"metadata", json::object()},
                                      {"transient", {{"display_id", "p"}}}})
              .display(bundle)
              .display(bundle)
              .display(bundle)
              // Growing the small display past the total is refused as well.
              .iopub("update_display_data", {{"data", {{"text/plain", std::string(200, 'z')}}},
                                             {"metadata", json::object()},
                                             {"transient", {{"display_id", "p"}}}}));
  auto out = run("many");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  ASSERT_EQ(a["outputs"].size(), 4u);
  EXPECT_EQ(a["outputs"][1]["data"]["text/plain"], std::string(100, 'y'));
  EXPECT_EQ(a["outputs"][2]["data"]["text/plain"], std::string(100, 'y'));
  EXPECT_NE(a["outputs"][3]["data"]["text/plain"].get<std::string>().find("dropped"),
            std::string::npos);
  EXPECT_NE(a["outputs"][0]["data"]["text/plain"].get<std::string>().find("dropped"),
            std::string::npos)
      << "the update over the total replaced the display with a note";
  EXPECT_NE(a["notices"].dump().find("for all outputs together"), std::string::npos);
}

TEST_F(ExecutorTest, UpdateDisplayDataChangesTheDisplayInPlace) {
  start();
  respond("progress", FakeCell()
                          .iopub("display_data", {{"data", {{"text/plain", "0%"}}},
                                                  {"metadata", json::object()},
                                                  {"transient", {{"display_id", "p"}}}})
                          .out("working\n")
                          .iopub("update_display_data", {{"data", {{"text/plain", "100%"}}},
                                                         {"metadata", json::object()},
                                                         {"transient", {{"display_id", "p"}}}}));
  auto out = run("progress");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  ASSERT_EQ(a["outputs"].size(), 2u) << a["outputs"];
  EXPECT_EQ(a["outputs"][0]["data"]["text/plain"], "100%");
  EXPECT_EQ(out->count("update_display_data"), 1u);
}

TEST_F(ExecutorTest, AHangingCellTimesOutIsInterruptedAndKeepsState) {
  ExecuteLimits limits;
  limits.grace = 2s;
  start(limits);
  respond("while True: pass", FakeCell().out("spinning\n").hang());
  auto out = run("while True: pass", /*timeout=*/1);
  ASSERT_TRUE(running_in_kernel());
  loop_.advance(999ms);
  EXPECT_FALSE(out->answer);
  EXPECT_TRUE(kernel()->signals().empty());
  loop_.advance(1ms);  // the deadline: SIGINT, through the registry
  ASSERT_TRUE(answered(out));
  EXPECT_EQ(kernel()->signals(), std::vector<int>{SIGINT});
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "timeout");
  EXPECT_EQ(a["state_lost"], false);
  EXPECT_EQ(a["message"],
            "the cell ran past its timeout and was interrupted; the kernel's state is kept");
  EXPECT_EQ(a["stdout"], "spinning\n");
  EXPECT_EQ(a["error"]["ename"], "KeyboardInterrupt");
  EXPECT_EQ(loop_.pending_timers(), 0u) << "no grace timer left behind";
  EXPECT_EQ(fake_.launches(), 1) << "no restart";
  auto next = run("print(kept)");
  ASSERT_TRUE(answered(next));
  EXPECT_EQ(next->json_answer()["status"], "ok");
}

TEST_F(ExecutorTest, ACellIgnoringSigintGetsItsKernelRestartedAfterTheGrace) {
  ExecuteLimits limits;
  limits.grace = 2s;
  start(limits);
  respond("stuck()", FakeCell().hang_ignoring_interrupts());
  auto out = run("stuck()", /*timeout=*/1);
  ASSERT_TRUE(running_in_kernel());
  loop_.advance(1s);
  ASSERT_TRUE(settle([&] { return kernel()->signals().size() == 1; }));
  loop_.advance(1999ms);
  loop_.run_ready();
  EXPECT_FALSE(out->answer) << "within the grace";
  EXPECT_EQ(fake_.launches(), 1);
  loop_.advance(1ms);
  ASSERT_TRUE(answered(out));
  EXPECT_EQ(fake_.launches(), 2) << "restarted";
  EXPECT_EQ(offloaded_, 1) << "the restart ran on the offload pool";
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "timeout");
  EXPECT_EQ(a["state_lost"], true);
  EXPECT_EQ(a["message"],
            "the cell ran past its timeout and did not stop when interrupted: the kernel was "
            "restarted and its state is lost");
  // The restarted kernel runs the next cell.
  auto next = run("1");
  ASSERT_TRUE(answered(next));
  EXPECT_EQ(next->json_answer()["status"], "ok");
  EXPECT_EQ(kernel(1)->executed(), std::vector<std::string>{"1"});
}

// A kernel that keeps using CPU after its interrupt may be handling it (IPython formats its
// first traceback in seconds on a slow host with a CPU cap): it gets another grace period; one
// that used none through a period is restarted then.
TEST_F(ExecutorTest, AKernelStillWorkingAfterItsInterruptGetsAnotherGracePeriod) {
  ExecuteLimits limits;
  limits.grace = 2s;
  start(limits);
  respond("stuck()", FakeCell().hang_ignoring_interrupts());
  kernel()->set_cpu_usage(10s);
  auto out = run("stuck()", /*timeout=*/1);
  ASSERT_TRUE(running_in_kernel());
  loop_.advance(1s);
  ASSERT_TRUE(settle([&] { return kernel()->signals().size() == 1; }));
  kernel()->set_cpu_usage(10s + 500ms);  // a quarter of the period on CPU
  loop_.advance(2s);
  loop_.run_ready();
  EXPECT_FALSE(out->answer) << "extended: the kernel was working";
  EXPECT_EQ(fake_.launches(), 1);
  kernel()->set_cpu_usage(10s + 500ms + 199ms);  // under a tenth of the period
  loop_.advance(2s);
  ASSERT_TRUE(answered(out));
  EXPECT_EQ(fake_.launches(), 2) << "restarted once it stopped working";
  EXPECT_EQ(out->json_answer()["state_lost"], true);
}

// The extensions are bounded: a kernel spinning in code that ignores SIGINT is restarted after
// four grace periods in all.
TEST_F(ExecutorTest, GraceExtensionsForABusyKernelAreBounded) {
  ExecuteLimits limits;
  limits.grace = 2s;
  start(limits);
  respond("spin()", FakeCell().hang_ignoring_interrupts());
  kernel()->set_cpu_usage(0s);
  auto out = run("spin()", /*timeout=*/1);
  ASSERT_TRUE(running_in_kernel());
  loop_.advance(1s);
  ASSERT_TRUE(settle([&] { return kernel()->signals().size() == 1; }));
  for (int period = 1; period <= 3; ++period) {
    kernel()->set_cpu_usage(std::chrono::seconds(2 * period));  // all of it on CPU
    loop_.advance(2s);
    loop_.run_ready();
    EXPECT_FALSE(out->answer) << "period " << period;
    EXPECT_EQ(fake_.launches(), 1) << "period " << period;
  }
  kernel()->set_cpu_usage(8s);
  loop_.advance(2s);
  ASSERT_TRUE(answered(out));
  EXPECT_EQ(fake_.launches(), 2) << "restarted after the fourth period";
  EXPECT_EQ(out->json_answer()["state_lost"], true);
}

// ipykernel publishes busy before it installs its SIGINT handler: a timeout that fires in
// between must not send the SIGINT the kernel drops (the cell would run past its grace and the
// kernel be restarted with its state lost: seen on a slow guest). It waits for execute_input.
TEST_F(ExecutorTest, ATimeoutBeforeTheKernelHandlesTheCellInterruptsOnceItDoes) {
  ExecuteLimits limits;
  limits.grace = 2s;
  start(limits);
  respond("x = 41", FakeCell());
  ASSERT_TRUE(answered(run("x = 41")));
  respond("sleep", FakeCell().hang());
  kernel()->hold_next_cell();
  auto out = run("sleep", /*timeout=*/1);
  ASSERT_TRUE(settle([&] { return kernel()->cell_held(); }));
  loop_.run_ready();  // the executor has the cell's busy
  loop_.advance(1s);  // the timeout
  loop_.run_ready();
  EXPECT_EQ(kernel()->interrupts(), 0) << "no SIGINT while the kernel ignores it";
  kernel()->release_cell();
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "timeout");
  EXPECT_EQ(a["state_lost"], false);
  EXPECT_EQ(a["error"]["ename"], "KeyboardInterrupt");
  EXPECT_EQ(a["execution_count"], 2);
  EXPECT_EQ(kernel()->signals(), std::vector<int>{SIGINT});
  EXPECT_EQ(fake_.launches(), 1) << "no restart";
  EXPECT_EQ(loop_.pending_timers(), 0u) << "no grace timer left behind";
}

TEST_F(ExecutorTest, CancelWhileRunningInterrupts) {
  start();
  respond("sleep", FakeCell().hang());
  std::shared_ptr<CellHandle> handle;
  auto out = run("sleep", 300, {}, {}, &handle);
  ASSERT_TRUE(running_in_kernel());
  handle->cancel();  // the client left
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "aborted");
  EXPECT_EQ(a["message"], "the client left; the cell was interrupted");
  EXPECT_EQ(a["state_lost"], false);
  EXPECT_EQ(kernel()->signals(), std::vector<int>{SIGINT});
  handle->cancel();  // twice, and after the answer: nothing
  loop_.run_ready();
  EXPECT_EQ(out->done_calls, 1);
}

TEST_F(ExecutorTest, CancelWhileQueuedAnswersAbortedWithoutRunning) {
  start();
  respond("first", FakeCell().hang());
  auto first = run("first", 300);
  ASSERT_TRUE(running_in_kernel());
  std::shared_ptr<CellHandle> handle;
  auto second = run("second", 300, {}, {}, &handle);
  loop_.run_ready();
  handle->cancel();
  ASSERT_TRUE(answered(second));
  const json& a = second->json_answer();
  EXPECT_EQ(a["status"], "aborted");
  EXPECT_EQ(a["message"], "the client left before the cell started; it did not run");
  EXPECT_TRUE(a["metrics"]["memory_peak_bytes"].is_null());
  EXPECT_FALSE(first->answer);
  loop_.advance(300s);
  ASSERT_TRUE(answered(first));
  EXPECT_EQ(kernel()->executed(), std::vector<std::string>{"first"});
}

TEST_F(ExecutorTest, CellsOnOneKernelRunOneAtATimeInArrivalOrder) {
  start();
  respond("one", FakeCell().out("1\n").sleep(50ms).out("1 again\n"));
  respond("two", FakeCell().out("2\n"));
  respond("three", FakeCell().out("3\n"));
  std::vector<std::string> order;
  auto one = run("one");
  auto two = run("two");
  auto three = run("three");
  // Only the first reaches the kernel while it runs.
  ASSERT_TRUE(running_in_kernel());
  EXPECT_EQ(kernel()->executed(), std::vector<std::string>{"one"});
  ASSERT_TRUE(settle([&] { return one->answer && two->answer && three->answer; }));
  EXPECT_EQ(kernel()->executed(), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(one->json_answer()["stdout"], "1\n1 again\n");
  EXPECT_EQ(two->json_answer()["stdout"], "2\n");
  EXPECT_EQ(two->json_answer()["execution_count"], 2);
  EXPECT_EQ(three->json_answer()["execution_count"], 3);
}

TEST_F(ExecutorTest, AQueuedCellWhoseDeadlinePassesAnswersTimeoutWithoutRunning) {
  start();
  respond("long", FakeCell().hang());
  auto first = run("long", 10);
  ASSERT_TRUE(running_in_kernel());
  auto second = run("short", 1);
  loop_.advance(1s);
  ASSERT_TRUE(answered(second));
  const json& a = second->json_answer();
  EXPECT_EQ(a["status"], "timeout");
  EXPECT_EQ(a["message"],
            "the kernel was busy with another agent call for the whole timeout; the cell did "
            "not run");
  EXPECT_EQ(a["state_lost"], false);
  EXPECT_FALSE(first->answer);
  EXPECT_EQ(kernel()->interrupts(), 0) << "the running cell is not disturbed";
  loop_.advance(9s);
  ASSERT_TRUE(answered(first));
  EXPECT_EQ(first->json_answer()["status"], "timeout");
  EXPECT_EQ(kernel()->executed(), std::vector<std::string>{"long"});
  EXPECT_EQ(audit_lines().size(), 2u);
}

TEST_F(ExecutorTest, KeepalivesWhileQueuedAndWhileRunning) {
  start();
  respond("long", FakeCell().hang());
  RunOptions with_keepalive;
  with_keepalive.keepalive = 1s;
  auto first = run("long", 10, with_keepalive);
  ASSERT_TRUE(running_in_kernel());
  auto second = run("next", 30, with_keepalive);
  loop_.run_ready();
  loop_.advance(3s);
  EXPECT_EQ(first->count("keepalive"), 3u);
  EXPECT_EQ(second->count("keepalive"), 3u) << "queued cells keep their clients' streams alive";
  loop_.advance(7s);  // the first times out; the second runs
  ASSERT_TRUE(answered(first));
  ASSERT_TRUE(answered(second));
  // 1 s … 10 s: at 10 s the deadline interrupts, and the cell is still stopping.
  EXPECT_EQ(first->count("keepalive"), 10u);
  EXPECT_FALSE(first->event_after_done);
  EXPECT_FALSE(second->event_after_done);
  EXPECT_EQ(loop_.pending_timers(), 0u) << "keepalive timers end with their cells";
}

TEST_F(ExecutorTest, InputIsAnsweredFromStdinLines) {
  start();
  auto ask = FakeCell().input("a? ", [](const std::string& a, FakeCell& rest) {
    rest.input("b? ", [a](const std::string& b, FakeCell& more) { more.out(a + b + "\n"); });
  });
  respond("a = input('a? '); b = input('b? '); print(a + b)", ask);
  ExecuteRequest request;
  request.stdin_lines = {"cell", "gate"};
  auto out = run("a = input('a? '); b = input('b? '); print(a + b)", 30, {}, request);
  ASSERT_TRUE(answered(out));
  EXPECT_EQ(out->json_answer()["status"], "ok") << out->json_answer();
  EXPECT_EQ(out->json_answer()["stdout"], "cellgate\n");
  // Without stdin lines input() is not allowed: the kernel raises rather than waits.
  respond("input()", FakeCell().input("x? "));
  auto none = run("input()");
  ASSERT_TRUE(answered(none));
  EXPECT_EQ(none->json_answer()["status"], "error");
  EXPECT_EQ(none->json_answer()["error"]["ename"], "StdinNotImplementedError");
}

TEST_F(ExecutorTest, DeletingTheKernelEndsItsRunningAndQueuedCells) {
  start();
  respond("long", FakeCell().hang());
  auto running = run("long", 300);
  ASSERT_TRUE(running_in_kernel());
  auto queued = run("next", 300);
  loop_.run_ready();
  ASSERT_TRUE(registry_->shutdown(id_).ok());
  ASSERT_TRUE(answered(running));
  ASSERT_TRUE(answered(queued));
  EXPECT_EQ(running->json_answer()["status"], "dead");
  EXPECT_EQ(running->json_answer()["state_lost"], true);
  EXPECT_EQ(running->json_answer()["message"], "the kernel died while running the cell");
  EXPECT_EQ(queued->json_answer()["status"], "dead");
  EXPECT_EQ(queued->json_answer()["message"],
            "the kernel was shut down before the cell started; it did not run");
  EXPECT_EQ(kernel()->executed(), std::vector<std::string>{"long"});
  EXPECT_EQ(loop_.pending_timers(), 0u);
}

TEST_F(ExecutorTest, AKernelThatDiesMidCellAnswersDead) {
  start();
  respond("boom", FakeCell().out("before\n").die("killed by the OOM killer"));
  auto out = run("boom");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "dead");
  EXPECT_EQ(a["state_lost"], true);
  EXPECT_EQ(a["stdout"], "before\n");
}

TEST_F(ExecutorTest, ChartsAndDataFromTheDisplayFormatters) {
  // The kernel's display formatters (kernels/display_formatters.hpp) add a figure's chart and a
  // DataFrame's columns to their bundles: the answer lists them, and a figure's PNG artifact
  // carries its chart; an update_display_data adds no second entry.
  start();
  const json chart = {{"type", "line"}, {"title", "t"}, {"elements", json::array()}};
  const json table = {{"a", {1, 2}}};
  respond("plot()",
          FakeCell()
              .display({{"image/png", kPng},
                        {"text/plain", "<Figure>"},
                        {std::string(kernels::kChartMime), chart}})
              .iopub("update_display_data", {{"data", {{std::string(kernels::kChartMime), chart}}},
                                             {"metadata", json::object()},
                                             {"transient", {{"display_id", "d"}}}})
              .result({{"text/html", "<table/>"},
                       {"text/plain", "a"},
                       {std::string(kernels::kDataMime), table}}));
  auto out = run("plot()");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  EXPECT_EQ(a["charts"], json::array({chart})) << a;
  EXPECT_EQ(a["data"], json::array({table})) << a;
  ASSERT_EQ(a["artifacts"].size(), 1u) << a;
  EXPECT_EQ(a["artifacts"][0]["chart"], chart);
  EXPECT_EQ(out->events[0]["artifacts"][0]["chart"], chart) << "streamed events carry it too";

  respond("print()", FakeCell().out("x\n"));
  auto plain = run("print()");
  ASSERT_TRUE(answered(plain));
  EXPECT_EQ(plain->json_answer()["charts"], json::array());
  EXPECT_EQ(plain->json_answer()["data"], json::array());
}

TEST_F(ExecutorTest, ArtifactsAreStoredFromDisplayData) {
  start();
  respond("plot()", FakeCell().display({{"image/png", kPng}, {"text/plain", "<Figure>"}}));
  auto out = run("plot()");
  ASSERT_TRUE(answered(out));
  const json& a = out->json_answer();
  ASSERT_EQ(a["artifacts"].size(), 1u) << a;
  const json& rec = a["artifacts"][0];
  EXPECT_EQ(rec["mime_type"], "image/png");
  EXPECT_EQ(rec["kernel_id"], id_);
  EXPECT_EQ(rec["execution_count"], 1);
  ASSERT_EQ(out->count("display_data"), 1u);
  EXPECT_EQ(out->events[0]["artifacts"][0]["sha256"], rec["sha256"]);
  EXPECT_EQ(a["outputs"][0]["data"]["image/png"], kPng) << "the output keeps its data";
  auto records = artifacts_->list(id_);
  ASSERT_EQ(records.size(), 1u);
  auto where = artifacts_->locate(rec["sha256"].get<std::string>());
  ASSERT_TRUE(where.ok());
  EXPECT_TRUE(std::filesystem::exists(where->first));
}

TEST_F(ExecutorTest, FilesACellWritesAreReported) {
  start();
  std::string work_dir;
  {
    auto k = registry_->find(id_);
    ASSERT_TRUE(k.ok());
    work_dir = (*k)->work_dir();
  }
  // The fake kernel's responder runs when the cell starts: the file appears during the cell.
  fake_.set_responder([work_dir](const std::string& code) {
    if (code == "write()") {
      std::ofstream(work_dir + "/out.csv") << "x\n1\n";
      std::filesystem::create_directories(work_dir + "/.cache");
      std::ofstream(work_dir + "/.cache/fontlist.json") << "{}";
    }
    return FakeCell();
  });
  auto out = run("write()");
  ASSERT_TRUE(answered(out));
  const json& files = out->json_answer()["files"];
  ASSERT_EQ(files.size(), 1u) << files;
  EXPECT_EQ(files[0],
            json({{"path", "out.csv"}, {"change", "created"}, {"type", "file"}, {"size", 4}}));
  EXPECT_EQ(artifacts_->list(id_).at(0).kind, "file");
}

TEST_F(ExecutorTest, SetupAndTeardownRunSilentlyAroundTheCell) {
  start();
  respond("print(os.environ['K'])", FakeCell().out("v\n"));
  ExecuteRequest request;
  request.setup_code = "set_env()";
  request.teardown_code = "restore_env()";
  auto out = run("print(os.environ['K'])", 30, {}, request);
  ASSERT_TRUE(answered(out));
  EXPECT_EQ(out->json_answer()["status"], "ok");
  EXPECT_EQ(out->json_answer()["stdout"], "v\n");
  EXPECT_EQ(out->json_answer()["execution_count"], 1) << "setup and teardown are silent";
  EXPECT_EQ(kernel()->executed(),
            (std::vector<std::string>{"set_env()", "print(os.environ['K'])", "restore_env()"}));
  // A failing setup is an error, and the cell does not run.
  respond("bad_setup()", FakeCell().error("NameError", "name 'x' is not defined"));
  request.setup_code = "bad_setup()";
  auto failed = run("never()", 30, {}, request);
  ASSERT_TRUE(answered(failed));
  ASSERT_FALSE(failed->answer->ok());
  EXPECT_EQ(failed->answer->error().reason, "setup_failed");
  EXPECT_NE(failed->answer->error().message.find("name 'x' is not defined"), std::string::npos);
  auto executed = kernel()->executed();
  EXPECT_EQ(std::count(executed.begin(), executed.end(), "never()"), 0);
}

TEST_F(ExecutorTest, RunSilentlyAndItsErrors) {
  start();
  respond("raise_it()", FakeCell().error("OSError", "no such dir"));
  std::optional<Result<void>> ok;
  executor_->run_silently(id_, "os.chdir('/tmp')", 5s, [&](Result<void> r) { ok = r; });
  ASSERT_TRUE(settle([&] { return ok.has_value(); }));
  EXPECT_TRUE(ok->ok());
  std::optional<Result<void>> failed;
  executor_->run_silently(id_, "raise_it()", 5s, [&](Result<void> r) { failed = r; });
  ASSERT_TRUE(settle([&] { return failed.has_value(); }));
  ASSERT_FALSE(failed->ok());
  EXPECT_EQ(failed->error().reason, "setup_failed");
  EXPECT_EQ(audit_lines().size(), 0u) << "silent runs leave no audit line";
  std::optional<Result<void>> missing;
  executor_->run_silently("no-such-kernel", "1", 5s, [&](Result<void> r) { missing = r; });
  ASSERT_TRUE(settle([&] { return missing.has_value(); }));
  EXPECT_EQ(missing->error().code, ErrorCode::kNotFound);
}

TEST_F(ExecutorTest, AnUnknownKernelIsNotFound) {
  start();
  auto out = std::make_shared<Outcome>();
  ExecuteRequest request;
  request.code = "1";
  executor_->run("4d6c3e0e-6c8e-4b4e-9c43-0f5d4c1e2a77", request, {},
                 [out](Answer a) { out->answer = std::move(a); });
  ASSERT_TRUE(answered(out));
  ASSERT_FALSE(out->answer->ok());
  EXPECT_EQ(out->answer->error().code, ErrorCode::kNotFound);
}

TEST_F(ExecutorTest, OneShotStartsAKernelRunsTheCellAndShutsItDown) {
  start();
  respond("print(open('data/in.txt').read())", FakeCell().out("hello\n"));
  OneShotRequest request;
  request.cell.code = "print(open('data/in.txt').read())";
  if (::geteuid() == 0) {
    request.files["data/in.txt"] = "hello";  // written as the kernel's uid: needs root
  }
  auto out = std::make_shared<Outcome>();
  executor_->run_once(std::move(request), {}, [&, out](Answer a) {
    out->answer = std::move(a);
    out->done_calls++;
    // The kernel is gone before the answer goes out.
    EXPECT_FALSE(registry_->find(out->answer->value().kernel_id).ok());
  });
  ASSERT_TRUE(answered(out));
  ASSERT_TRUE(out->answer->ok()) << out->answer->error().describe();
  const json& a = out->json_answer();
  EXPECT_EQ(a["status"], "ok");
  EXPECT_EQ(a["stdout"], "hello\n");
  ASSERT_TRUE(a["kernel_id"].is_string());
  EXPECT_NE(a["kernel_id"], id_);
  EXPECT_EQ(fake_.launches(), 2);
  EXPECT_FALSE(kernel(1)->running());
  if (::geteuid() == 0) {
    std::ifstream in(state_dir_ + "/kernels/" + a["kernel_id"].get<std::string>() +
                     "/work/data/in.txt");
    EXPECT_FALSE(in.good()) << "the work dir goes with the kernel";
  }
}

TEST_F(ExecutorTest, BlockingRunAndWaitFromAnotherThread) {
  start();
  respond("1+1", FakeCell().result({{"text/plain", "2"}}));
  respond("long", FakeCell().hang());
  std::atomic<bool> returned{false};
  std::optional<Answer> answer;
  ExecuteRequest request;
  request.code = "1+1";
  std::thread caller([&] {
    answer = executor_->run_and_wait(id_, request, {});
    returned = true;
  });
  // The loop runs here, as the gateway's cell threads do.
  EXPECT_TRUE(settle([&] { return returned.load(); }));
  caller.join();
  ASSERT_TRUE(answer && answer->ok());
  EXPECT_EQ((*answer)->to_json().at("result")["text/plain"], "2");
  // The cancel flag (cellgate run's ^C) stops a running cell.
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  returned = false;
  request.code = "long";
  request.timeout_seconds = 300;
  std::thread second([&] {
    answer = executor_->run_and_wait(id_, request, {}, cancelled);
    returned = true;
  });
  ASSERT_TRUE(running_in_kernel());
  cancelled->store(true);
  EXPECT_TRUE(settle([&] { return returned.load(); }));
  second.join();
  ASSERT_TRUE(answer && answer->ok());
  EXPECT_EQ((*answer)->to_json().at("status"), "aborted");
}

TEST_F(ExecutorTest, TheExecutorGoingAwayEndsItsCells) {
  start();
  respond("long", FakeCell().hang());
  auto running = run("long", 300);
  ASSERT_TRUE(running_in_kernel());
  auto queued = run("next", 300);
  loop_.run_ready();
  executor_.reset();
  loop_.run_ready();
  ASSERT_TRUE(running->answer && queued->answer);
  EXPECT_EQ(running->json_answer()["status"], "aborted");
  EXPECT_EQ(queued->json_answer()["status"], "aborted");
  EXPECT_EQ(queued->json_answer()["message"], "the gateway is shutting down; the cell did not run");
  // Late kernel messages and timers find nothing to call.
  loop_.advance(301s);
  EXPECT_EQ(running->done_calls, 1);
  EXPECT_EQ(queued->done_calls, 1);
}

// ---- the parts: the FIFO per kernel and the hand-off to a strand ------------------------------

TEST(KernelQueues, TurnsGoInArrivalOrderAndLeavingPassesThemOn) {
  KernelQueues queues;
  std::vector<int> turns;
  auto a = queues.enter("k", [&] { turns.push_back(1); });
  auto b = queues.enter("k", [&] { turns.push_back(2); });
  auto c = queues.enter("k", [&] { turns.push_back(3); });
  auto other = queues.enter("other", [&] { turns.push_back(9); });
  EXPECT_EQ(turns, (std::vector<int>{1, 9})) << "one kernel's line does not hold up another's";
  EXPECT_EQ(queues.waiting("k"), 2u);
  queues.leave("k", b);  // gave up waiting: no turn for it
  EXPECT_EQ(turns, (std::vector<int>{1, 9}));
  queues.leave("k", a);  // done: the next one's turn
  EXPECT_EQ(turns, (std::vector<int>{1, 9, 3}));
  queues.leave("k", a);  // twice: nothing
  queues.leave("k", c);
  queues.leave("other", other);
  EXPECT_EQ(queues.waiting("k"), 0u);
  queues.enter("k", [&] { turns.push_back(4); });
  EXPECT_EQ(turns.back(), 4) << "a free kernel's turn comes at once";
}

TEST(Inbox, TheIoThreadWaitsWhileTheStrandIsOverBudget) {
  Inbox inbox(100, 10s);
  EXPECT_TRUE(inbox.admit(60));
  EXPECT_TRUE(inbox.admit(40));
  std::atomic<bool> admitted{false};
  std::thread io([&] {
    admitted = inbox.admit(500);  // over the budget: waits for the strand
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(admitted.load());
  inbox.release(60);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(admitted.load()) << "40 + 500 is still over";
  inbox.release(40);  // empty: one message of any size goes through
  io.join();
  EXPECT_TRUE(admitted.load());
  EXPECT_EQ(inbox.pending(), 500u);
}

TEST(Inbox, ClosingEndsTheWaitAndDropsWhatComes) {
  Inbox inbox(10, 10s);
  EXPECT_TRUE(inbox.admit(10));
  std::optional<bool> admitted;
  std::thread io([&] { admitted = inbox.admit(10); });
  std::this_thread::sleep_for(20ms);
  inbox.close();
  io.join();
  EXPECT_EQ(admitted, false);
  EXPECT_FALSE(inbox.admit(1));
}

TEST(Inbox, TheWaitIsBounded) {
  Inbox inbox(10, 30ms);  // a strand that never runs slows the I/O thread, never stalls it
  EXPECT_TRUE(inbox.admit(10));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(inbox.admit(10));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
}

}  // namespace
}  // namespace cellgate::execute
