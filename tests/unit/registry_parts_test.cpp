// The registry's parts alone: Admission (places under --max-kernels, given back by their
// tickets), PoolDemand (the pool's target from recent starts, on a clock the test passes), the
// warm pool growing with demand and shrinking back over the fake backend, on a ManualLoop clock,
// and the death monitor and culler run as timers on a ManualLoop the test moves. No root, no
// Python, no ZeroMQ.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <optional>

#include "admission.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/testing/fake_kernel.hpp"
#include "cellgate/util/loop.hpp"
#include "kernel_jail.hpp"
#include "warm_pool.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;
using testing::eventually;
using testing::FakeBackend;

// ---- Admission --------------------------------------------------------------------------------

TEST(AdmissionTest, ClientsAreRefusedOnlyByLiveAndPendingKernels) {
  Admission a(2);
  auto pooled = a.admit_pooled();
  ASSERT_TRUE(pooled);
  auto first = a.admit_client();
  ASSERT_TRUE(first.ok());
  auto second = a.admit_client();  // the pooled one must give way, the client is not refused
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(a.excess(), 1u);
  EXPECT_FALSE(a.admit_pooled());
  auto third = a.admit_client();
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code, ErrorCode::kResourceExhausted);
  pooled->reset();
  EXPECT_EQ(a.excess(), 0u);
}

TEST(AdmissionTest, TicketsGiveTheirPlaceBackAndMoveBetweenKinds) {
  Admission a(3);
  {
    auto t = a.admit_client();
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(a.counts().pending, 1u);
    t->make_live();
    EXPECT_EQ(a.counts().pending, 0u);
    EXPECT_EQ(a.counts().live, 1u);
    Admission::Ticket moved = std::move(t).value();
    EXPECT_EQ(a.counts().live, 1u);
  }  // a failed start's or a shut down kernel's place: given back as its ticket goes
  EXPECT_EQ(a.counts().total(), 0u);
  auto pooled = a.admit_pooled();
  ASSERT_TRUE(pooled);
  pooled->make_live();  // a claim
  EXPECT_EQ(a.counts().pooled, 0u);
  EXPECT_EQ(a.counts().live, 1u);
}

TEST(AdmissionTest, AdoptedKernelsAreNeverRefusedButHoldNewStartsBack) {
  Admission a(1);
  Admission::Ticket one = a.admit_adopted();
  Admission::Ticket two = a.admit_adopted();
  EXPECT_EQ(a.counts().live, 2u);
  EXPECT_FALSE(a.admit_client().ok());
  two.reset();
  one.reset();
  EXPECT_TRUE(a.admit_client().ok());
}

// ---- PoolDemand -------------------------------------------------------------------------------

TEST(PoolDemandTest, TheTargetIsTheMostStartsWithinOneRefillTimeBetweenFloorAndMax) {
  PoolDemand d;
  const util::Clock::time_point t0{std::chrono::hours(1)};
  EXPECT_EQ(d.target(t0, 2, 8), 2u);  // no demand: the floor
  d.note_refill(300ms);
  // A sequential client: a start every 100 ms, so three come within one 300 ms refill.
  for (int i = 0; i < 10; ++i) {
    d.note_start(t0 + i * 100ms);
  }
  EXPECT_EQ(d.target(t0 + 1s, 2, 8), 3u);
  EXPECT_EQ(d.target(t0 + 1s, 4, 8), 4u);  // never below the floor
  // A burst of 20 at once: as many as the max allows.
  for (int i = 0; i < 20; ++i) {
    d.note_start(t0 + 2s);
  }
  EXPECT_EQ(d.target(t0 + 2s, 2, 8), 8u);
  EXPECT_EQ(d.target(t0 + 2s, 2, 0), 2u);  // a max below the floor: a fixed size
  // Forgotten after the window.
  EXPECT_EQ(d.target(t0 + 2s + PoolDemand::kWindow + 1ms, 2, 8), 2u);
}

TEST(PoolDemandTest, TheRefillTimeFollowsTheMeasuredStarts) {
  PoolDemand d;
  d.note_refill(400ms);
  EXPECT_EQ(d.refill_time(), 400ms);
  d.note_refill(800ms);
  EXPECT_EQ(d.refill_time(), 500ms);  // a quarter of the new one
}

// ---- the pool in the registry -----------------------------------------------------------------

class WarmPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-pool-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    root_ = dir;
    fs::create_directories(root_ + "/jupyter");
    const char* old = std::getenv("JUPYTER_PATH");
    old_jupyter_path_ = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
    ::setenv("JUPYTER_PATH", (root_ + "/jupyter").c_str(), 1);  // the built-in python3 only
    options_.state_dir = root_ + "/state";
    options_.kernel_start_timeout = 2;
    options_.uids.lease_dir = root_ + "/uid-ranges";
    options_.uids.base = 3100000;
  }

  void TearDown() override {
    registry_.reset();
    if (old_jupyter_path_) {
      ::setenv("JUPYTER_PATH", old_jupyter_path_->c_str(), 1);
    } else {
      ::unsetenv("JUPYTER_PATH");
    }
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  KernelRegistry& registry() {
    if (!registry_) {
      registry_ =
          std::make_unique<KernelRegistry>(options_, fake_, [this] { return clock_.now(); });
    }
    return *registry_;
  }

  std::string root_;
  std::optional<std::string> old_jupyter_path_;
  RegistryOptions options_;
  util::ManualLoop clock_;
  FakeBackend fake_;
  std::unique_ptr<KernelRegistry> registry_;
};

TEST_F(WarmPoolTest, ThePoolGrowsWithDemandUpToItsMaxAndShrinksBackWhenItPasses) {
  options_.pool_size = 1;
  options_.pool_max = 3;
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 1; }));
  EXPECT_EQ(registry().pool_target("python3"), 1u);
  // Four starts at one instant on the test's clock: more than one refill time could serve.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(registry().start("python3", json::object()).ok());
  }
  EXPECT_GE(registry().stats().pool_claims.value(), 1u);  // the first; a refill may serve more
  EXPECT_EQ(registry().pool_target("python3"), 3u);       // at most pool_max
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 3; }));
  // A minute without starts: back to pool_size, the extra ready kernels ended.
  clock_.advance(PoolDemand::kWindow + 1s);
  EXPECT_EQ(registry().pool_target("python3"), 1u);
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 1; }));
  EXPECT_EQ(registry().list().size(), 4u);  // the clients' kernels are not the pool's to end
}

TEST_F(WarmPoolTest, WithoutAPoolMaxThePoolKeepsItsSize) {
  options_.pool_size = 2;
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 2; }));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(registry().start("python3", json::object()).ok());
  }
  EXPECT_EQ(registry().pool_target("python3"), 2u);
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 2; }));
  ASSERT_TRUE(eventually([&] { return fake_.launches() == 6; }));  // 2 + 2 misses + 2 refills
}

TEST_F(WarmPoolTest, GrowthStaysUnderMaxKernels) {
  options_.pool_size = 1;
  options_.pool_max = 8;
  options_.max_kernels = 4;
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 1; }));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(registry().start("python3", json::object()).ok());
  }
  EXPECT_GE(registry().pool_target("python3"), 2u);
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 2; }));
  // Two clients' kernels and two pooled fill the limit: no third pool start.
  EXPECT_EQ(registry().list().size(), 2u);
  EXPECT_EQ(registry().pool_ready("python3"), 2u);
}

// ---- the monitor on the loop -------------------------------------------------------------------

class MonitorLoopTest : public WarmPoolTest {
 protected:
  KernelRegistry& looped() {
    if (!registry_) {
      registry_ = std::make_unique<KernelRegistry>(options_, fake_, clock_);
    }
    return *registry_;
  }
};

TEST_F(MonitorLoopTest, APassRunsEvery250MsOfTheLoopsClockAndRestartsADeadKernel) {
  auto model = looped().start("python3", json::object());
  ASSERT_TRUE(model.ok()) << model.error().describe();
  looped().start();
  EXPECT_EQ(clock_.pending_timers(), 1u);
  const int ticks = fake_.ticks();
  clock_.advance(249ms);
  EXPECT_EQ(fake_.ticks(), ticks);  // no pass yet
  clock_.advance(1ms);
  EXPECT_EQ(fake_.ticks(), ticks + 1);
  fake_.kernel(0)->kill("segfault");
  EXPECT_EQ(fake_.launches(), 1);  // nothing runs until the loop does
  clock_.advance(250ms);           // the next pass (and the one the death posted, if it came)
  EXPECT_EQ(fake_.launches(), 2);
  EXPECT_EQ(looped().find(model->id).value()->model().execution_state, "idle");
  EXPECT_EQ(looped().stats().restarts.value(), 1u);
}

TEST_F(MonitorLoopTest, IdleKernelsAreCulledOnTheLoopsClock) {
  options_.cull_idle_timeout = 60;
  options_.cull_interval = 10;
  auto model = looped().start("python3", json::object());
  ASSERT_TRUE(model.ok());
  looped().start();
  clock_.advance(59s);
  EXPECT_TRUE(looped().find(model->id).ok());
  clock_.advance(11s);  // idle 70 s, and a cull is due
  EXPECT_FALSE(looped().find(model->id).ok());
}

TEST_F(MonitorLoopTest, NoPassRunsOnceTheRegistryIsGone) {
  looped().start();
  registry_.reset();
  clock_.advance(1s);  // the cancelled timer does not run
  EXPECT_EQ(clock_.pending_timers(), 0u);
}

// The debugger's loopback network: what a kernelspec asks for (metadata.cellgate.debugger) and
// what the operator allows (serve --allow-debugger) decide it; asked and not allowed is refused.
TEST(KernelJail, TheLoopbackNetworkIsTheKernelspecsAskAndTheOperatorsLeave) {
  kernel::KernelSpec spec;
  spec.name = "python3-debugger";
  EXPECT_FALSE(kernel_loopback(spec, true).value());
  spec.metadata = {{"debugger", true}};  // JupyterLab's flag alone opens nothing
  EXPECT_FALSE(kernel_loopback(spec, true).value());
  spec.metadata = {{"cellgate", {{"debugger", false}}}};
  EXPECT_FALSE(kernel_loopback(spec, false).value());
  spec.metadata = {{"cellgate", {{"debugger", true}}}};
  EXPECT_TRUE(kernel_loopback(spec, true).value());
  auto refused = kernel_loopback(spec, false);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kPermissionDenied);
  EXPECT_EQ(refused.error().reason, "debugger_not_allowed");
  EXPECT_NE(refused.error().message.find("--allow-debugger"), std::string::npos);
  spec.metadata = {{"cellgate", {{"debugger", "yes"}}}};
  EXPECT_EQ(kernel_loopback(spec, true).error().reason, "bad_kernelspec");
  EXPECT_TRUE(kernel_jail(jail::JailSpec{}, "k", 2000000, "/w", {}, true).loopback_network);
  EXPECT_FALSE(kernel_jail(jail::JailSpec{}, "k", 2000000, "/w", {}).loopback_network);
}

}  // namespace
}  // namespace cellgate::kernels
