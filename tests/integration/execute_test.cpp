// POST /api/kernels/{id}/execute against real jailed kernels, through the Api (no sockets).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>

#include "cellgate/api/api.hpp"
#include "cellgate/execute/executor.hpp"
#include "cellgate/testing/api_parts.hpp"

namespace cellgate::api {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using http::Request;
using http::Response;
namespace bhttp = boost::beast::http;

class ExecuteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "the jail needs root";
    }
    std::string dir = (std::filesystem::temp_directory_path() / "cellgate-exec-XXXXXX").string();
    state_dir_ = ::mkdtemp(dir.data());
    testing::ApiPartsOptions o;
    o.state_dir = state_dir_;
    o.token = "secret";
    o.limits.grace = 2s;
    o.limits.stream_bytes = 64 << 10;
    parts_ = std::make_unique<testing::ApiParts>(std::move(o));
    manager_ = &parts_->registry;
    api_ = &parts_->api;
    auto model = manager_->start("python3", json());
    ASSERT_TRUE(model) << model.error().describe();
    id_ = model->id;
  }
  void TearDown() override {
    parts_.reset();
    if (!state_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(state_dir_, ec);
    }
  }

  std::pair<int, json> post(const json& body, const std::string& id = "") {
    Request req{bhttp::verb::post, "/api/kernels/" + (id.empty() ? id_ : id) + "/execute", 11};
    req.set(bhttp::field::authorization, "token secret");
    req.body() = body.dump();
    req.prepare_payload();
    std::promise<Response> promise;
    api_->handle(std::move(req), [&](Response res) { promise.set_value(std::move(res)); });
    Response res = promise.get_future().get();
    return {static_cast<int>(res.result_int()), json::parse(res.body(), nullptr, false)};
  }

  std::string state_dir_;
  std::unique_ptr<testing::ApiParts> parts_;
  kernels::KernelRegistry* manager_ = nullptr;
  Api* api_ = nullptr;
  std::string id_;
};

TEST_F(ExecuteTest, OkCellWithStdoutResultAndStateKept) {
  auto [code1, first] = post({{"code", "x = 41\nprint('hello')"}});
  ASSERT_EQ(code1, 200) << first;
  EXPECT_EQ(first["status"], "ok");
  EXPECT_EQ(first["stdout"], "hello\n");
  EXPECT_EQ(first["outputs"][0]["output_type"], "stream");
  auto [code2, second] = post({{"code", "import sys; print('err', file=sys.stderr); x + 1"}});
  ASSERT_EQ(code2, 200);
  EXPECT_EQ(second["status"], "ok");
  EXPECT_EQ(second["stderr"], "err\n");
  EXPECT_EQ(second["result"]["text/plain"], "42");
  EXPECT_EQ(second["execution_count"], 2);
  EXPECT_EQ(second["state_lost"], false);
  EXPECT_TRUE(second["metrics"]["wall_ms"].is_number());
}

TEST_F(ExecuteTest, ErrorHasNameValueStrippedTracebackAndLine) {
  auto [code, answer] = post({{"code", "a = 1\nd = {}\nd['missing']"}});
  ASSERT_EQ(code, 200);
  EXPECT_EQ(answer["status"], "error");
  EXPECT_EQ(answer["error"]["ename"], "KeyError");
  EXPECT_EQ(answer["error"]["evalue"], "'missing'");
  EXPECT_EQ(answer["error"]["line"], 3) << answer["error"];
  for (const auto& line : answer["error"]["traceback"]) {
    EXPECT_EQ(line.get<std::string>().find('\x1b'), std::string::npos) << line;
  }
  // The next call works (stop_on_error does not abort it).
  auto [code2, next] = post({{"code", "print(a)"}});
  EXPECT_EQ(next["stdout"], "1\n");
}

TEST_F(ExecuteTest, AChartArrivesAsDisplayData) {
  auto [code, answer] = post({{"code",
                               "import matplotlib.pyplot as plt\n"
                               "plt.figure(figsize=(2, 2)); plt.plot([1, 3, 2]); plt.show()"}});
  ASSERT_EQ(code, 200);
  bool png = false;
  for (const auto& o : answer["outputs"]) {
    if (o["output_type"] == "display_data" && o["data"].contains("image/png")) {
      png = o["data"]["image/png"].get<std::string>().rfind("iVBORw0KGgo", 0) == 0;
    }
  }
  EXPECT_TRUE(png) << answer.dump().substr(0, 500);
}

TEST_F(ExecuteTest, StdinAnswersInput) {
  auto [code, answer] = post(
      {{"code", "a = input('a? '); b = input('b? '); print(a + b)"}, {"stdin", {"cell", "gate"}}});
  ASSERT_EQ(code, 200);
  EXPECT_EQ(answer["status"], "ok") << answer;
  EXPECT_NE(answer["stdout"].get<std::string>().find("cellgate"), std::string::npos) << answer;
  // Without stdin, input() fails clearly instead of hanging.
  auto [code2, none] = post({{"code", "input('x? ')"}, {"timeout", 20}});
  EXPECT_EQ(none["status"], "error");
  EXPECT_EQ(none["error"]["ename"], "StdinNotImplementedError") << none["error"];
}

TEST_F(ExecuteTest, AnInfiniteLoopTimesOutAndKeepsState) {
  post({{"code", "kept = 'yes'"}});
  const auto t0 = Clock::now();
  auto [code, answer] = post({{"code", "while True: pass"}, {"timeout", 1}});
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  ASSERT_EQ(code, 200);
  EXPECT_EQ(answer["status"], "timeout");
  EXPECT_EQ(answer["state_lost"], false);
  EXPECT_LT(took.count(), 1000 + 2000 + 1500) << "deadline + grace + margin";
  auto [code2, after] = post({{"code", "print(kept)"}});
  EXPECT_EQ(after["stdout"], "yes\n");
}

TEST_F(ExecuteTest, ACellIgnoringSigintGetsItsKernelRestarted) {
  post({{"code", "kept = 'yes'"}});
  const auto t0 = Clock::now();
  auto [code, answer] = post({{"code",
                               "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                               "while True: time.sleep(0.1)"},
                              {"timeout", 1}});
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  ASSERT_EQ(code, 200);
  EXPECT_EQ(answer["status"], "timeout");
  EXPECT_EQ(answer["state_lost"], true) << answer;
  EXPECT_LT(took.count(), 1000 + 2000 + 5000) << "deadline + grace + a restart";
  auto [code2, after] = post({{"code", "print('kept' in globals())"}});
  EXPECT_EQ(after["stdout"], "False\n") << after;
}

TEST_F(ExecuteTest, AFloodOfOutputIsTruncatedAndCounted) {
  auto [code, answer] =
      post({{"code", "import sys\nfor i in range(4096): sys.stdout.write('y' * 1023 + '\\n')"}});
  ASSERT_EQ(code, 200);
  EXPECT_EQ(answer["status"], "ok");
  EXPECT_EQ(answer["stdout"].get<std::string>().size(), 64u << 10);
  EXPECT_EQ(answer["truncated"]["stdout"], true);
  EXPECT_EQ(answer["truncated"]["dropped_bytes"].get<std::size_t>(), (4096u << 10) - (64u << 10));
}

TEST_F(ExecuteTest, BadRequestsAre4xx) {
  EXPECT_EQ(post({{"nocode", 1}}).first, 400);
  EXPECT_EQ(post({{"code", 5}}).first, 400);
  EXPECT_EQ(post({{"code", "1"}, {"timeout", -1}}).first, 400);
  EXPECT_EQ(post({{"code", "1"}, {"stdin", 3}}).first, 400);
  EXPECT_EQ(post({{"code", "1"}}, "4d6c3e0e-6c8e-4b4e-9c43-0f5d4c1e2a77").first, 404);
}

}  // namespace
}  // namespace cellgate::api
