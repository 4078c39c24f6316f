// The warm pool of KernelRegistry against real jailed ipykernels: it fills, a start claims a ready
// kernel and the pool refills, claimed kernels are separate, a client env is a pool miss, a dead
// pooled kernel is replaced, pool size 0 starts nothing, refills respect max_kernels. Needs root
// (the jail); skips otherwise.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/kernel/backend.hpp"
#include "cellgate/kernel/client.hpp"
#include "cellgate/kernels/registry.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using kernel::Channel;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Kernel starts on a loaded two-core machine take a few seconds; this bounds each wait.
constexpr auto kFillTimeout = 90s;

bool wait_until(const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() >= deadline) {
      return false;
    }
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

bool contains(const std::vector<pid_t>& v, pid_t p) {
  return std::find(v.begin(), v.end(), p) != v.end();
}

std::string make_temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "cellgate-pool-test-XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr) << "mkdtemp failed";
  return pattern;
}

// The cell's stdout, or a description of how it failed.
std::string output_of(KernelRegistry& km, const std::string& id, const std::string& code) {
  auto k = km.find(id);
  if (!k) {
    return "<" + k.error().describe() + ">";
  }
  auto client = k.value()->connection();
  if (!client) {
    return "<no client>";
  }
  auto r = client->request(Channel::kShell, "execute_request", kernel::execute_content(code), 30s);
  if (!r) {
    return "<request failed: " + r.error().describe() + ">";
  }
  if (!r->reply) {
    return "<no reply>";
  }
  if (r->reply->content.value("status", "") != "ok") {
    return "<" + r->reply->content.value("ename", "error") + ">";
  }
  std::string out;
  for (const auto& [ch, msg] : r->messages) {
    if (ch == Channel::kIopub && msg.msg_type() == "stream" &&
        msg.content.value("name", "") == "stdout") {
      out += msg.content.value("text", "");
    }
  }
  return out;
}

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "jailed kernels need root (euid " << ::geteuid() << ")";
    }
    if (auto spec = kernel::find_kernelspec("python3"); !spec) {
      GTEST_SKIP() << "no python3 kernelspec here: " << spec.error().describe();
    }
    root_ = make_temp_dir();
  }

  void TearDown() override {
    manager_.reset();
    if (!root_.empty()) {
      std::error_code ec;
      fs::remove_all(root_, ec);
    }
  }

  RegistryOptions options(int pool_size) const {
    RegistryOptions o;
    o.state_dir = root_ + "/state";
    o.kernel_start_timeout = 60;
    o.pool_size = pool_size;
    o.pool_kernels = {"python3"};
    return o;
  }

  KernelRegistry& make_manager(RegistryOptions o) {
    manager_ = std::make_unique<KernelRegistry>(std::move(o), backend_);
    manager_->start();
    return *manager_;
  }

  // Waits for `n` ready pooled python3 kernels.
  bool wait_pool(std::size_t n) {
    return wait_until([&] { return manager_->pool_ready("python3") == n; }, kFillTimeout);
  }

  // The kernel pid its state record names (-1 without one).
  int record_pid(const std::string& id) const {
    std::ifstream in(manager_->state_dir() + "/kernels/" + id + ".json");
    json j = json::parse(std::string((std::istreambuf_iterator<char>(in)), {}), nullptr, false);
    return j.is_object() && j.contains("pid") && j["pid"].is_number_integer() ? j["pid"].get<int>()
                                                                              : -1;
  }

  // Kernel home dirs under the state dir: live, pooled and starting kernels alike.
  std::size_t kernel_dirs() const {
    std::size_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(manager_->state_dir() + "/kernels", ec)) {
      n += e.is_directory() ? 1 : 0;
    }
    return n;
  }

  std::string root_;
  kernel::ProcessBackend backend_{{}};  // the launcher, no zygote; outlives the registry
  std::unique_ptr<KernelRegistry> manager_;
};

TEST_F(PoolTest, StartClaimsAReadyKernelAndThePoolRefills) {
  KernelRegistry& km = make_manager(options(2));
  ASSERT_TRUE(wait_pool(2)) << "ready: " << km.pool_ready("python3");
  EXPECT_TRUE(km.list().empty()) << "pooled kernels are invisible to clients";
  const std::vector<pid_t> pooled = km.pool_pids("python3");
  ASSERT_EQ(pooled.size(), 2u);

  const auto t0 = Clock::now();
  auto k = km.start("python3", json::object());
  const auto took = Clock::now() - t0;
  ASSERT_TRUE(k) << k.error().describe();
  // A cold start takes about a second; a claim takes milliseconds.
  EXPECT_LT(took, 250ms) << std::chrono::duration<double>(took).count() << " s";
  EXPECT_EQ(k->execution_state, "idle");
  EXPECT_TRUE(contains(pooled, record_pid(k->id)))
      << "the state record names a pooled process (pid " << record_pid(k->id) << ")";
  ASSERT_EQ(km.list().size(), 1u);
  EXPECT_EQ(km.list().front().id, k->id);
  EXPECT_TRUE(km.find(k->id));
  // The pool's warm-up cell left no trace: this is the kernel's first counted cell.
  auto client = km.find(k->id).value()->connection();
  ASSERT_TRUE(client);
  auto first = client->request(Channel::kShell, "execute_request",
                               kernel::execute_content("print(len(In))"), 30s);
  ASSERT_TRUE(first && first->reply) << (first ? "no reply" : first.error().describe());
  EXPECT_EQ(first->reply->content.value("execution_count", -1), 1);
  EXPECT_EQ(output_of(km, k->id, "print(1)"), "1\n");
  EXPECT_EQ(output_of(km, k->id, "print(In[1])"), "print(len(In))\n");

  ASSERT_TRUE(wait_pool(2)) << "the pool did not refill: " << km.pool_ready("python3");
  EXPECT_FALSE(contains(km.pool_pids("python3"), record_pid(k->id)))
      << "a claimed kernel is still in the pool";
  EXPECT_EQ(km.list().size(), 1u) << "refills are not listed";

  // The default kernelspec ("") is the pooled python3 one.
  auto d = km.start("", json());
  ASSERT_TRUE(d) << d.error().describe();
  EXPECT_EQ(d->name, "python3");
  EXPECT_EQ(km.list().size(), 2u);
}

TEST_F(PoolTest, ClaimedKernelsAreSeparateAndNeverReturnToThePool) {
  KernelRegistry& km = make_manager(options(2));
  ASSERT_TRUE(wait_pool(2));
  auto a = km.start("python3", json());
  ASSERT_TRUE(a) << a.error().describe();
  auto b = km.start("python3", json());
  ASSERT_TRUE(b) << b.error().describe();
  EXPECT_NE(a->id, b->id);
  const int pid_a = record_pid(a->id);
  const int pid_b = record_pid(b->id);
  EXPECT_GT(pid_a, 0);
  EXPECT_GT(pid_b, 0);
  EXPECT_NE(pid_a, pid_b);

  EXPECT_EQ(output_of(km, a->id, "x = 41\nprint(x + 1)"), "42\n");
  EXPECT_EQ(output_of(km, b->id, "print(x)"), "<NameError>") << "state leaked between kernels";

  ASSERT_TRUE(km.shutdown(a->id));
  ASSERT_TRUE(wait_pool(2));
  const auto pooled = km.pool_pids("python3");
  EXPECT_FALSE(contains(pooled, pid_a)) << "a deleted kernel went back to the pool";
  EXPECT_FALSE(contains(pooled, pid_b)) << "a claimed kernel went back to the pool";
  EXPECT_EQ(::kill(pid_a, 0), -1) << "the deleted kernel still runs";
  ASSERT_EQ(km.list().size(), 1u);
  EXPECT_EQ(km.list().front().id, b->id);
}

TEST_F(PoolTest, ClientEnvIsAPoolMiss) {
  RegistryOptions o = options(2);
  o.env_allowlist = {"ALLOWED_VAR"};
  KernelRegistry& km = make_manager(o);
  ASSERT_TRUE(wait_pool(2));
  const auto pooled = km.pool_pids("python3");

  auto k = km.start("python3", json{{"KERNEL_FOO", "bar"}, {"ALLOWED_VAR", "yes"}});
  ASSERT_TRUE(k) << k.error().describe();
  EXPECT_FALSE(contains(pooled, record_pid(k->id))) << "a kernel with client env was pooled";
  EXPECT_EQ(output_of(km, k->id, "import os; print(os.environ.get('KERNEL_FOO'))"), "bar\n");
  EXPECT_EQ(output_of(km, k->id, "import os; print(os.environ.get('ALLOWED_VAR'))"), "yes\n");
  EXPECT_EQ(km.pool_pids("python3"), pooled) << "the miss consumed a pooled kernel";

  // Variables the filter drops (jupyter_server sends its whole environment) leave nothing that
  // a pooled kernel lacks: a hit.
  auto hit = km.start("python3", json{{"PATH", "/usr/bin"}, {"HOME", "/root"}});
  ASSERT_TRUE(hit) << hit.error().describe();
  EXPECT_TRUE(contains(pooled, record_pid(hit->id))) << "filtered-away env should be a pool hit";
  EXPECT_EQ(output_of(km, hit->id, "import os; print(os.environ.get('KERNEL_FOO'))"), "None\n");
}

TEST_F(PoolTest, DeadPooledKernelIsReplacedNotRestartedIntoTheLiveSet) {
  KernelRegistry& km = make_manager(options(2));
  ASSERT_TRUE(wait_pool(2));
  const auto pooled = km.pool_pids("python3");
  ASSERT_EQ(pooled.size(), 2u);
  ASSERT_GT(pooled.front(), 1) << "not a host pid";
  ASSERT_NE(pooled.front(), ::getpid());
  ASSERT_EQ(::kill(pooled.front(), SIGKILL), 0) << "kill(" << pooled.front() << ")";

  const bool replaced = wait_until(
      [&] {
        const auto now = km.pool_pids("python3");
        return now.size() == 2 && !contains(now, pooled.front());
      },
      kFillTimeout);
  EXPECT_TRUE(replaced) << "pooled pids now: " << km.pool_pids("python3").size();
  EXPECT_TRUE(contains(km.pool_pids("python3"), pooled.back())) << "the live one was dropped";
  EXPECT_TRUE(km.list().empty()) << "the dead pooled kernel showed up as a client's kernel";

  auto k = km.start("python3", json());
  ASSERT_TRUE(k) << k.error().describe();
  EXPECT_NE(record_pid(k->id), pooled.front());
  EXPECT_EQ(output_of(km, k->id, "print('alive')"), "alive\n");
}

TEST_F(PoolTest, PoolSizeZeroStartsNothingInAdvance) {
  RegistryOptions o = options(0);
  KernelRegistry& km = make_manager(o);
  std::this_thread::sleep_for(2s);  // longer than a pool start takes to create its kernel dir
  EXPECT_EQ(km.pool_ready("python3"), 0u);
  EXPECT_EQ(kernel_dirs(), 0u) << "a kernel was started before anyone asked";
  auto k = km.start("python3", json());
  ASSERT_TRUE(k) << k.error().describe();
  EXPECT_EQ(output_of(km, k->id, "print(2)"), "2\n");
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(kernel_dirs(), 1u);
  EXPECT_EQ(km.pool_ready("python3"), 0u);
}

TEST_F(PoolTest, RefillsRespectMaxKernelsAndClaimsAreNotRefused) {
  RegistryOptions o = options(2);
  o.max_kernels = 3;
  KernelRegistry& km = make_manager(o);
  ASSERT_TRUE(wait_pool(2));
  auto a = km.start("python3", json());
  ASSERT_TRUE(a) << a.error().describe();
  ASSERT_TRUE(wait_pool(2)) << "1 live + 2 pooled fit in 3";
  auto b = km.start("python3", json());
  ASSERT_TRUE(b) << b.error().describe();
  // 2 live + 1 pooled = 3: no refill may start, however long we wait.
  std::this_thread::sleep_for(3s);
  EXPECT_EQ(km.pool_ready("python3"), 1u);
  EXPECT_EQ(kernel_dirs(), 3u) << "live + pooled + starting kernels exceed max_kernels";

  // At the limit, the last pooled kernel is still handed out.
  auto c = km.start("python3", json());
  ASSERT_TRUE(c) << "a claim was refused at the limit: " << c.error().describe();
  EXPECT_EQ(output_of(km, c->id, "print(3)"), "3\n");
  auto d = km.start("python3", json());
  ASSERT_FALSE(d) << "a fourth kernel started: " << d->id;
  EXPECT_EQ(d.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(km.pool_ready("python3"), 0u);
  EXPECT_EQ(km.list().size(), 3u);
}

TEST_F(PoolTest, AMissAtTheLimitEndsAPooledKernelInsteadOfRefusingTheClient) {
  RegistryOptions o = options(2);
  o.max_kernels = 2;
  KernelRegistry& km = make_manager(o);
  ASSERT_TRUE(wait_pool(2));
  auto k = km.start("python3", json{{"KERNEL_MISS", "1"}});
  ASSERT_TRUE(k) << "the pool cost a client its kernel: " << k.error().describe();
  EXPECT_EQ(output_of(km, k->id, "import os; print(os.environ['KERNEL_MISS'])"), "1\n");
  EXPECT_EQ(km.pool_ready("python3"), 1u);
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(kernel_dirs(), 2u);
}

}  // namespace
}  // namespace cellgate::kernels
