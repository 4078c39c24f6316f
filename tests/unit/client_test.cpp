// The client seam (gateway/client): the same calls against both implementations — make_local
// over an engine whose backend is the fake kernel, and make_remote over the real Api of such an
// engine served on a loopback port — so the remote one is checked against the agent API's routes
// as they answer. Then a gateway's streamed answer read as hostile input (src/ndjson.hpp). No
// root, no Python.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <filesystem>
#include <future>
#include <thread>

#include "cellgate/api/api.hpp"
#include "cellgate/client/kernels.hpp"
#include "cellgate/engine/engine.hpp"
#include "cellgate/http/listener.hpp"
#include "cellgate/testing/fake_kernel.hpp"
#include "ndjson.hpp"

namespace cellgate::client {
namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;
using nlohmann::json;
using testing::FakeBackend;
using testing::FakeCell;

enum class Where { kLocal, kRemote };

class ClientTest : public ::testing::TestWithParam<Where> {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-client-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    root_ = dir;
    engine::EngineOptions options;
    options.registry.state_dir = root_ + "/state";
    options.registry.kernel_start_timeout = 5;
    // The test's own lease dir, and uids no real kernel of a gateway on this host runs as.
    options.registry.uids.lease_dir = root_ + "/uid-ranges";
    options.registry.uids.base = 3200000;
    options.cell_threads = 1;
    options.offload_threads = 4;
    options.limits.grace = std::chrono::milliseconds(200);
    auto backend = std::make_unique<FakeBackend>([](const std::string& code) {
      if (code == "print('hi')") {
        return FakeCell().out("hi\n");
      }
      if (code == "1+2") {
        return FakeCell().result({{"text/plain", "3"}});
      }
      if (code == "1/0") {
        return FakeCell().error("ZeroDivisionError", "division by zero");
      }
      if (code == "while True: pass") {
        return FakeCell().hang();
      }
      return FakeCell();
    });
    auto made = engine::Engine::create(options, std::move(backend));
    ASSERT_TRUE(made.ok()) << made.error().describe();
    engine_ = std::move(made).value();
    engine_->start();

    Options client_options;
    client_options.client = "client test";
    if (GetParam() == Where::kLocal) {
      kernels_ = make_local(engine_->registry(), engine_->executor(), client_options);
      return;
    }
    api::ApiOptions api_options;
    api_options.token = "secret";
    api_ = std::make_unique<api::Api>(engine_->registry(), engine_->executor(), api_options,
                                      engine_->offload());
    auto listener = http::Listener::open(ioc_, "127.0.0.1", 0, *api_, http_options_);
    ASSERT_TRUE(listener.ok()) << listener.error().describe();
    listener_ = std::move(listener).value();
    listener_->start();
    io_thread_ = std::thread([this] { ioc_.run(); });
    auto url = http::client::parse_url("http://127.0.0.1:" + std::to_string(listener_->port()));
    ASSERT_TRUE(url.ok());
    util::Offload offload = [this](std::function<void()> fn) { net::post(pool_, std::move(fn)); };
    auto bad = make_remote(*url, "wrong", client_options, offload);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().code, ErrorCode::kPermissionDenied) << bad.error().describe();  // 403
    auto remote = make_remote(*url, "secret", client_options, offload);
    ASSERT_TRUE(remote.ok()) << remote.error().describe();
    kernels_ = std::move(remote).value();
  }

  void TearDown() override {
    pool_.join();  // cells still being read
    kernels_.reset();
    if (listener_) {
      listener_->stop();
    }
    work_.reset();
    ioc_.stop();
    if (io_thread_.joinable()) {
      io_thread_.join();
    }
    listener_.reset();
    if (engine_) {
      engine_->stop();
    }
    api_.reset();
    engine_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  static execute::ExecuteRequest cell(std::string code, double timeout = 10) {
    execute::ExecuteRequest request;
    request.code = std::move(code);
    request.timeout_seconds = timeout;
    return request;
  }

  std::string root_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<api::Api> api_;
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_ = net::make_work_guard(ioc_);
  http::HttpOptions http_options_;
  std::unique_ptr<http::Listener> listener_;
  std::thread io_thread_;
  net::thread_pool pool_{4};
  std::unique_ptr<Kernels> kernels_;
};

TEST_P(ClientTest, KernelspecsStartRunRestartShutdown) {
  auto specs = kernels_->kernelspecs();
  ASSERT_TRUE(specs.ok()) << specs.error().describe();
  EXPECT_EQ(specs->default_name, engine_->registry().default_kernel_name());
  ASSERT_FALSE(specs->specs.empty());

  auto id = kernels_->start(specs->default_name);
  ASSERT_TRUE(id.ok()) << id.error().describe();
  json events = json::array();
  WaitOptions wait;
  wait.on_event = [&events](const json& event) { events.push_back(event); };
  auto answer = run_and_wait(*kernels_, *id, cell("print('hi')"), wait);
  ASSERT_TRUE(answer.ok()) << answer.error().describe();
  EXPECT_EQ(answer->status, execute::CellStatus::kOk);
  EXPECT_EQ(answer->stdout_text, "hi\n");
  EXPECT_EQ(events, json::array({{{"type", "stream"}, {"name", "stdout"}, {"text", "hi\n"}}}));

  answer = run_and_wait(*kernels_, *id, cell("1/0"));
  ASSERT_TRUE(answer.ok()) << answer.error().describe();
  EXPECT_EQ(answer->status, execute::CellStatus::kError);
  ASSERT_TRUE(answer->error.has_value());
  EXPECT_EQ(answer->error->ename, "ZeroDivisionError");

  EXPECT_TRUE(kernels_->restart(*id).ok());
  answer = run_and_wait(*kernels_, *id, cell("1+2"));
  ASSERT_TRUE(answer.ok()) << answer.error().describe();
  ASSERT_TRUE(answer->result.has_value());
  EXPECT_EQ((*answer->result)["text/plain"], "3");

  ASSERT_TRUE(kernels_->shutdown(*id).ok());
  answer = run_and_wait(*kernels_, *id, cell("1+2"));
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.error().code, ErrorCode::kNotFound) << answer.error().describe();
  EXPECT_FALSE(kernels_->shutdown(*id).ok());
}

TEST_P(ClientTest, OneShotCellsStartTheirOwnKernel) {
  WaitOptions wait;
  wait.kernelspec = engine_->registry().default_kernel_name();
  auto answer = run_and_wait(*kernels_, "", cell("1+2"), wait);
  ASSERT_TRUE(answer.ok()) << answer.error().describe();
  EXPECT_EQ(answer->status, execute::CellStatus::kOk);
  ASSERT_TRUE(answer->result.has_value());
  EXPECT_EQ((*answer->result)["text/plain"], "3");
}

TEST_P(ClientTest, FilesAreWrittenListedAndRead) {
  auto id = kernels_->start(engine_->registry().default_kernel_name());
  ASSERT_TRUE(id.ok()) << id.error().describe();
  auto entry = kernels_->write_file(*id, "data/a.txt", "abc");
  ASSERT_TRUE(entry.ok()) << entry.error().describe();
  EXPECT_EQ((*entry)["path"], "data/a.txt");
  EXPECT_EQ((*entry)["size"], 3);
  auto bytes = kernels_->read_file(*id, "data/a.txt");
  ASSERT_TRUE(bytes.ok()) << bytes.error().describe();
  EXPECT_EQ(*bytes, "abc");
  auto listing = kernels_->list_files(*id, "data");
  ASSERT_TRUE(listing.ok()) << listing.error().describe();
  EXPECT_EQ((*listing)["path"], "data");
  ASSERT_EQ((*listing)["entries"].size(), 1u);
  EXPECT_EQ((*listing)["entries"][0]["name"], "a.txt");
  auto missing = kernels_->read_file(*id, "nope.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound) << missing.error().describe();
  auto dir = kernels_->read_file(*id, "data");
  EXPECT_FALSE(dir.ok());
}

TEST_P(ClientTest, KernelInfoSaysTheLanguage) {
  auto id = kernels_->start(engine_->registry().default_kernel_name());
  ASSERT_TRUE(id.ok()) << id.error().describe();
  auto info = kernels_->kernel_info(*id);
  ASSERT_TRUE(info.ok()) << info.error().describe();
  ASSERT_TRUE(info->contains("language_info")) << info->dump();
  EXPECT_EQ((*info)["language_info"]["name"], "python");
}

// Locally a cancelled cell answers "aborted"; a gateway's kernel is interrupted, and the cell
// answers as it ended (KeyboardInterrupt). Either way the answer comes, and the kernel lives.
TEST_P(ClientTest, CancelStopsARunningCell) {
  auto id = kernels_->start(engine_->registry().default_kernel_name());
  ASSERT_TRUE(id.ok()) << id.error().describe();
  std::promise<std::shared_ptr<Cell>> started;
  auto handle = started.get_future();
  std::thread canceller([&handle, this] {
    auto running = handle.get();
    // Cancel once the fake kernel has begun the cell: an interrupt reaches a running cell.
    auto* fake = dynamic_cast<FakeBackend*>(&engine_->backend());
    ASSERT_NE(fake, nullptr);
    EXPECT_TRUE(testing::eventually([fake] {
      auto k = fake->kernel(static_cast<std::size_t>(fake->launches() - 1));
      return k != nullptr && k->cell_running();
    }));
    running->cancel();
  });
  WaitOptions wait;
  wait.started = [&started](std::shared_ptr<Cell> cell) { started.set_value(std::move(cell)); };
  auto answer = run_and_wait(*kernels_, *id, cell("while True: pass", 60), wait);
  canceller.join();
  ASSERT_TRUE(answer.ok()) << answer.error().describe();
  if (GetParam() == Where::kLocal) {
    EXPECT_EQ(answer->status, execute::CellStatus::kAborted);
  } else {
    EXPECT_EQ(answer->status, execute::CellStatus::kError);
  }
  answer = run_and_wait(*kernels_, *id, cell("1+2"));
  ASSERT_TRUE(answer.ok()) << answer.error().describe();
  EXPECT_EQ(answer->status, execute::CellStatus::kOk);
}

INSTANTIATE_TEST_SUITE_P(Both, ClientTest, ::testing::Values(Where::kLocal, Where::kRemote),
                         [](const ::testing::TestParamInfo<Where>& where) {
                           return where.param == Where::kLocal ? "Local" : "Remote";
                         });

// ---- a gateway's streamed answer, read as hostile input ----------------------------------------

json stream(const std::string& text) {
  return {{"type", "stream"}, {"name", "stdout"}, {"text", text}};
}

std::string end_line(const std::string& status = "ok") {
  return json{{"type", "end"}, {"answer", {{"status", status}, {"execution_count", 1}}}}.dump() +
         "\n";
}

TEST(NdjsonAnswer, ReadsEventsAndTheAnswerCutAnywhere) {
  const std::string body = stream("a").dump() + "\n" + json{{"type", "keepalive"}}.dump() + "\n\n" +
                           stream("b").dump() + "\r\n" + end_line();
  for (std::size_t cut = 0; cut <= body.size(); ++cut) {
    json events = json::array();
    NdjsonAnswer lines([&events](json event) { events.push_back(std::move(event)); });
    lines.feed(body.substr(0, cut));
    lines.feed(body.substr(cut));
    auto answer = lines.answer();
    ASSERT_TRUE(answer) << answer.error().message;
    EXPECT_EQ(answer->status_name(), "ok");
    EXPECT_EQ(events, json::array({stream("a"), {{"type", "keepalive"}}, stream("b")}));
  }
}

// A gateway that streams a line without end costs at most the line limit; the line is skipped
// to its newline and the rest is read.
TEST(NdjsonAnswer, ALineOverTheLimitIsSkipped) {
  json events = json::array();
  NdjsonAnswer lines([&events](json event) { events.push_back(std::move(event)); },
                     /*max_line_bytes=*/1000);
  lines.feed(stream("kept").dump() + "\n");
  for (int i = 0; i < 10000; ++i) {
    lines.feed(std::string(100, 'x'));
  }
  lines.feed("\n" + stream("more").dump() + "\n" + end_line());
  auto answer = lines.answer();
  ASSERT_TRUE(answer) << answer.error().message;
  EXPECT_EQ(events, json::array({stream("kept"), stream("more")}));
  EXPECT_EQ(json(answer->notices),
            json::array({"the gateway's answer was cut; 1 of its lines were over 1000 bytes and "
                         "were dropped"}));
}

// A line nested 100,000 deep is not parsed (nlohmann would build it; copying it recursed).
TEST(NdjsonAnswer, ADeepLineIsNotParsed) {
  const std::size_t deep = 100000;
  NdjsonAnswer lines(nullptr);
  lines.feed(R"({"type": "display_data", "data": {"application/json": )" + std::string(deep, '[') +
             std::string(deep, ']') + "}}\n");
  lines.feed(R"({"type": "end", "answer": {"status": "ok", "x": )" + std::string(deep, '[') +
             std::string(deep, ']') + "}}");
  auto answer = lines.answer();
  ASSERT_FALSE(answer);
  EXPECT_EQ(answer.error().message,
            "POST /api/kernels/{id}/execute: the stream ended without the answer; 2 of its lines "
            "nest deeper than 256 levels and were dropped");
}

// An end line's error whose message is not a string: value("message", …) threw.
TEST(NdjsonAnswer, AnErrorWithoutAStringMessage) {
  NdjsonAnswer lines(nullptr);
  lines.feed(R"({"type": "end", "answer": null, "error": {"message": 5}})");
  auto answer = lines.answer();
  ASSERT_FALSE(answer);
  EXPECT_EQ(answer.error().message, "POST /api/kernels/{id}/execute: no answer");
  EXPECT_EQ(answer.error().reason, "execute_failed");
}

TEST(NdjsonAnswer, AnEndLineWithoutANewlineIsRead) {
  NdjsonAnswer lines(nullptr);
  std::string line = end_line("error");
  line.pop_back();  // its newline
  lines.feed(line);
  EXPECT_FALSE(lines.ended());
  lines.finish();
  EXPECT_TRUE(lines.ended());
  auto answer = lines.answer();
  ASSERT_TRUE(answer) << answer.error().message;
  EXPECT_EQ(answer->status, execute::CellStatus::kError);
}

TEST(RequestJson, IsTheAgentApisBody) {
  execute::ExecuteRequest request;
  request.code = "x";
  request.timeout_seconds = 5;
  EXPECT_EQ(request_json(request), (json{{"code", "x"}, {"timeout", 5}}));
  request.stdin_lines = {"a"};
  request.store_history = false;
  EXPECT_EQ(request_json(request),
            (json{{"code", "x"}, {"timeout", 5}, {"stdin", {"a"}}, {"store_history", false}}));
  auto back = execute::ExecuteRequest::from_json(request_json(request), 600);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->stdin_lines, request.stdin_lines);
  EXPECT_FALSE(back->store_history);
}

}  // namespace
}  // namespace cellgate::client
