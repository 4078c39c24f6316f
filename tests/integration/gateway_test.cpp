// KernelRegistry against real jailed ipykernels: crash and OOM handling, restart, shutdown, the
// state records and the kernel limit. Needs root (the jail); skips otherwise.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/http/message.hpp"
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

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) {
    out += (out.empty() ? "" : ",") + s;
  }
  return out;
}

// Keeps the iopub status messages a kernel delivers, and whether it was told the kernel is gone.
class RecordingListener : public ChannelListener {
 public:
  void deliver(protocol::EnvelopePtr msg) override {
    if (msg->channel() != Channel::kIopub || msg->header().msg_type != "status") {
      return;
    }
    std::lock_guard lock(mu_);
    states_.push_back(msg->message().content.value("execution_state", ""));
    cv_.notify_all();
  }
  void kernel_gone(const std::string& reason) override {
    std::lock_guard lock(mu_);
    gone_reason_ = reason;
    gone_ = true;
    cv_.notify_all();
  }

  bool wait_for_state(const std::string& state, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return contains(states_, state); });
  }
  std::vector<std::string> states() const {
    std::lock_guard lock(mu_);
    return states_;
  }
  bool gone() const {
    std::lock_guard lock(mu_);
    return gone_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> states_;
  std::string gone_reason_;
  bool gone_ = false;
};

std::string make_temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "cellgate-gateway-test-XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr) << "mkdtemp failed";
  return pattern;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return json::parse(text, nullptr, false);
}

std::string stdout_of(const kernel::Collected& c) {
  std::string out;
  for (const auto& [ch, msg] : c.messages) {
    if (ch == Channel::kIopub && msg.msg_type() == "stream" &&
        msg.content.value("name", "") == "stdout") {
      out += msg.content.value("text", "");
    }
  }
  return out;
}

// Runs a cell through the gateway's own client of the kernel.
Result<kernel::Collected> run(KernelRegistry& km, const std::string& id, const std::string& code) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, km.find(id));
  auto client = k->connection();
  if (!client) {
    return make_error(ErrorCode::kUnavailable, "no_client", "the kernel has no client");
  }
  return client->request(Channel::kShell, "execute_request", kernel::execute_content(code), 30s);
}

// The cell's stdout, or a description of how it failed.
std::string output_of(KernelRegistry& km, const std::string& id, const std::string& code) {
  auto r = run(km, id, code);
  if (!r) {
    return "<request failed: " + r.error().describe() + ">";
  }
  if (!r->reply) {
    return "<no reply>";
  }
  if (r->reply->content.value("status", "") != "ok") {
    return "<" + r->reply->content.dump() + ">";
  }
  return stdout_of(*r);
}

// Sends a cell without waiting for it (it is meant to kill the kernel).
void fire(KernelRegistry& km, const std::string& id, const std::string& code) {
  auto k = km.find(id);
  ASSERT_TRUE(k) << k.error().describe();
  auto client = k.value()->connection();
  ASSERT_TRUE(client);
  client->send(Channel::kShell, "execute_request", kernel::execute_content(code),
               kernel::RequestHandlers{});
}

std::string state_of(KernelRegistry& km, const std::string& id) {
  auto k = km.find(id);
  return k ? k.value()->model().execution_state : "<not found>";
}

// Polls the model until `state` after having seen anything else, or the timeout; returns every
// state seen, in order, without repeats.
std::vector<std::string> watch_until(KernelRegistry& km, const std::string& id,
                                     const std::string& state, std::chrono::seconds timeout) {
  std::vector<std::string> seen;
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const std::string now = state_of(km, id);
    if (seen.empty() || seen.back() != now) {
      seen.push_back(now);
    }
    if (now == state && seen.size() > 1) {
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  return seen;
}

int record_pid(const std::string& path) {
  json j = read_json(path);
  return j.is_object() && j.contains("pid") && j["pid"].is_number_integer() ? j["pid"].get<int>()
                                                                            : -1;
}

class GatewayTest : public ::testing::Test {
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
    manager_.reset();  // shuts every kernel down
    if (!root_.empty()) {
      std::error_code ec;
      fs::remove_all(root_, ec);
    }
  }

  RegistryOptions options() const {
    RegistryOptions o;
    o.state_dir = root_ + "/state";
    o.kernel_start_timeout = 60;
    return o;
  }

  KernelRegistry& make_manager(RegistryOptions o) {
    manager_ = std::make_unique<KernelRegistry>(std::move(o), backend_);
    manager_->start();
    return *manager_;
  }

  std::string record_path(const std::string& id) const {
    return manager_->state_dir() + "/kernels/" + id + ".json";
  }

  std::string root_;
  kernel::ProcessBackend backend_{{}};  // the launcher, no zygote; outlives the registry
  std::unique_ptr<KernelRegistry> manager_;
};

TEST_F(GatewayTest, CrashedKernelIsRestartedAndTheOtherKeepsItsState) {
  RegistryOptions o = options();
  o.restart_limit = 2;
  KernelRegistry& km = make_manager(o);
  auto a = km.start("python3", json());
  ASSERT_TRUE(a) << a.error().describe();
  auto b = km.start("python3", json());
  ASSERT_TRUE(b) << b.error().describe();
  EXPECT_NE(a->id, b->id);
  EXPECT_EQ(a->execution_state, "idle");
  EXPECT_EQ(b->execution_state, "idle");

  EXPECT_EQ(output_of(km, a->id, "x = 'kept'"), "");
  EXPECT_EQ(output_of(km, b->id, "y = 'lost'\nprint(y)"), "lost\n");
  const int old_pid = record_pid(record_path(b->id));
  EXPECT_GT(old_pid, 0);
  auto listener = std::make_shared<RecordingListener>();
  ASSERT_TRUE(km.find(b->id).value()->attach(listener, "client-session"));
  EXPECT_EQ(km.find(b->id).value()->model().connections, 1);

  fire(km, b->id, "import os; os._exit(1)");
  const auto seen = watch_until(km, b->id, "idle", 30s);
  EXPECT_TRUE(contains(seen, "restarting")) << "states seen: " << join(seen);
  ASSERT_EQ(seen.back(), "idle") << "states seen: " << join(seen);
  EXPECT_TRUE(listener->wait_for_state("restarting", 5s))
      << "statuses delivered: " << join(listener->states());
  EXPECT_FALSE(listener->gone());

  const KernelModel restarted = km.find(b->id).value()->model();
  EXPECT_EQ(restarted.reason, "") << "a restarted kernel is not dead";
  EXPECT_EQ(restarted.connections, 1) << "the WebSocket stays attached across the restart";
  // launch() reports "idle" just before it rewrites the record: give it a moment.
  int new_pid = record_pid(record_path(b->id));
  for (auto until = Clock::now() + 2s; new_pid == old_pid && Clock::now() < until;) {
    std::this_thread::sleep_for(10ms);
    new_pid = record_pid(record_path(b->id));
  }
  EXPECT_GT(new_pid, 0);
  EXPECT_NE(new_pid, old_pid) << "the state record names the new process";

  // (No failing cell here: ipykernel aborts requests arriving just after an error.)
  EXPECT_EQ(output_of(km, b->id, "print('y' in globals())"), "False\n") << "the restart kept state";
  EXPECT_EQ(output_of(km, b->id, "print(6 * 7)"), "42\n");
  EXPECT_EQ(output_of(km, a->id, "print(x)"), "kept\n");
  EXPECT_EQ(state_of(km, a->id), "idle");
  EXPECT_EQ(km.list().size(), 2u);
}

TEST_F(GatewayTest, OomWithoutRestartsIsDeadAndTheOtherKernelIsUntouched) {
  RegistryOptions o = options();
  o.restart_limit = 0;
  o.jail.memory_bytes = 256ull << 20;
  KernelRegistry& km = make_manager(o);
  auto a = km.start("python3", json());
  ASSERT_TRUE(a) << a.error().describe();
  auto b = km.start("python3", json());
  ASSERT_TRUE(b) << b.error().describe();
  EXPECT_EQ(output_of(km, b->id, "z = 5"), "");
  auto listener = std::make_shared<RecordingListener>();
  ASSERT_TRUE(km.find(a->id).value()->attach(listener, ""));

  fire(km, a->id, "b = bytearray(512 << 20)");
  const auto seen = watch_until(km, a->id, "dead", 30s);
  ASSERT_EQ(seen.back(), "dead") << "states seen: " << join(seen);
  EXPECT_FALSE(contains(seen, "restarting")) << "restart_limit 0: " << join(seen);
  const KernelModel dead = km.find(a->id).value()->model();
  EXPECT_NE(lower(dead.reason).find("oom"), std::string::npos) << dead.reason;
  EXPECT_EQ(dead.to_json().value("reason", ""), dead.reason);
  EXPECT_TRUE(listener->wait_for_state("dead", 5s))
      << "statuses delivered: " << join(listener->states());

  // A dead kernel stays listed (GET answers "dead") until it is deleted.
  EXPECT_EQ(km.list().size(), 2u);
  EXPECT_EQ(state_of(km, b->id), "idle");
  EXPECT_EQ(output_of(km, b->id, "print(z)"), "5\n");
  EXPECT_TRUE(km.find(b->id).value()->model().reason.empty());
  EXPECT_TRUE(km.shutdown(a->id));
  EXPECT_EQ(output_of(km, b->id, "print(z + 1)"), "6\n");
}

TEST_F(GatewayTest, RestartShutdownAndTheStateRecord) {
  KernelRegistry& km = make_manager(options());
  auto started = km.start("python3", json());
  ASSERT_TRUE(started) << started.error().describe();
  const std::string id = started->id;
  EXPECT_EQ(started->name, "python3");
  EXPECT_EQ(started->connections, 0);

  // The state record: owner-only, naming the kernel, its process and its connection key.
  const std::string record = record_path(id);
  struct stat st {};
  ASSERT_EQ(::stat(record.c_str(), &st), 0) << record;
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, 0u);
  json j = read_json(record);
  ASSERT_TRUE(j.is_object()) << record;
  EXPECT_EQ(j.value("id", ""), id);
  EXPECT_GT(record_pid(record), 0);
  EXPECT_FALSE(j.value("pid_start_time", "").empty()) << "the pid is not a live host process";
  ASSERT_TRUE(j.contains("connection") && j["connection"].is_object()) << j.dump();
  EXPECT_GE(j["connection"].value("key", "").size(), 32u) << j.dump();
  const int old_pid = record_pid(record);

  auto listener = std::make_shared<RecordingListener>();
  ASSERT_TRUE(km.find(id).value()->attach(listener, "s"));
  EXPECT_EQ(output_of(km, id, "x = 1\nprint(x)"), "1\n");

  auto restarted = km.restart(id);
  ASSERT_TRUE(restarted) << restarted.error().describe();
  EXPECT_EQ(restarted->id, id);
  EXPECT_EQ(restarted->execution_state, "idle");
  EXPECT_EQ(output_of(km, id, "print('x' in globals())"), "False\n") << "the restart kept state";
  EXPECT_EQ(output_of(km, id, "print('fresh')"), "fresh\n");
  EXPECT_TRUE(fs::exists(record));
  EXPECT_NE(record_pid(record), old_pid) << "the record names the new process";
  // The attached listener follows the new kernel's iopub.
  EXPECT_TRUE(listener->wait_for_state("busy", 5s)) << join(listener->states());

  auto down = km.shutdown(id);
  ASSERT_TRUE(down) << down.error().describe();
  auto found = km.find(id);
  ASSERT_FALSE(found);
  EXPECT_EQ(found.error().code, ErrorCode::kNotFound);
  EXPECT_FALSE(fs::exists(record)) << "the record outlived the kernel";
  EXPECT_FALSE(fs::exists(km.state_dir() + "/kernels/" + id)) << "the work dir outlived it";
  EXPECT_TRUE(listener->gone()) << "attached WebSockets are told";
  EXPECT_TRUE(km.list().empty());
  auto again = km.shutdown(id);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, ErrorCode::kNotFound);
  auto restart_gone = km.restart(id);
  ASSERT_FALSE(restart_gone);
  EXPECT_EQ(restart_gone.error().code, ErrorCode::kNotFound);
}

TEST_F(GatewayTest, ExitedKernelsReasonNamesTheExitCode) {
  // Regression (found by this test, fixed): KernelRegistry::monitor_loop builds the death reason
  // from to_string(ended->reason), the signal and the message only; a kernel that calls os._exit(3)
  // is reported (model "reason", logs) as died: "ok", with the exit code dropped. Fix: append "
  // (exit code N)" when ended->reason is kOk and exit_code != 0.
  RegistryOptions o = options();
  o.restart_limit = 0;
  KernelRegistry& km = make_manager(o);
  auto k = km.start("python3", json());
  ASSERT_TRUE(k) << k.error().describe();
  fire(km, k->id, "import os; os._exit(3)");
  const auto seen = watch_until(km, k->id, "dead", 30s);
  ASSERT_EQ(seen.back(), "dead") << "states seen: " << join(seen);
  const std::string reason = km.find(k->id).value()->model().reason;
  EXPECT_NE(reason.find("code 3"), std::string::npos) << reason;
}

TEST_F(GatewayTest, MaxKernelsRefusesTheNextStart) {
  RegistryOptions o = options();
  o.max_kernels = 1;
  KernelRegistry& km = make_manager(o);
  auto first = km.start("python3", json());
  ASSERT_TRUE(first) << first.error().describe();
  auto second = km.start("python3", json());
  ASSERT_FALSE(second) << "a second kernel started: " << second->id;
  EXPECT_EQ(second.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(http::status_for(second.error()), http::Status::forbidden);
  EXPECT_NE(lower(second.error().message).find("limit"), std::string::npos)
      << second.error().message;
  EXPECT_NE(second.error().message.find('1'), std::string::npos) << second.error().message;
  EXPECT_EQ(km.list().size(), 1u);

  // Its slot is free again once it is shut down.
  ASSERT_TRUE(km.shutdown(first->id));
  auto third = km.start("python3", json());
  ASSERT_TRUE(third) << third.error().describe();
  EXPECT_EQ(output_of(km, third->id, "print('ok')"), "ok\n");
}

}  // namespace
}  // namespace cellgate::kernels
