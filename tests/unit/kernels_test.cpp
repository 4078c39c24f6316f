// The kernel registry (gateway/kernels) over the fake kernel: lifecycle, limits, the env
// filter, state records, interrupts, restarts and deaths, the warm pool, culling on a clock the
// test moves, and the WebSocket bridge's routing. No root, no Python, no ZeroMQ.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "cellgate/kernels/registry.hpp"
#include "cellgate/testing/fake_kernel.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using kernel::Channel;
using nlohmann::json;
using testing::eventually;
using testing::FakeBackend;
using testing::FakeCell;

// A listener that records what it is given.
class Recorder : public ChannelListener {
 public:
  void deliver(protocol::EnvelopePtr msg) override {
    std::lock_guard lock(mu_);
    got_.push_back(std::move(msg));
  }
  void kernel_gone(const std::string& reason) override {
    std::lock_guard lock(mu_);
    gone_.push_back(reason);
  }
  std::vector<protocol::EnvelopePtr> got() const {
    std::lock_guard lock(mu_);
    return got_;
  }
  std::vector<std::string> gone() const {
    std::lock_guard lock(mu_);
    return gone_;
  }
  // "<channel>:<msg_type>" of everything delivered, in order.
  std::vector<std::string> types() const {
    std::vector<std::string> out;
    for (const auto& m : got()) {
      out.push_back(std::string(kernel::to_string(m->channel())) + ":" + m->header().msg_type);
    }
    return out;
  }
  bool has(const std::string& channel_type) const {
    auto t = types();
    return std::find(t.begin(), t.end(), channel_type) != t.end();
  }
  // The gateway's own status messages ("restarting", "dead") with their reasons.
  std::vector<std::pair<std::string, std::string>> statuses() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& m : got()) {
      if (m->header().msg_type == "status" && m->parent().msg_id.empty()) {  // no request's
        const auto& c = m->message().content;
        out.emplace_back(c.value("execution_state", ""), c.value("reason", ""));
      }
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<protocol::EnvelopePtr> got_;
  std::vector<std::string> gone_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-kernels-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    root_ = dir;
    // A kernelspec with interrupt_mode "message" beside the (built-in) python3.
    fs::create_directories(root_ + "/jupyter/kernels/msgmode");
    std::ofstream(root_ + "/jupyter/kernels/msgmode/kernel.json")
        << R"({"argv": ["/bin/false", "{connection_file}"], "display_name": "Message mode",
              "language": "python", "interrupt_mode": "message"})";
    const char* old = std::getenv("JUPYTER_PATH");
    old_jupyter_path_ = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
    ::setenv("JUPYTER_PATH", (root_ + "/jupyter").c_str(), 1);
    options_.state_dir = root_ + "/state";
    options_.kernel_start_timeout = 2;
    // The test's own lease dir, and uids no real kernel of a gateway on this host runs as.
    options_.uids.lease_dir = root_ + "/uid-ranges";
    options_.uids.base = 3000000;
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

  std::shared_ptr<ManagedKernel> start_kernel(const std::string& name = "python3",
                                              const json& env = json::object()) {
    auto model = registry().start(name, env);
    EXPECT_TRUE(model.ok()) << model.error().describe();
    if (!model) {
      return nullptr;
    }
    return registry().find(model->id).value();
  }

  std::string record_of(const std::string& id) const {
    return options_.state_dir + "/kernels/" + id + ".json";
  }

  // Sends an execute_request on the gateway's own connection; returns at once.
  static void run_cell(ManagedKernel& k, const std::string& code) {
    k.connection()->send(Channel::kShell, "execute_request", kernel::execute_content(code), {});
  }

  std::string root_;
  std::optional<std::string> old_jupyter_path_;
  RegistryOptions options_;
  util::ManualLoop clock_;
  FakeBackend fake_{[](const std::string& code) {
    if (code == "hang") {
      return FakeCell().hang();
    }
    return FakeCell();
  }};
  std::unique_ptr<KernelRegistry> registry_;
};

// ---- lifecycle ----------------------------------------------------------------------------------

TEST_F(KernelsTest, StartFindListShutdown) {
  auto model = registry().start("python3", json::object());
  ASSERT_TRUE(model.ok()) << model.error().describe();
  EXPECT_EQ(model->name, "python3");
  EXPECT_EQ(model->execution_state, "idle");
  EXPECT_EQ(fake_.launches(), 1);
  auto fk = fake_.kernel(0);
  EXPECT_EQ(fk->request().spec.name, "python3");
  EXPECT_EQ(fk->request().work_dir, options_.state_dir + "/kernels/" + model->id + "/work");
  ASSERT_TRUE(fk->request().jail.has_value());
  EXPECT_EQ(fk->request().jail->name, "k-" + model->id);
  // The launcher's report has the whole start's bound (--kernel-start-timeout), not its own 10 s.
  EXPECT_EQ(fk->request().start_timeout,
            std::chrono::milliseconds(std::llround(options_.kernel_start_timeout * 1000)));

  auto found = registry().find(model->id);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found.value()->id(), model->id);
  auto listed = registry().list();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, model->id);

  auto listener = std::make_shared<Recorder>();
  ASSERT_TRUE(found.value()->attach(listener, "s1"));
  ASSERT_TRUE(registry().shutdown(model->id).ok());
  EXPECT_EQ(registry().find(model->id).error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(registry().list().empty());
  EXPECT_EQ(listener->gone(), std::vector<std::string>{"the kernel was shut down"});
  EXPECT_FALSE(found.value()->attach(std::make_shared<Recorder>(), "s2"));
  // Politely first, then the process is gone.
  auto received = fk->received();
  EXPECT_NE(std::find(received.begin(), received.end(), "control:shutdown_request"),
            received.end());
  EXPECT_FALSE(fk->running());
  EXPECT_FALSE(fs::exists(options_.state_dir + "/kernels/" + model->id));
  EXPECT_EQ(registry().shutdown(model->id).error().code, ErrorCode::kNotFound);
}

TEST_F(KernelsTest, UnknownKernelspecIsNotFound) {
  auto model = registry().start("no-such-kernel", json::object());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(fake_.launches(), 0);
}

TEST_F(KernelsTest, MaxKernelsIsResourceExhausted) {
  options_.max_kernels = 1;
  ASSERT_TRUE(start_kernel());
  auto second = registry().start("python3", json::object());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(second.error().reason, "max_kernels");
  EXPECT_EQ(fake_.launches(), 1);
}

TEST_F(KernelsTest, ClientEnvIsFiltered) {
  options_.env_allowlist = {"ALLOWED"};
  ASSERT_TRUE(start_kernel(
      "python3",
      json{{"KERNEL_USERNAME", "ada"}, {"ALLOWED", "yes"}, {"PATH", "/evil"}, {"SECRET", "no"}}));
  const auto env = fake_.kernel(0)->request().env;
  EXPECT_EQ(env.at("KERNEL_USERNAME"), "ada");
  EXPECT_EQ(env.at("ALLOWED"), "yes");
  EXPECT_EQ(env.count("SECRET"), 0u);
  EXPECT_NE(env.at("PATH"), "/evil");

  for (const json& bad : {json{{"KERNEL_X", 1}}, json{{"KERNEL_X", "a\nb"}},
                          json{{"KERNEL_X", std::string(5000, 'x')}}, json::array()}) {
    auto r = registry().start("python3", bad);
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.error().reason, "bad_env");
  }
  EXPECT_EQ(fake_.launches(), 1);
}

TEST_F(KernelsTest, StateRecordIsWrittenAtomicallyAndRemoved) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  const std::string path = record_of(k->id());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // it holds the connection key
  json record = json::parse(read_file(path));
  EXPECT_EQ(record["id"], k->id());
  EXPECT_EQ(record["kernelspec"], "python3");
  EXPECT_EQ(record["pid"], fake_.kernel(0)->pid());
  EXPECT_EQ(record["uid"], k->uid());
  EXPECT_EQ(record["work_dir"], k->work_dir());
  EXPECT_EQ(record["connection"]["key"], k->process_facts()->connection.key);
  // Nothing half-written is left beside it.
  for (const auto& entry : fs::directory_iterator(options_.state_dir + "/kernels")) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
  // A restart rewrites it for the new process.
  ASSERT_TRUE(registry().restart(k->id()).ok());
  record = json::parse(read_file(path));
  EXPECT_EQ(record["pid"], fake_.kernel(1)->pid());
  ASSERT_TRUE(registry().shutdown(k->id()).ok());
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(KernelsTest, FailedLaunchLeavesNothingBehind) {
  fake_.fail_next_launch("no cgroup here");
  auto r = registry().start("python3", json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "no cgroup here");
  EXPECT_TRUE(registry().list().empty());
  ASSERT_TRUE(fs::exists(options_.state_dir + "/kernels"));
  EXPECT_TRUE(fs::is_empty(options_.state_dir + "/kernels"));
  // Its uid is free again: the next kernel gets the same one.
  auto k = start_kernel();
  ASSERT_TRUE(k);
  EXPECT_EQ(k->uid(), 3000000u);
}

// Two gateways on one host (one lease dir) never hand out the same uids.
TEST_F(KernelsTest, TwoRegistriesOnOneHostUseDisjointUidRanges) {
  auto k1 = start_kernel();
  ASSERT_TRUE(k1);
  RegistryOptions other = options_;
  other.state_dir = root_ + "/other-state";
  FakeBackend other_fake{[](const std::string&) { return FakeCell(); }};
  KernelRegistry second(other, other_fake, [this] { return clock_.now(); });
  auto model = second.start("python3", json::object());
  ASSERT_TRUE(model.ok()) << model.error().describe();
  const uid_t u2 = second.find(model->id).value()->uid();
  EXPECT_EQ(k1->uid(), 3000000u);
  EXPECT_GE(u2, 3000000u + options_.uids.range_size);  // the second range, not the first
  EXPECT_EQ(second.shutdown(model->id).ok(), true);
}

TEST_F(KernelsTest, KernelThatNeverAnswersFailsToStartAndIsKilled) {
  options_.kernel_start_timeout = 0.1;
  fake_.set_next_unresponsive(true);
  auto r = registry().start("python3", json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().reason, "kernel_start_failed");
  ASSERT_EQ(fake_.kernels().size(), 1u);
  EXPECT_FALSE(fake_.kernel(0)->running());
  EXPECT_TRUE(registry().list().empty());
}

// ---- interrupt and restart ----------------------------------------------------------------------

TEST_F(KernelsTest, InterruptBySignal) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto listener = std::make_shared<Recorder>();
  k->attach(listener, "");
  run_cell(*k, "hang");
  ASSERT_TRUE(eventually([&] { return k->model().execution_state == "busy"; }));
  ASSERT_TRUE(registry().interrupt(k->id()).ok());
  EXPECT_EQ(fake_.kernel(0)->signals(), std::vector<int>{SIGINT});
  ASSERT_TRUE(eventually([&] { return k->model().execution_state == "idle"; }));
  EXPECT_TRUE(listener->has("iopub:error"));  // KeyboardInterrupt
}

TEST_F(KernelsTest, InterruptByMessage) {
  auto k = start_kernel("msgmode");
  ASSERT_TRUE(k);
  run_cell(*k, "hang");
  ASSERT_TRUE(eventually([&] { return fake_.kernel(0)->cell_running(); }));
  ASSERT_TRUE(registry().interrupt(k->id()).ok());
  EXPECT_TRUE(fake_.kernel(0)->signals().empty());
  auto received = fake_.kernel(0)->received();
  EXPECT_NE(std::find(received.begin(), received.end(), "control:interrupt_request"),
            received.end());
  EXPECT_TRUE(eventually([&] { return !fake_.kernel(0)->cell_running(); }));
  EXPECT_EQ(registry().interrupt("nope").error().code, ErrorCode::kNotFound);
}

TEST_F(KernelsTest, RestartReplacesTheProcessAndKeepsTheKernel) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto old_conn = k->connection();
  auto restarted = registry().restart(k->id());
  ASSERT_TRUE(restarted.ok()) << restarted.error().describe();
  EXPECT_EQ(restarted->id, k->id());
  EXPECT_EQ(restarted->execution_state, "idle");
  EXPECT_EQ(fake_.launches(), 2);
  EXPECT_FALSE(fake_.kernel(0)->running());
  EXPECT_TRUE(fake_.kernel(1)->running());
  EXPECT_NE(k->connection(), old_conn);
  EXPECT_EQ(fake_.kernel(1)->request().work_dir, k->work_dir());  // files survive restarts
}

TEST_F(KernelsTest, RestartWhileRestartingIsRefused) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  fake_.set_launch_delay(300ms);
  std::thread first([&] { EXPECT_TRUE(registry().restart(k->id()).ok()); });
  ASSERT_TRUE(eventually([&] { return k->model().execution_state == "restarting"; }));
  auto second = registry().restart(k->id());
  first.join();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(k->model().execution_state, "idle");
}

TEST_F(KernelsTest, FailedRestartLeavesTheKernelDead) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  fake_.fail_next_launch("out of uids");
  auto r = registry().restart(k->id());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(k->model().execution_state, "dead");
  EXPECT_EQ(k->model().reason, "out of uids");
  EXPECT_FALSE(k->connection());
  // A dead kernel can be restarted by its client.
  auto again = registry().restart(k->id());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->execution_state, "idle");
  EXPECT_EQ(again->reason, "");
}

// ---- deaths -----------------------------------------------------------------------------------

TEST_F(KernelsTest, DeadKernelIsRestartedAndListenersSeeRestarting) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto listener = std::make_shared<Recorder>();
  k->attach(listener, "s1");
  fake_.kernel(0)->kill("oom-killed");
  registry().monitor_once();
  EXPECT_EQ(fake_.launches(), 2);
  EXPECT_EQ(k->model().execution_state, "idle");
  EXPECT_EQ(k->restarts(), 1);
  auto statuses = listener->statuses();
  ASSERT_FALSE(statuses.empty());
  EXPECT_EQ(statuses.front().first, "restarting");
  EXPECT_NE(statuses.front().second.find("oom-killed"), std::string::npos)
      << statuses.front().second;
  EXPECT_NE(statuses.front().second.find("signaled"), std::string::npos);
  // The listener stays attached across the restart.
  EXPECT_EQ(k->model().connections, 1);
  // Nothing happens on the next pass: it runs again.
  registry().monitor_once();
  EXPECT_EQ(fake_.launches(), 2);
}

TEST_F(KernelsTest, LostHeartbeatsCountAsDeath) {
  options_.heartbeat_timeout = 0.4;  // four pings 100 ms apart
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto listener = std::make_shared<Recorder>();
  k->attach(listener, "");
  fake_.kernel(0)->stop_heartbeat();
  ASSERT_TRUE(eventually([&] { return !k->connection()->is_alive(); }));
  registry().monitor_once();
  EXPECT_EQ(fake_.launches(), 2);
  ASSERT_FALSE(listener->statuses().empty());
  EXPECT_EQ(listener->statuses().front(),
            (std::pair<std::string, std::string>{
                "restarting",
                "the kernel stopped answering heartbeats: no answer to 4 heartbeats in a row "
                "(400 ms)"}));
}

TEST_F(KernelsTest, PastTheRestartLimitTheKernelIsDead) {
  options_.restart_limit = 1;
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto listener = std::make_shared<Recorder>();
  k->attach(listener, "");
  fake_.kernel(0)->kill("first");
  registry().monitor_once();
  ASSERT_EQ(k->model().execution_state, "idle");
  fake_.kernel(1)->exit(3);
  registry().monitor_once();
  auto model = k->model();
  EXPECT_EQ(model.execution_state, "dead");
  EXPECT_EQ(model.reason, "exited with code 3");
  EXPECT_EQ(fake_.launches(), 2);
  ASSERT_EQ(listener->statuses().size(), 2u);
  EXPECT_EQ(listener->statuses()[1],
            (std::pair<std::string, std::string>{"dead", "exited with code 3"}));
  // Dead stays dead; the model keeps saying why.
  registry().monitor_once();
  EXPECT_EQ(fake_.launches(), 2);
  EXPECT_EQ(registry().find(k->id()).value()->model().execution_state, "dead");
}

TEST_F(KernelsTest, FailedAutoRestartIsDeadWithBothReasons) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto listener = std::make_shared<Recorder>();
  k->attach(listener, "");
  fake_.fail_next_launch("launcher missing");
  fake_.kernel(0)->kill("segfault");
  registry().monitor_once();
  auto model = k->model();
  EXPECT_EQ(model.execution_state, "dead");
  EXPECT_NE(model.reason.find("segfault"), std::string::npos) << model.reason;
  EXPECT_NE(model.reason.find("the restart failed: launcher missing"), std::string::npos);
  ASSERT_EQ(listener->statuses().size(), 2u);
  EXPECT_EQ(listener->statuses()[1],
            (std::pair<std::string, std::string>{"dead", "launcher missing"}));
}

TEST_F(KernelsTest, MonitorThreadRestartsADeadKernel) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  registry().start();
  EXPECT_TRUE(fake_.started());
  fake_.kernel(0)->kill();
  ASSERT_TRUE(eventually([&] { return fake_.launches() == 2; }));
  ASSERT_TRUE(eventually([&] { return k->model().execution_state == "idle"; }));
  EXPECT_GT(fake_.ticks(), 0);
}

// ---- the warm pool ----------------------------------------------------------------------------

TEST_F(KernelsTest, PoolFillsAndIsClaimedWithoutEnvThenRefilled) {
  options_.pool_size = 2;
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 2; }));
  EXPECT_EQ(fake_.launches(), 2);
  EXPECT_TRUE(registry().list().empty());  // invisible to clients
  // Each ran one silent cell, so the client's first cell is not the kernel's first.
  EXPECT_EQ(fake_.kernel(0)->executed(), std::vector<std::string>{"pass"});
  EXPECT_EQ(fake_.kernel(0)->execution_count(), 0);
  const auto pooled = registry().pool_pids("python3");
  ASSERT_EQ(pooled.size(), 2u);

  auto model = registry().start("python3", json::object());
  ASSERT_TRUE(model.ok());
  auto k = registry().find(model->id).value();
  EXPECT_EQ(k->process_facts()->pid, pooled[0]);  // the oldest one
  EXPECT_TRUE(fs::exists(record_of(model->id)));
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 2; }));
  EXPECT_EQ(fake_.launches(), 3);
}

TEST_F(KernelsTest, PoolIsNotClaimedWhenTheClientSetsEnv) {
  options_.pool_size = 1;
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 1; }));
  const pid_t pooled = registry().pool_pids("python3")[0];
  auto k = start_kernel("python3", json{{"KERNEL_X", "1"}});
  ASSERT_TRUE(k);
  EXPECT_NE(k->process_facts()->pid, pooled);
  EXPECT_EQ(fake_.find(k->process_facts()->pid)->request().env.at("KERNEL_X"), "1");
  EXPECT_EQ(registry().pool_pids("python3"), std::vector<pid_t>{pooled});
}

TEST_F(KernelsTest, DeadPooledKernelIsReplacedNotRestarted) {
  options_.pool_size = 1;
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 1; }));
  auto first = fake_.kernel(0);
  first->kill("died in the pool");
  ASSERT_TRUE(eventually([&] {
    auto pids = registry().pool_pids("python3");
    return pids.size() == 1 && pids[0] != first->pid();
  }));
  EXPECT_EQ(fake_.launches(), 2);
  EXPECT_TRUE(registry().list().empty());
  // A claim never hands out a dead one either.
  fake_.kernel(1)->kill("died before its claim");
  auto model = registry().start("python3", json::object());
  ASSERT_TRUE(model.ok());
  auto k = registry().find(model->id).value();
  EXPECT_TRUE(fake_.find(k->process_facts()->pid)->running());
}

TEST_F(KernelsTest, PooledKernelsMakeRoomUnderMaxKernels) {
  options_.max_kernels = 2;
  options_.pool_size = 2;
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 2; }));
  // The pool fills in parallel: the first launched is not always the first ready.
  const auto pooled = registry().pool_pids("python3");
  ASSERT_EQ(pooled.size(), 2u);
  // With env the pool cannot serve it; a ready pooled kernel is given up instead of refusing.
  auto k = start_kernel("python3", json{{"KERNEL_X", "1"}});
  ASSERT_TRUE(k);
  EXPECT_EQ(registry().pool_ready("python3"), 1u);
  EXPECT_FALSE(fake_.find(pooled[0])->running());  // the longest ready was evicted
  EXPECT_EQ(registry().pool_pids("python3"), std::vector<pid_t>{pooled[1]});
  auto second = start_kernel("python3", json{{"KERNEL_X", "2"}});
  ASSERT_TRUE(second);
  EXPECT_EQ(registry().pool_ready("python3"), 0u);
  auto third = registry().start("python3", json{{"KERNEL_X", "3"}});
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code, ErrorCode::kResourceExhausted);
  // The pool stays empty: no room.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(fake_.launches(), 4);
}

TEST_F(KernelsTest, PoolRefillsInParallelUpToItsBudget) {
  options_.pool_size = 4;
  options_.pool_parallel = 3;
  fake_.set_launch_delay(150ms);
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 4; }, 5s));
  EXPECT_EQ(fake_.most_concurrent_launches(), 3);
  EXPECT_EQ(fake_.launches(), 4);
}

TEST_F(KernelsTest, PoolStartsGiveWayToClientStarts) {
  options_.pool_size = 3;
  options_.pool_parallel = 2;
  registry().start();
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 3; }));
  fake_.set_launch_delay(400ms);
  fake_.reset_most_concurrent_launches();
  // A client start in flight (env: not from the pool) leaves the pool one start at a time.
  auto client = std::async(std::launch::async, [&] {
    return registry().start("python3", json{{"KERNEL_X", "1"}});
  });
  ASSERT_TRUE(eventually([&] { return fake_.launches() == 4; }));
  ASSERT_TRUE(registry().start("python3", json::object()).ok());  // two claims: two refills
  ASSERT_TRUE(registry().start("python3", json::object()).ok());
  ASSERT_TRUE(client.get().ok());
  ASSERT_TRUE(eventually([&] { return registry().pool_ready("python3") == 3; }, 5s));
  EXPECT_EQ(fake_.launches(), 6);
  EXPECT_EQ(fake_.most_concurrent_launches(), 2);  // the client's and one pool start
}

TEST_F(KernelsTest, PoolWaitsForFastLaunchesUnlessTheyWillNeverBe) {
  options_.pool_size = 1;
  fake_.set_fast(false);  // "never fast": fill cold at once
  registry().start();
  EXPECT_TRUE(eventually([&] { return registry().pool_ready("python3") == 1; }, 2s));
}

// ---- culling ----------------------------------------------------------------------------------

class CullTest : public KernelsTest {
 protected:
  void SetUp() override {
    KernelsTest::SetUp();
    options_.cull_idle_timeout = 60;
    options_.cull_interval = 10;
  }
};

TEST_F(CullTest, IdleKernelIsCulledOnceTheClockPassesTheTimeout) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  registry().monitor_once();  // culls at once, then every 10 s
  clock_.advance(59s);
  registry().monitor_once();
  EXPECT_TRUE(registry().find(k->id()).ok());
  clock_.advance(10s);
  registry().monitor_once();
  EXPECT_FALSE(registry().find(k->id()).ok());
  EXPECT_FALSE(fs::exists(record_of(k->id())));
}

TEST_F(CullTest, ActivityResetsTheIdleTime) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto listener = std::make_shared<Recorder>();
  clock_.advance(50s);
  protocol::Session client("user", "s1");
  ASSERT_TRUE(k->attach(listener, "s1"));  // for the request's iopub; detached before the cull
  ASSERT_TRUE(k->post(Channel::kShell,
                      protocol::Envelope::from_message(
                          Channel::kShell, client.make("kernel_info_request", json::object())),
                      listener)
                  .ok());
  // The request's last message is its idle status, after the reply: wait for it, so that no
  // activity of this request is seen after the clock moves on (under load it came after).
  ASSERT_TRUE(eventually([&] {
    const auto t = listener->types();
    return listener->has("shell:kernel_info_reply") &&
           std::count(t.begin(), t.end(), "iopub:status") >= 2;
  }));
  k->detach(listener.get());  // a connected kernel is never culled (cull_connected is off)
  clock_.advance(20s);
  registry().monitor_once();
  EXPECT_TRUE(registry().find(k->id()).ok());
  clock_.advance(41s);
  registry().monitor_once();
  EXPECT_FALSE(registry().find(k->id()).ok());
}

TEST_F(CullTest, CullsOnlyEveryInterval) {
  options_.cull_interval = 100;
  auto k = start_kernel();
  ASSERT_TRUE(k);
  registry().monitor_once();  // a cull now (nothing idle), the next one 100 s later
  clock_.advance(61s);
  registry().monitor_once();  // idle long enough, but no cull is due
  EXPECT_TRUE(registry().find(k->id()).ok());
  clock_.advance(40s);
  registry().monitor_once();
  EXPECT_FALSE(registry().find(k->id()).ok());
}

TEST_F(CullTest, ConnectedKernelsAreKeptUnlessCullConnected) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto listener = std::make_shared<Recorder>();
  k->attach(listener, "s1");
  clock_.advance(120s);
  registry().monitor_once();
  EXPECT_TRUE(registry().find(k->id()).ok());
  EXPECT_TRUE(listener->gone().empty());

  registry_.reset();
  options_.cull_connected = true;
  auto k2 = start_kernel();
  ASSERT_TRUE(k2);
  auto l2 = std::make_shared<Recorder>();
  k2->attach(l2, "s2");
  clock_.advance(120s);
  registry().monitor_once();
  EXPECT_FALSE(registry().find(k2->id()).ok());
  EXPECT_EQ(l2->gone(), std::vector<std::string>{"the kernel was shut down"});
}

TEST_F(CullTest, BusyKernelsAreKeptUnlessCullBusy) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  run_cell(*k, "hang");
  ASSERT_TRUE(eventually([&] { return k->model().execution_state == "busy"; }));
  clock_.advance(120s);
  registry().monitor_once();
  EXPECT_TRUE(registry().find(k->id()).ok());

  registry_.reset();
  options_.cull_busy = true;
  auto k2 = start_kernel();
  ASSERT_TRUE(k2);
  run_cell(*k2, "hang");
  ASSERT_TRUE(eventually([&] { return k2->model().execution_state == "busy"; }));
  // A message of the cell's that arrives after the clock moved (its execute_input, say) is
  // activity at the new time: move the clock again until the monitor sees two idle minutes.
  EXPECT_TRUE(eventually([&] {
    clock_.advance(120s);
    registry().monitor_once();
    return !registry().find(k2->id()).ok();
  }));
}

TEST_F(CullTest, DeadKernelsAreCulledAtOnce) {
  options_.restart_limit = 0;
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto listener = std::make_shared<Recorder>();
  k->attach(listener, "s1");  // connected, and not idle long: dead is enough
  fake_.kernel(0)->kill();
  registry().monitor_once();
  EXPECT_FALSE(registry().find(k->id()).ok());
}

// ---- the bridge -------------------------------------------------------------------------------

protocol::EnvelopePtr request_from(const std::string& session, const std::string& type,
                                   Channel channel = Channel::kShell) {
  protocol::Session s("user", session);
  return protocol::Envelope::from_message(channel, s.make(type, json::object()));
}

TEST_F(KernelsTest, IopubFansOutAndRepliesGoToTheirSender) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  ASSERT_TRUE(k->attach(a, "sa"));
  ASSERT_TRUE(k->attach(b, "sb"));
  EXPECT_EQ(k->model().connections, 2);
  ASSERT_TRUE(k->post(Channel::kShell, request_from("sa", "kernel_info_request"), a).ok());
  ASSERT_TRUE(eventually([&] { return a->has("shell:kernel_info_reply"); }));
  ASSERT_TRUE(eventually([&] { return b->types().size() == 2; }));
  EXPECT_EQ(a->types(),
            (std::vector<std::string>{"iopub:status", "shell:kernel_info_reply", "iopub:status"}));
  EXPECT_EQ(b->types(), (std::vector<std::string>{"iopub:status", "iopub:status"}));
  // Every listener gets the same envelope: made once.
  EXPECT_EQ(a->got()[0].get(), b->got()[0].get());
  // A control reply goes the same way.
  ASSERT_TRUE(
      k->post(Channel::kControl, request_from("sb", "kernel_info_request", Channel::kControl), b)
          .ok());
  ASSERT_TRUE(eventually([&] { return b->has("control:kernel_info_reply"); }));
  EXPECT_FALSE(a->has("control:kernel_info_reply"));
}

TEST_F(KernelsTest, StdinRequestsGoToTheSenderOfTheCell) {
  fake_.set_responder([](const std::string&) {
    return FakeCell().input("name? ", [](const std::string& v, FakeCell& rest) { rest.out(v); });
  });
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  k->attach(a, "sa");
  k->attach(b, "sb");
  protocol::Session sa("user", "sa");
  protocol::Message req = sa.make("execute_request", kernel::execute_content("input()", true));
  ASSERT_TRUE(
      k->post(Channel::kShell, protocol::Envelope::from_message(Channel::kShell, req), a).ok());
  ASSERT_TRUE(eventually([&] { return a->has("stdin:input_request"); }));
  EXPECT_FALSE(b->has("stdin:input_request"));
  protocol::EnvelopePtr input_request;
  for (const auto& m : a->got()) {
    if (m->header().msg_type == "input_request") {
      input_request = m;
    }
  }
  protocol::Message reply =
      sa.make_reply(input_request->message(), "input_reply", json{{"value", "Ada"}});
  ASSERT_TRUE(
      k->post(Channel::kStdin, protocol::Envelope::from_message(Channel::kStdin, reply), a).ok());
  ASSERT_TRUE(eventually([&] { return a->has("shell:execute_reply"); }));
  EXPECT_FALSE(b->has("shell:execute_reply"));
  EXPECT_TRUE(b->has("iopub:stream"));
}

TEST_F(KernelsTest, SecondListenerWithTheSameSessionReplacesTheFirst) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto first = std::make_shared<Recorder>();
  auto second = std::make_shared<Recorder>();
  ASSERT_TRUE(k->attach(first, "same"));
  ASSERT_TRUE(k->attach(second, "same"));
  EXPECT_EQ(first->gone(),
            std::vector<std::string>{"replaced by a new connection with the same session_id"});
  EXPECT_TRUE(second->gone().empty());
  EXPECT_EQ(k->model().connections, 1);
  ASSERT_TRUE(k->post(Channel::kShell, request_from("same", "kernel_info_request"), second).ok());
  ASSERT_TRUE(eventually([&] { return second->has("shell:kernel_info_reply"); }));
  EXPECT_TRUE(first->got().empty());
}

TEST_F(KernelsTest, ADetachedListenerGetsNothingAndItsSessionBackGetsWhatItMissed) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  k->attach(a, "sa");
  k->attach(b, "sb");
  k->detach(a.get());
  EXPECT_EQ(k->model().connections, 1);
  // While "sa" is away: b's request. Its iopub is everyone's, its reply is b's alone.
  ASSERT_TRUE(k->post(Channel::kShell, request_from("sb", "kernel_info_request"), b).ok());
  ASSERT_TRUE(eventually([&] { return b->types().size() == 3; }));
  EXPECT_TRUE(a->got().empty());
  auto back = std::make_shared<Recorder>();
  ASSERT_TRUE(k->attach(back, "sa"));
  EXPECT_EQ(back->types(), (std::vector<std::string>{"iopub:status", "iopub:status"}));
  EXPECT_EQ(back->got()[0].get(), b->got()[0].get());  // the same envelopes, not copies
  // Given once: a second return gets nothing old; another session got nothing kept.
  k->detach(back.get());
  auto again = std::make_shared<Recorder>();
  ASSERT_TRUE(k->attach(again, "sa"));
  EXPECT_TRUE(again->got().empty());
  auto stranger = std::make_shared<Recorder>();
  ASSERT_TRUE(k->attach(stranger, "sc"));
  EXPECT_TRUE(stranger->got().empty());
}

TEST_F(KernelsTest, WhatAnAbsentClientMissesIsBoundedAndTheNewestIsKept) {
  const std::string mib(1u << 20, 'x');
  fake_.set_responder([&mib](const std::string&) {
    FakeCell cell;
    for (int i = 0; i < 12; ++i) {
      cell.out(mib);
    }
    return cell.out("last");
  });
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto a = std::make_shared<Recorder>();
  auto watcher = std::make_shared<Recorder>();
  k->attach(a, "sa");
  k->attach(watcher, "");
  k->detach(a.get());
  run_cell(*k, "print");
  ASSERT_TRUE(eventually([&] {
    for (const auto& m : watcher->got()) {
      if (m->header().msg_type == "status" &&
          m->message().content.value("execution_state", "") == "idle") {
        return true;
      }
    }
    return false;
  }));
  auto back = std::make_shared<Recorder>();
  ASSERT_TRUE(k->attach(back, "sa"));
  std::size_t bytes = 0;
  for (const auto& m : back->got()) {
    bytes += m->size();
  }
  EXPECT_LE(bytes, std::size_t{8} << 20);
  EXPECT_LT(back->got().size(), watcher->got().size());  // the oldest went
  ASSERT_FALSE(back->got().empty());
  EXPECT_EQ(back->got().back().get(), watcher->got().back().get());  // the newest stayed
}

TEST_F(KernelsTest, ExecutionStateFollowsTrackedStatusesOnly) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  auto a = std::make_shared<Recorder>();
  k->attach(a, "sa");
  run_cell(*k, "hang");
  ASSERT_TRUE(eventually([&] { return k->model().execution_state == "busy"; }));
  // kernel_info's busy/idle pair does not make it look idle while the cell runs… (the fake
  // answers kernel_info on shell only after the cell, so ask on control).
  ASSERT_TRUE(
      k->post(Channel::kControl, request_from("sa", "kernel_info_request", Channel::kControl), a)
          .ok());
  ASSERT_TRUE(eventually([&] { return a->has("control:kernel_info_reply"); }));
  // busy (the cell), then busy and idle (kernel_info) have arrived.
  ASSERT_TRUE(eventually([&] {
    auto t = a->types();
    return std::count(t.begin(), t.end(), "iopub:status") >= 3;
  }));
  EXPECT_EQ(k->model().execution_state, "busy");
  ASSERT_TRUE(registry().interrupt(k->id()).ok());
  EXPECT_TRUE(eventually([&] { return k->model().execution_state == "idle"; }));
}

TEST_F(KernelsTest, PostToAGoneKernelIsUnavailable) {
  auto k = start_kernel();
  ASSERT_TRUE(k);
  ASSERT_TRUE(registry().shutdown(k->id()).ok());
  auto r = k->post(Channel::kShell, request_from("s", "kernel_info_request"), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
}

// ---- ManagedKernel's transitions, one by one ----------------------------------------------------

class StateMachineTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManagedKernel> make() {
    kernel::KernelSpec spec;
    spec.name = "python3";
    return std::make_shared<ManagedKernel>("k1", spec, "/nonexistent/k1", 2000000,
                                           std::map<std::string, std::string>{},
                                           [this] { return clock_.now(); });
  }
  ManagedKernel::Running running() {
    auto process = fake_.launch({});
    auto conn = fake_.connect(*process.value(), {});
    return {std::move(process).value(), std::move(conn).value()};
  }
  util::ManualLoop clock_;
  FakeBackend fake_;
};

TEST_F(StateMachineTest, StartingToIdle) {
  auto k = make();
  EXPECT_EQ(k->state(), KernelState::kStarting);
  EXPECT_EQ(k->model().execution_state, "starting");
  EXPECT_EQ(k->begin_restart().error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(k->died("x", 5), ManagedKernel::AfterDeath::kIgnored);
  ASSERT_TRUE(k->started(running()).ok());
  EXPECT_EQ(k->state(), KernelState::kIdle);
  EXPECT_TRUE(k->connection());
  // Started twice: refused, and the second process is stopped.
  EXPECT_EQ(k->started(running()).error().code, ErrorCode::kFailedPrecondition);
  EXPECT_FALSE(fake_.kernel(1)->running());
  EXPECT_TRUE(fake_.kernel(0)->running());
}

TEST_F(StateMachineTest, DeathsCountAgainstTheLimitAndAClientRestartResetsThem) {
  auto k = make();
  ASSERT_TRUE(k->started(running()).ok());
  EXPECT_EQ(k->died("one", 2), ManagedKernel::AfterDeath::kRestart);
  EXPECT_EQ(k->state(), KernelState::kRestarting);
  EXPECT_EQ(k->died("again", 2), ManagedKernel::AfterDeath::kIgnored);  // already restarting
  k->stop_process();
  EXPECT_FALSE(k->connection());
  EXPECT_FALSE(fake_.kernel(0)->running());
  ASSERT_TRUE(k->started(running()).ok());
  EXPECT_EQ(k->reason(), "");
  EXPECT_EQ(k->died("two", 2), ManagedKernel::AfterDeath::kRestart);
  ASSERT_TRUE(k->started(running()).ok());
  EXPECT_EQ(k->died("three", 2), ManagedKernel::AfterDeath::kDead);
  EXPECT_EQ(k->state(), KernelState::kDead);
  EXPECT_EQ(k->model().reason, "three");
  EXPECT_EQ(k->died("four", 2), ManagedKernel::AfterDeath::kIgnored);
  ASSERT_TRUE(k->begin_restart().ok());
  k->stop_process();
  ASSERT_TRUE(k->started(running(), /*client_restart=*/true).ok());
  EXPECT_EQ(k->restarts(), 0);
  EXPECT_EQ(k->died("five", 2), ManagedKernel::AfterDeath::kRestart);
}

TEST_F(StateMachineTest, EndFromAnyStateIsGone) {
  auto k = make();
  auto listener = std::make_shared<Recorder>();
  ASSERT_TRUE(k->attach(listener, "s"));
  ASSERT_TRUE(k->started(running()).ok());
  auto ended = k->end();
  EXPECT_EQ(k->state(), KernelState::kGone);
  EXPECT_EQ(k->model().execution_state, "dead");
  ASSERT_EQ(ended.listeners.size(), 1u);
  EXPECT_TRUE(ended.running.connection);
  EXPECT_FALSE(k->connection());
  EXPECT_TRUE(k->end().listeners.empty());  // once
  EXPECT_EQ(k->begin_restart().error().code, ErrorCode::kNotFound);
  EXPECT_EQ(k->started(running()).error().code, ErrorCode::kFailedPrecondition);
  EXPECT_FALSE(k->attach(listener, "s"));
  ended.running.connection.reset();
  ended.running.process.reset();
  EXPECT_FALSE(fake_.kernel(0)->running());
}

TEST_F(StateMachineTest, RestartFailedIsDeadWithTheReason) {
  auto k = make();
  ASSERT_TRUE(k->started(running()).ok());
  ASSERT_TRUE(k->begin_restart().ok());
  EXPECT_EQ(k->model().execution_state, "restarting");
  k->restart_failed("no launcher");
  EXPECT_EQ(k->state(), KernelState::kDead);
  EXPECT_EQ(k->reason(), "no launcher");
  k->restart_failed("ignored when not restarting");
  EXPECT_EQ(k->reason(), "no launcher");
}

TEST_F(StateMachineTest, LastActivityIsOnTheInjectedClock) {
  auto k = make();
  const auto t0 = k->last_activity();
  clock_.advance(30s);
  EXPECT_EQ(k->last_activity(), t0);
  k->touch();
  EXPECT_EQ(k->last_activity() - t0, 30s);
}

}  // namespace
}  // namespace cellgate::kernels
