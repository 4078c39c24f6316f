// The kernel client against real Debian ipykernels started through cellgate-kernel.
#include <gtest/gtest.h>

#include <condition_variable>
#include <csignal>
#include <future>
#include <mutex>
#include <thread>

#include "cellgate/kernel/client.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/kernel/progress.hpp"

namespace cellgate::kernel {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Kernel {
  std::unique_ptr<KernelProcess> process;
  std::unique_ptr<KernelClient> client;
};

Kernel start_kernel(ClientOptions options = {}, std::string transport = "ipc") {
  Kernel k;
  auto spec = find_kernelspec("python3");
  EXPECT_TRUE(spec) << spec.error().describe();
  LaunchRequest req;
  req.spec = std::move(spec).value();
  req.launcher_path = std::string(CELLGATE_BIN_DIR) + "/cellgate-kernel";
  req.die_with_parent = true;
  req.transport = std::move(transport);
  auto process = KernelProcess::start(std::move(req));
  EXPECT_TRUE(process) << process.error().describe();
  k.process = std::move(process).value();
  auto client = KernelClient::connect(k.process->connection(), std::move(options));
  EXPECT_TRUE(client) << client.error().describe();
  k.client = std::move(client).value();
  auto ready = k.client->wait_ready(60s);
  EXPECT_TRUE(ready) << ready.error().describe();
  return k;
}

Collected run(KernelClient& client, const std::string& code, bool allow_stdin = false) {
  auto r =
      client.request(Channel::kShell, "execute_request", execute_content(code, allow_stdin), 60s);
  EXPECT_TRUE(r) << r.error().describe();
  return r ? std::move(r).value() : Collected{};
}

std::string stdout_of(const Collected& c) {
  std::string out;
  for (const auto& [ch, msg] : c.messages) {
    if (ch == Channel::kIopub && msg.msg_type() == "stream" &&
        msg.content.value("name", "") == "stdout") {
      out += msg.content.value("text", "");
    }
  }
  return out;
}

// Output messages (iopub, excluding status and execute_input) in arrival order.
std::vector<std::string> output_types(const Collected& c) {
  std::vector<std::string> types;
  for (const auto& [ch, msg] : c.messages) {
    const auto t = msg.msg_type();
    if (ch == Channel::kIopub && t != "status" && t != "execute_input") {
      types.push_back(t);
    }
  }
  return types;
}

class KernelClientTest : public ::testing::Test {
 protected:
  void SetUp() override { kernel_ = start_kernel(); }
  Kernel kernel_;
};

TEST_F(KernelClientTest, KernelInfoReportsPython) {
  auto r = kernel_.client->request(Channel::kShell, "kernel_info_request", json::object(), 30s);
  ASSERT_TRUE(r) << r.error().describe();
  ASSERT_TRUE(r->reply);
  EXPECT_EQ(r->reply->msg_type(), "kernel_info_reply");
  EXPECT_EQ(r->reply->content["language_info"]["name"], "python");
  EXPECT_EQ(r->reply->content["protocol_version"].get<std::string>().substr(0, 2), "5.");
}

TEST_F(KernelClientTest, VariablesPersistAcrossCells) {
  auto first = run(*kernel_.client, "x = 41");
  ASSERT_TRUE(first.reply);
  EXPECT_EQ(first.reply->content["status"], "ok");
  auto second = run(*kernel_.client, "print(x + 1)");
  EXPECT_EQ(stdout_of(second), "42\n");
  EXPECT_EQ(second.reply->content["execution_count"], 2);
}

TEST_F(KernelClientTest, OutputsArriveInOrderWithTheRightParent) {
  const std::string code =
      "import matplotlib\n"
      "import matplotlib.pyplot as plt\n"
      "print('before')\n"
      "fig = plt.figure(figsize=(1, 1), dpi=20)\n"
      "plt.plot([1, 2, 3])\n"
      "plt.show()\n"
      "print('after')\n"
      "6 * 7\n";
  auto c = run(*kernel_.client, code);
  ASSERT_TRUE(c.reply);
  EXPECT_EQ(c.reply->content["status"], "ok");
  const std::string request_id = c.reply->parent_msg_id();
  for (const auto& [ch, msg] : c.messages) {
    EXPECT_EQ(msg.parent_msg_id(), request_id) << msg.msg_type();
  }
  const std::vector<std::string> expected = {"stream", "display_data", "stream", "execute_result"};
  EXPECT_EQ(output_types(c), expected);
  bool png_ok = false;
  for (const auto& [ch, msg] : c.messages) {
    if (msg.msg_type() == "display_data") {
      auto png = msg.content["data"].value("image/png", "");
      // base64 of the PNG signature \x89PNG\r\n\x1a\n
      png_ok = png.rfind("iVBORw0KGgo", 0) == 0;
    }
    if (msg.msg_type() == "execute_result") {
      EXPECT_EQ(msg.content["data"]["text/plain"], "42");
    }
  }
  EXPECT_TRUE(png_ok) << "display_data carried no PNG";
  // The last iopub message of the request is status idle. (The shell reply travels on another
  // socket and may arrive before or after it.)
  const protocol::Message* last_iopub = nullptr;
  for (const auto& [ch, msg] : c.messages) {
    if (ch == Channel::kIopub) {
      last_iopub = &msg;
    }
  }
  ASSERT_NE(last_iopub, nullptr);
  EXPECT_EQ(last_iopub->msg_type(), "status");
  EXPECT_EQ(last_iopub->content["execution_state"], "idle");
}

TEST_F(KernelClientTest, ErrorArrivesWithNameAndTraceback) {
  auto c = run(*kernel_.client, "d = {}\nd['missing']");
  ASSERT_TRUE(c.reply);
  EXPECT_EQ(c.reply->content["status"], "error");
  EXPECT_EQ(c.reply->content["ename"], "KeyError");
  bool seen = false;
  for (const auto& [ch, msg] : c.messages) {
    if (ch == Channel::kIopub && msg.msg_type() == "error") {
      seen = true;
      EXPECT_EQ(msg.content["ename"], "KeyError");
      EXPECT_FALSE(msg.content["traceback"].empty());
    }
  }
  EXPECT_TRUE(seen);
}

TEST_F(KernelClientTest, InputIsAnsweredThroughStdin) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string prompt, printed;
  RequestHandlers h;
  h.on_message = [&](Channel ch, const protocol::Message& msg) {
    if (ch == Channel::kStdin && msg.msg_type() == "input_request") {
      std::lock_guard lock(mu);
      prompt = msg.content.value("prompt", "");
      kernel_.client->send_input(msg, "cellgate");
    } else if (msg.msg_type() == "stream") {
      std::lock_guard lock(mu);
      printed += msg.content.value("text", "");
    }
  };
  h.on_end = [&](RequestEnd) {
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  };
  kernel_.client->send(Channel::kShell, "execute_request",
                       execute_content("name = input('who? ')\nprint('hello', name)", true),
                       std::move(h));
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return done; }));
  EXPECT_EQ(prompt, "who? ");
  EXPECT_EQ(printed, "hello cellgate\n");
}

TEST_F(KernelClientTest, SigintInterruptsALoopAndStateSurvives) {
  run(*kernel_.client, "kept = 'still here'");
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Collected collected;
  RequestHandlers h;
  h.on_message = [&](Channel ch, const protocol::Message& msg) {
    std::lock_guard lock(mu);
    collected.messages.emplace_back(ch, msg);
    cv.notify_all();
  };
  h.on_end = [&](RequestEnd) {
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  };
  // stop_on_error off, as the agent API sends it: with it on, ipykernel 6 aborts whatever shell
  // request reaches it before its abort window closes, and on a loaded machine that was the next
  // cell below (sent as soon as this one's reply arrived), which then printed nothing.
  json loop = execute_content("print('looping', flush=True)\nwhile True: pass");
  loop["stop_on_error"] = false;
  kernel_.client->send(Channel::kShell, "execute_request", std::move(loop), std::move(h));
  // ipykernel ignores SIGINT between cells: signal only once the cell's own code runs (its
  // first line printed; a fixed delay after execute_input was not enough on a loaded machine).
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 20s, [&] {
      for (const auto& [ch, msg] : collected.messages) {
        if (msg.msg_type() == "stream" &&
            msg.content.value("text", "").find("looping") != std::string::npos) {
          return true;
        }
      }
      return done;
    })) << "the cell never started";
  }
  std::this_thread::sleep_for(50ms);
  {
    std::lock_guard lock(mu);
    EXPECT_FALSE(done) << "the loop ended by itself";
  }
  ASSERT_TRUE(kernel_.process->signal(SIGINT));
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return done; })) << "the interrupt did not land";
  }
  std::string ename;
  for (const auto& [ch, msg] : collected.messages) {
    if (msg.msg_type() == "error") {
      ename = msg.content.value("ename", "");
    }
  }
  EXPECT_EQ(ename, "KeyboardInterrupt");
  const auto next = run(*kernel_.client, "print(kept)");
  ASSERT_TRUE(next.reply);
  EXPECT_EQ(next.reply->content.value("status", ""), "ok");
  EXPECT_EQ(stdout_of(next), "still here\n");
  EXPECT_TRUE(kernel_.client->is_alive());
}

TEST(KernelClientDeath, KillIsDetectedByHeartbeatWithinOneSecond) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Clock::time_point> dead_at;
  ClientOptions options;
  options.on_dead = [&](const std::string&) {
    std::lock_guard lock(mu);
    dead_at = Clock::now();
    cv.notify_all();
  };
  Kernel k = start_kernel(std::move(options));
  // Let a few heartbeats succeed so the client has seen the kernel alive.
  std::this_thread::sleep_for(600ms);
  ASSERT_TRUE(k.client->is_alive());

  // A request in flight must end with kKernelDead rather than hang.
  std::promise<RequestEnd> ended;
  RequestHandlers h;
  h.on_end = [&](RequestEnd e) { ended.set_value(e); };
  k.client->send(Channel::kShell, "execute_request", execute_content("import time; time.sleep(60)"),
                 std::move(h));
  std::this_thread::sleep_for(200ms);

  const auto killed_at = Clock::now();
  ASSERT_EQ(::kill(k.process->pid(), SIGKILL), 0);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return dead_at.has_value(); }));
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(*dead_at - killed_at);
  EXPECT_LE(took.count(), 1000) << "heartbeat took " << took.count() << " ms to notice";
  EXPECT_FALSE(k.client->is_alive());
  auto fut = ended.get_future();
  ASSERT_EQ(fut.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(fut.get(), RequestEnd::kKernelDead);

  auto exit = k.process->wait_exit(5s);
  ASSERT_TRUE(exit);
  EXPECT_EQ(exit->reason, launcher::ExitReason::kSignaled);
  EXPECT_EQ(exit->signal, SIGKILL);
}

// ClientOptions::progress: while the probe finds the kernel's process making progress, missed
// heartbeats do not count (a kernel starved of CPU by its own cell is busy); once it finds none,
// `heartbeat_misses` of them in a row make the kernel dead, with the probe's reason.
TEST(KernelClientDeath, MissesCountOnlyWhileTheProbeSeesNoProgress) {
  std::mutex mu;
  std::condition_variable cv;
  int probes = 0;
  bool running = true;
  std::optional<std::string> dead_reason;
  ClientOptions options;
  options.progress = [&] {
    std::lock_guard lock(mu);
    ++probes;
    cv.notify_all();
    return running ? Progress{Progress::State::kRunning, "busy (test)"}
                   : Progress{Progress::State::kStalled, "idle (test)"};
  };
  options.on_dead = [&](const std::string& reason) {
    std::lock_guard lock(mu);
    dead_reason = reason;
    cv.notify_all();
  };
  Kernel k = start_kernel(std::move(options));
  const int misses = ClientOptions{}.heartbeat_misses;
  ASSERT_EQ(::kill(k.process->pid(), SIGSTOP), 0);  // answers nothing from now on
  {
    // Twice the misses that would have made it dead, each one excused by the probe.
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return probes >= 2 * misses + 2; }));
    EXPECT_FALSE(dead_reason) << *dead_reason;
    EXPECT_TRUE(k.client->is_alive());
    running = false;
    ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return dead_reason.has_value(); }));
    // Only the misses after the probe changed its mind counted.
    EXPECT_GE(probes, 2 * misses + 2 + misses);
  }
  EXPECT_FALSE(k.client->is_alive());
  EXPECT_NE(dead_reason->find("idle (test)"), std::string::npos) << *dead_reason;
  EXPECT_EQ(k.client->death_reason(), *dead_reason);
  ::kill(k.process->pid(), SIGCONT);
}

// progress_probe() on a real kernel (unjailed here: it reads the process's own CPU times).
TEST(KernelProgressProbe, TellsBusyFromStoppedFromGone) {
  Kernel k = start_kernel();
  auto probe = progress_probe(*k.process);
  ASSERT_TRUE(probe);
  EXPECT_EQ(probe().state, Progress::State::kRunning);  // the first look: a sample only

  // Busy: a cell spinning for 2 s; the probe sees the CPU it used.
  std::promise<RequestEnd> ended;
  RequestHandlers h;
  h.on_end = [&](RequestEnd e) { ended.set_value(e); };
  k.client->send(Channel::kShell, "execute_request",
                 execute_content("import time\nt = time.monotonic() + 2\n"
                                 "while time.monotonic() < t: pass"),
                 std::move(h));
  Progress busy{Progress::State::kStalled, ""};
  const auto deadline = Clock::now() + 10s;
  while (busy.state != Progress::State::kRunning && Clock::now() < deadline) {
    std::this_thread::sleep_for(200ms);  // a window to measure CPU over, not a guess at timing
    busy = probe();
  }
  EXPECT_EQ(busy.state, Progress::State::kRunning) << busy.why;
  auto fut = ended.get_future();
  ASSERT_EQ(fut.wait_for(30s), std::future_status::ready);

  // Stopped (SIGSTOP): it uses no CPU, so the probe finds it stalled over any window after.
  ASSERT_EQ(::kill(k.process->pid(), SIGSTOP), 0);
  Progress stopped = probe();
  for (int i = 0; i < 50 && stopped.state != Progress::State::kStalled; ++i) {
    std::this_thread::sleep_for(200ms);
    stopped = probe();
  }
  EXPECT_EQ(stopped.state, Progress::State::kStalled) << stopped.why;
  EXPECT_NE(stopped.why.find("used 0 ms of CPU"), std::string::npos) << stopped.why;
  ::kill(k.process->pid(), SIGCONT);

  // Gone.
  ASSERT_EQ(::kill(k.process->pid(), SIGKILL), 0);
  ASSERT_TRUE(k.process->wait_exit(10s));
  EXPECT_EQ(probe().state, Progress::State::kGone);
}

TEST(KernelClientTransport, TcpConnectionFileWorks) {
  Kernel k = start_kernel({}, "tcp");
  EXPECT_EQ(k.process->connection().transport, "tcp");
  EXPECT_EQ(stdout_of(run(*k.client, "print(sum(range(10)))")), "45\n");
}

TEST(KernelClientWire, WrongKeyMeansNoMessageIsAccepted) {
  Kernel k = start_kernel();
  ConnectionInfo wrong = k.process->connection();
  wrong.key = random_hex(32);
  std::atomic<int> errors{0};
  ClientOptions options;
  options.on_wire_error = [&](Channel, const Error& e) {
    if (e.reason == "bad_signature") {
      errors.fetch_add(1);
    }
  };
  auto client = KernelClient::connect(wrong, std::move(options));
  ASSERT_TRUE(client);
  // The kernel drops our badly signed request; nothing comes back.
  auto r = client.value()->request(Channel::kShell, "kernel_info_request", json::object(), 1500ms);
  EXPECT_FALSE(r);
  // The good client still works: the kernel was not disturbed.
  EXPECT_EQ(stdout_of(run(*k.client, "print('fine')")), "fine\n");
  // Iopub traffic signed with the real key is refused by the client holding the wrong key.
  EXPECT_GT(errors.load(), 0);
}

TEST(KernelProcessStart, MissingKernelBinaryIsASetupError) {
  KernelSpec spec;
  spec.name = "broken";
  spec.argv = {"/nonexistent/python", "-f", "{connection_file}"};
  LaunchRequest req;
  req.spec = spec;
  req.launcher_path = std::string(CELLGATE_BIN_DIR) + "/cellgate-kernel";
  auto p = KernelProcess::start(std::move(req));
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().reason, "kernel_setup_error");
  EXPECT_NE(p.error().message.find("ENOENT"), std::string::npos) << p.error().message;
}

}  // namespace
}  // namespace cellgate::kernel
