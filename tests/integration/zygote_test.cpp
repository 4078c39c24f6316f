// KernelRegistry over a ProcessBackend with a zygote against real jailed ipykernels: pooled
// and client kernels are forked from it (pandas already imported, the jail's pid 1 a child of
// the zygote), kernels outlive a SIGKILLed zygote with their variables, a new zygote is ready
// within seconds and new kernels come from it, a dead pooled kernel is replaced from it.
// Needs root (the jail); skips otherwise.
//
// The zygote belongs to the kernel backend (kernel::ProcessBackend) the test composes, as
// `cellgate serve` does; its pid is read from there.
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
#include <sstream>
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

constexpr auto kFillTimeout = 90s;

bool wait_until(const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() >= deadline) {
      return false;
    }
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The PPid of a process, -1 if it is gone.
pid_t parent_of(pid_t pid) {
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("PPid:", 0) == 0) {
      return static_cast<pid_t>(std::stol(line.substr(5)));
    }
  }
  return -1;
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

// The zygote preloads pandas; a cold ipykernel does not import it. Ask before any cell imports it.
constexpr const char* kPandasPreloaded = "import sys; print('pandas' in sys.modules)";

class ZygoteGatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "jailed kernels and the zygote need root (euid " << ::geteuid() << ")";
    }
    if (auto spec = kernel::find_kernelspec("python3"); !spec) {
      GTEST_SKIP() << "no python3 kernelspec here: " << spec.error().describe();
    }
    std::string pattern = (fs::temp_directory_path() / "cellgate-zygote-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp failed";
    root_ = pattern;
  }

  void TearDown() override {
    manager_.reset();  // ends the kernels
    backend_.reset();  // and the zygote (SIGTERM, reaped)
    if (!root_.empty()) {
      std::error_code ec;
      fs::remove_all(root_, ec);
    }
  }

  KernelRegistry& make_manager(int pool_size) {
    RegistryOptions o;
    o.state_dir = root_ + "/state";
    o.kernel_start_timeout = 60;
    o.pool_size = pool_size;
    o.pool_kernels = {"python3"};
    kernel::ZygoteOptions z;
    z.socket_path = o.state_dir + "/run/zygote.sock";
    z.log_file = o.state_dir + "/zygote.log";
    backend_ = std::make_unique<kernel::ProcessBackend>(
        kernel::ProcessBackendOptions{.launcher_path = "", .zygote = std::move(z)});
    manager_ = std::make_unique<KernelRegistry>(std::move(o), *backend_);
    manager_->start();
    return *manager_;
  }

  // The running zygote's pid, -1 if none.
  pid_t zygote_pid() {
    kernel::Zygote* zygote = backend_ ? backend_->zygote() : nullptr;
    return zygote != nullptr ? zygote->pid() : -1;
  }

  bool wait_pool(std::size_t n) {
    return wait_until([&] { return manager_->pool_ready("python3") == n; }, kFillTimeout);
  }

  // Zygotes that reported ready so far (its log is appended to by every zygote).
  std::size_t zygotes_ready() const {
    const std::string log = read_file(manager_->state_dir() + "/zygote.log");
    std::size_t n = 0;
    for (auto at = log.find("ready in "); at != std::string::npos;
         at = log.find("ready in ", at + 1)) {
      ++n;
    }
    return n;
  }

  // The kernel pid its state record names (-1 without one): the jail's pid 1, which a zygote
  // kernel's zygote forked.
  int record_pid(const std::string& id) const {
    std::ifstream in(manager_->state_dir() + "/kernels/" + id + ".json");
    json j = json::parse(std::string((std::istreambuf_iterator<char>(in)), {}), nullptr, false);
    return j.is_object() && j.contains("pid") && j["pid"].is_number_integer() ? j["pid"].get<int>()
                                                                              : -1;
  }

  std::string root_;
  std::unique_ptr<kernel::ProcessBackend> backend_;  // outlives the registry
  std::unique_ptr<KernelRegistry> manager_;
};

TEST_F(ZygoteGatewayTest, KernelsComeFromTheZygoteOutliveItAndComeFromItsSuccessor) {
  KernelRegistry& km = make_manager(1);
  ASSERT_TRUE(wait_pool(1)) << "ready: " << km.pool_ready("python3");
  const pid_t first = zygote_pid();
  ASSERT_GT(first, 0) << "no zygote child; log:\n" << read_file(km.state_dir() + "/zygote.log");
  ASSERT_EQ(zygotes_ready(), 1u);

  // A pool hit and a pool miss (client env): both forked by the zygote.
  auto pooled = km.start("python3", json::object());
  ASSERT_TRUE(pooled) << pooled.error().describe();
  auto direct = km.start("python3", json{{"KERNEL_DIRECT", "1"}});
  ASSERT_TRUE(direct) << direct.error().describe();
  for (const auto& id : {pooled->id, direct->id}) {
    EXPECT_EQ(output_of(km, id, kPandasPreloaded), "True\n") << "kernel " << id << " started cold";
    EXPECT_EQ(parent_of(record_pid(id)), first) << "kernel " << id << " is not the zygote's";
  }
  EXPECT_EQ(output_of(km, pooled->id, "a = 'pooled kept'"), "");
  EXPECT_EQ(output_of(km, direct->id, "b = 'direct kept'"), "");

  ASSERT_EQ(::kill(first, SIGKILL), 0);
  // Reaped by the manager's zygote handle, then restarted after its 1 s back-off.
  ASSERT_TRUE(wait_until([&] { return ::kill(first, 0) != 0; }, 10s)) << "the zygote lingers";
  EXPECT_EQ(output_of(km, pooled->id, "print(a)"), "pooled kept\n");
  EXPECT_EQ(output_of(km, direct->id, "print(b)"), "direct kept\n");
  EXPECT_EQ(output_of(km, direct->id, "import os; print(os.environ['KERNEL_DIRECT'])"), "1\n");

  // The event: the new zygote's "ready" on its status fd (the zygote handle's wait_ready wakes on
  // it, and launches ask the same handle, so no status read is left to wait for). No guessed
  // time: its preload took 5.8 s under ASan on a busy machine; kFillTimeout only stops a hang.
  // The old zygote is reaped already (kill(first, 0) failed above), so "ready" is the new one's.
  const auto t0 = Clock::now();
  kernel::Zygote* zygote = backend_->zygote();
  ASSERT_NE(zygote, nullptr);
  ASSERT_TRUE(
      zygote->wait_ready(std::chrono::duration_cast<std::chrono::milliseconds>(kFillTimeout)))
      << "no new zygote ready; log:\n"
      << read_file(km.state_dir() + "/zygote.log");
  EXPECT_EQ(zygotes_ready(), 2u);  // its log line comes before its status line
  const pid_t second = zygote_pid();
  ASSERT_GT(second, 0);
  EXPECT_NE(second, first);
  std::cerr << "new zygote ready " << std::chrono::duration<double>(Clock::now() - t0).count()
            << " s after the kill\n";

  auto after = km.start("python3", json{{"KERNEL_AFTER", "1"}});
  ASSERT_TRUE(after) << after.error().describe();
  EXPECT_EQ(output_of(km, after->id, kPandasPreloaded), "True\n") << "started cold";
  EXPECT_EQ(parent_of(record_pid(after->id)), second) << "not forked by the new zygote";
  EXPECT_EQ(output_of(km, after->id, "print(a)"), "<NameError>") << "state leaked";
  EXPECT_EQ(output_of(km, pooled->id, "print(a)"), "pooled kept\n");
}

TEST_F(ZygoteGatewayTest, ADeadPooledKernelIsReplacedFromTheZygote) {
  KernelRegistry& km = make_manager(2);
  ASSERT_TRUE(wait_pool(2)) << "ready: " << km.pool_ready("python3");
  const pid_t zygote = zygote_pid();
  ASSERT_GT(zygote, 0);
  const auto pooled = km.pool_pids("python3");
  ASSERT_EQ(pooled.size(), 2u);
  for (pid_t pid : pooled) {
    EXPECT_EQ(parent_of(pid), zygote) << "pooled kernel " << pid << " is not the zygote's";
  }
  ASSERT_GT(pooled.front(), 1);
  ASSERT_NE(pooled.front(), ::getpid());
  ASSERT_EQ(::kill(pooled.front(), SIGKILL), 0);

  ASSERT_TRUE(wait_until(
      [&] {
        const auto now = km.pool_pids("python3");
        return now.size() == 2 && std::find(now.begin(), now.end(), pooled.front()) == now.end();
      },
      kFillTimeout))
      << "not replaced; pooled now: " << km.pool_pids("python3").size();
  for (pid_t pid : km.pool_pids("python3")) {
    EXPECT_EQ(parent_of(pid), zygote) << "pooled kernel " << pid << " is not the zygote's";
  }
  // Claim both: each answers, from the zygote, separately.
  auto a = km.start("python3", json());
  ASSERT_TRUE(a) << a.error().describe();
  auto b = km.start("python3", json());
  ASSERT_TRUE(b) << b.error().describe();
  for (const auto& id : {a->id, b->id}) {
    EXPECT_EQ(output_of(km, id, kPandasPreloaded), "True\n") << "kernel " << id;
  }
  EXPECT_EQ(output_of(km, a->id, "x = 1"), "");
  EXPECT_EQ(output_of(km, b->id, "print(x)"), "<NameError>");
  EXPECT_EQ(zygote_pid(), zygote) << "the zygote was replaced meanwhile";
}

// The zygote builds the InteractiveShell and parses the kernel's command line ahead of the fork
// (kernel-launcher/src/zygote_server.cpp): a kernel forked that way has its own shell state, and
// a profile's configuration still reaches a shell (a restarted kernel builds its own then).
TEST_F(ZygoteGatewayTest, AForkedKernelsShellIsItsOwnAndAProfileConfigReachesIt) {
  KernelRegistry& km = make_manager(0);
  ASSERT_TRUE(wait_until([&] { return zygotes_ready() == 1; }, kFillTimeout))
      << read_file(km.state_dir() + "/zygote.log");
  // The first start parses its command line itself; the second finds it parsed.
  auto first = km.start("python3", json{{"KERNEL_N", "1"}});
  ASSERT_TRUE(first) << first.error().describe();
  auto second = km.start("python3", json{{"KERNEL_N", "2"}});
  ASSERT_TRUE(second) << second.error().describe();
  const std::string state =
      "import os, pathlib, sys\n"
      "ip = get_ipython()\n"
      "print(ip.kernel is not None and ip.parent is ip.kernel,\n"
      "      _dh == [pathlib.Path.cwd()], ip.starting_dir == os.getcwd(),\n"
      "      str(ip.history_manager.hist_file).startswith(ip.profile_dir.location + '/'),\n"
      "      ip.history_manager.save_thread is not None, ip.db.root.is_dir(),\n"
      "      os.environ.get('PAGER'), os.environ['KERNEL_N'], 'pandas' in sys.modules)\n";
  EXPECT_EQ(output_of(km, first->id, state), "True True True True True True cat 1 True\n");
  EXPECT_EQ(output_of(km, second->id, state), "True True True True True True cat 2 True\n");
  EXPECT_EQ(output_of(km, second->id, "x = 6 * 7"), "");
  EXPECT_EQ(output_of(km, second->id, "print(In[-2], Out.get(1), len(In))"), "x = 6 * 7 None 4\n");
  EXPECT_EQ(output_of(km, first->id, "print('x' in dir(), len(In))"), "False 3\n");

  EXPECT_EQ(output_of(km, second->id, "print(get_ipython().ast_node_interactivity)"),
            "last_expr\n");
  EXPECT_EQ(
      output_of(km, second->id,
                "import os\n"
                "p = os.path.join(get_ipython().profile_dir.location, "
                "'ipython_kernel_config.py')\n"
                "open(p, 'w').write(\"c.InteractiveShell.ast_node_interactivity = 'all'\\n\")"),
      "");
  auto restarted = km.restart(second->id);
  ASSERT_TRUE(restarted) << restarted.error().describe();
  EXPECT_EQ(output_of(km, second->id, "print(get_ipython().ast_node_interactivity)"), "all\n");
  EXPECT_EQ(output_of(km, second->id, kPandasPreloaded), "True\n") << "restarted cold";
}

}  // namespace
}  // namespace cellgate::kernels
