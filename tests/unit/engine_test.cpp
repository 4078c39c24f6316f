// The engine over the fake kernel backend: it builds everything and starts nothing, start()
// brings up the threads and the registry, a cell runs through the parts it composed, and stop()
// is the documented teardown (kernels end, queued blocking work finishes, threads stop); a bad
// audit option fails create(). And the host's steps with no jail: the probe only. No root, no
// Python.
#include "cellgate/engine/engine.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <vector>

#include "cellgate/engine/host.hpp"
#include "cellgate/testing/fake_kernel.hpp"

namespace cellgate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::FakeBackend;
using testing::FakeCell;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-engine-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    root_ = dir;
    options_.registry.state_dir = root_ + "/state";
    options_.registry.kernel_start_timeout = 2;
    // The test's own lease dir, and uids no real kernel of a gateway on this host runs as.
    options_.registry.uids.lease_dir = root_ + "/uid-ranges";
    options_.registry.uids.base = 3100000;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // An engine over a fake backend that answers "1+2" with 3; `fake` is left pointing at it.
  std::unique_ptr<engine::Engine> make(FakeBackend*& fake) {
    auto backend = std::make_unique<FakeBackend>([](const std::string& code) {
      return code == "1+2" ? FakeCell().result({{"text/plain", "3"}}) : FakeCell();
    });
    fake = backend.get();
    auto made = engine::Engine::create(options_, std::move(backend));
    EXPECT_TRUE(made.ok()) << made.error().describe();
    return made.ok() ? std::move(made).value() : nullptr;
  }

  std::string root_;
  engine::EngineOptions options_;
};

TEST_F(EngineTest, BuildsEverythingAndStartsNothing) {
  FakeBackend* fake = nullptr;
  auto engine = make(fake);
  ASSERT_TRUE(engine);
  EXPECT_EQ(&engine->backend(), fake);
  EXPECT_FALSE(fake->started());
  EXPECT_FALSE(engine->started());
  EXPECT_TRUE(engine->registry().list().empty());
  EXPECT_EQ(engine->registry().state_dir(), root_ + "/state");
}

TEST_F(EngineTest, ACellRunsThroughThePartsItComposed) {
  FakeBackend* fake = nullptr;
  auto engine = make(fake);
  ASSERT_TRUE(engine);
  engine->start();
  EXPECT_TRUE(engine->started());
  EXPECT_TRUE(fake->started());
  auto model = engine->registry().start("python3", json::object());
  ASSERT_TRUE(model.ok()) << model.error().describe();
  execute::ExecuteRequest request;
  request.code = "1+2";
  request.timeout_seconds = 10;
  auto answer = engine->executor().run_and_wait(model->id, std::move(request), {});
  ASSERT_TRUE(answer.ok()) << answer.error().describe();
  EXPECT_EQ(answer->status_name(), "ok");
  ASSERT_TRUE(answer->result.has_value());
  EXPECT_EQ((*answer->result)["text/plain"], "3");
}

TEST_F(EngineTest, StopEndsTheKernelsThenFinishesQueuedWorkThenTheThreads) {
  FakeBackend* fake = nullptr;
  auto engine = make(fake);
  ASSERT_TRUE(engine);
  engine->start();
  auto model = engine->registry().start("python3", json::object());
  ASSERT_TRUE(model.ok()) << model.error().describe();
  // Blocking work queued behind busy offload threads still runs before stop() returns.
  std::atomic<int> ran{0};
  std::promise<void> release;
  auto released = release.get_future().share();
  engine->offload()([released, &ran] {
    released.wait();
    ++ran;
  });
  for (int i = 0; i < 8; ++i) {
    engine->offload()([&ran] { ++ran; });
  }
  std::thread stopper([&] { engine->stop(); });
  release.set_value();
  stopper.join();
  EXPECT_EQ(ran.load(), 9);
  EXPECT_TRUE(engine->registry().list().empty());  // every kernel ended
  EXPECT_FALSE(engine->started());
  engine->stop();  // idempotent
  engine.reset();  // the parts go after the threads
}

TEST_F(EngineTest, AnAuditLogThatCannotBeMadeFailsCreate) {
  options_.audit.redact = {"("};  // not a regular expression
  auto made = engine::Engine::create(options_, std::make_unique<FakeBackend>());
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.error().reason, "bad_redact_pattern");
}

TEST_F(EngineTest, TheLauncherGetsAZygoteInTheStateDirOnlyWhenJailed) {
  options_.zygote = true;
  options_.zygote_preload = {"numpy"};
  auto jailed = engine::launcher_options(options_);
  ASSERT_TRUE(jailed.zygote.has_value());
  EXPECT_EQ(jailed.zygote->socket_path, root_ + "/state/run/zygote.sock");
  EXPECT_EQ(jailed.zygote->log_file, root_ + "/state/zygote.log");
  EXPECT_EQ(jailed.zygote->preload, std::vector<std::string>{"numpy"});
  options_.registry.no_jail = true;
  EXPECT_FALSE(engine::launcher_options(options_).zygote.has_value());
}

TEST(HostTest, UnjailedTheProbeIsTheOnlyStep) {
  std::vector<engine::HostStep> steps;
  engine::HostOptions o;
  o.jailed = false;
  o.cgroup_parent = "/given";
  o.report = [&](engine::HostStep step, const std::string& line) {
    steps.push_back(step);
    EXPECT_FALSE(line.empty());
  };
  auto host = engine::prepare_host(o);
  ASSERT_TRUE(host.ok()) << host.error().describe();
  EXPECT_EQ(steps, std::vector<engine::HostStep>{engine::HostStep::kProbe});
  EXPECT_FALSE(host->user_namespace);
  EXPECT_EQ(host->cgroup_parent, "/given");
  EXPECT_FALSE(host->support.kernel_release.empty());
  // No checkpoints of an unjailed kernel, and the reason a 501 would give.
  EXPECT_FALSE(host->checkpoints.available);
  EXPECT_NE(host->checkpoints.reason.find("unjailed"), std::string::npos)
      << host->checkpoints.reason;
}

}  // namespace
}  // namespace cellgate
