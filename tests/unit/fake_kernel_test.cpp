// The fake kernel itself (tests/support): that it answers as the captured ipykernel does, so the
// tests built on it test the gateway and not the fake.
#include "cellgate/testing/fake_kernel.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <mutex>

namespace cellgate::testing {
namespace {

using namespace std::chrono_literals;
using kernel::Channel;
using nlohmann::json;

struct Recorded {
  std::mutex mu;
  std::vector<protocol::EnvelopePtr> iopub;
  std::vector<protocol::EnvelopePtr> unrouted;
  std::vector<std::string> dead;

  std::vector<std::string> iopub_types() {
    std::lock_guard lock(mu);
    std::vector<std::string> out;
    for (const auto& e : iopub) {
      out.push_back(e->header().msg_type);
    }
    return out;
  }
};

struct Started {
  std::unique_ptr<kernel::KernelProcessHandle> process;
  std::unique_ptr<kernel::KernelConnection> conn;
};

Started start(FakeBackend& fake, Recorded& rec) {
  kernel::LaunchRequest req;
  req.spec.name = "python3";
  auto process = fake.launch(req);
  EXPECT_TRUE(process.ok());
  kernel::ClientOptions options;
  options.on_iopub = [&rec](const protocol::EnvelopePtr& env) {
    std::lock_guard lock(rec.mu);
    rec.iopub.push_back(env);
  };
  options.on_unrouted = [&rec](const protocol::EnvelopePtr& env) {
    std::lock_guard lock(rec.mu);
    rec.unrouted.push_back(env);
  };
  options.on_dead = [&rec](const std::string& reason) {
    std::lock_guard lock(rec.mu);
    rec.dead.push_back(reason);
  };
  auto conn = fake.connect(*process.value(), options);
  EXPECT_TRUE(conn.ok());
  return {std::move(process).value(), std::move(conn).value()};
}

TEST(FakeKernel, AnswersKernelInfoWithTheCapturedReply) {
  FakeBackend fake;
  Recorded rec;
  auto k = start(fake, rec);
  auto info = k.conn->wait_ready(2s);
  ASSERT_TRUE(info.ok()) << info.error().describe();
  EXPECT_EQ((*info)["implementation"], "ipython");
  EXPECT_EQ((*info)["protocol_version"], "5.3");
  ASSERT_TRUE(eventually([&] { return rec.iopub_types().size() == 2; }));
  EXPECT_EQ(rec.iopub_types(), (std::vector<std::string>{"status", "status"}));
}

TEST(FakeKernel, RunsACellAsIpykernelDoes) {
  FakeBackend fake([](const std::string& code) {
    return code == "print(1); 2" ? FakeCell().out("1\n").result({{"text/plain", "2"}}) : FakeCell();
  });
  Recorded rec;
  auto k = start(fake, rec);
  auto run = k.conn->request(Channel::kShell, "execute_request",
                             kernel::execute_content("print(1); 2"), 2s);
  ASSERT_TRUE(run.ok()) << run.error().describe();
  ASSERT_TRUE(run->reply.has_value());
  EXPECT_EQ(run->reply->content["status"], "ok");
  EXPECT_EQ(run->reply->content["execution_count"], 1);
  std::vector<std::string> types;
  for (const auto& [ch, msg] : run->messages) {
    types.push_back(msg.msg_type());
    EXPECT_EQ(msg.parent_header["msg_type"], "execute_request");
  }
  EXPECT_EQ(types, (std::vector<std::string>{"status", "execute_input", "stream", "execute_result",
                                             "execute_reply", "status"}));
  EXPECT_EQ(run->messages[3].second.content["execution_count"], 1);
  EXPECT_EQ(fake.kernel(0)->executed(), std::vector<std::string>{"print(1); 2"});
}

TEST(FakeKernel, ErrorEndsTheCellWithAnErrorReply) {
  FakeBackend fake([](const std::string&) {
    return FakeCell().error("ZeroDivisionError", "division by zero").out("never\n");
  });
  Recorded rec;
  auto k = start(fake, rec);
  auto run =
      k.conn->request(Channel::kShell, "execute_request", kernel::execute_content("1/0"), 2s);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->reply->content["status"], "error");
  EXPECT_EQ(run->reply->content["ename"], "ZeroDivisionError");
  for (const auto& [ch, msg] : run->messages) {
    EXPECT_NE(msg.msg_type(), "stream");
  }
}

TEST(FakeKernel, SigintInterruptsAHangingCell) {
  FakeBackend fake([](const std::string&) { return FakeCell().hang(); });
  Recorded rec;
  auto k = start(fake, rec);
  std::mutex mu;
  std::optional<json> reply;
  kernel::RequestHandlers h;
  h.on_envelope = [&](const protocol::EnvelopePtr& env) {
    if (env->header().msg_type == "execute_reply") {
      std::lock_guard lock(mu);
      reply = env->message().content;
    }
  };
  k.conn->send(Channel::kShell, "execute_request", kernel::execute_content("while 1: pass"),
               std::move(h));
  ASSERT_TRUE(eventually([&] { return fake.kernel(0)->cell_running(); }));
  std::this_thread::sleep_for(20ms);
  {
    std::lock_guard lock(mu);
    EXPECT_FALSE(reply.has_value());
  }
  ASSERT_TRUE(k.process->signal(SIGINT).ok());
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return reply.has_value();
  }));
  EXPECT_EQ((*reply)["ename"], "KeyboardInterrupt");
  EXPECT_EQ(fake.kernel(0)->signals(), std::vector<int>{SIGINT});
}

TEST(FakeKernel, InterruptRequestInterruptsButHangIgnoringInterruptsDoesNot) {
  FakeBackend fake([](const std::string& code) {
    return code == "hard" ? FakeCell().hang_ignoring_interrupts() : FakeCell().hang();
  });
  Recorded rec;
  auto k = start(fake, rec);
  std::atomic<int> ended{0};
  kernel::RequestHandlers h;
  h.on_end = [&](kernel::RequestEnd) { ++ended; };
  k.conn->send(Channel::kShell, "execute_request", kernel::execute_content("soft"), std::move(h));
  ASSERT_TRUE(eventually([&] { return fake.kernel(0)->cell_running(); }));
  auto r = k.conn->request(Channel::kControl, "interrupt_request", json::object(), 2s, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reply->msg_type(), "interrupt_reply");
  ASSERT_TRUE(eventually([&] { return ended == 1; }));

  kernel::RequestHandlers h2;
  h2.on_end = [&](kernel::RequestEnd end) {
    EXPECT_EQ(end, kernel::RequestEnd::kKernelDead);
    ++ended;
  };
  k.conn->send(Channel::kShell, "execute_request", kernel::execute_content("hard"), std::move(h2));
  ASSERT_TRUE(eventually([&] { return fake.kernel(0)->cell_running(); }));
  ASSERT_TRUE(k.process->signal(SIGINT).ok());
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(ended, 1);
  fake.kernel(0)->kill("oom");
  ASSERT_TRUE(eventually([&] { return ended == 2; }));
  EXPECT_EQ(fake.kernel(0)->interrupts(), 2);
}

TEST(FakeKernel, InputRequestWaitsForTheAnswer) {
  FakeBackend fake([](const std::string&) {
    return FakeCell().input("Name: ", [](const std::string& value, FakeCell& rest) {
      rest.out("hello " + value + "\n");
    });
  });
  Recorded rec;
  auto k = start(fake, rec);
  std::mutex mu;
  std::optional<protocol::Message> input_request;
  std::string text;
  std::atomic<bool> done{false};
  kernel::RequestHandlers h;
  h.on_envelope = [&](const protocol::EnvelopePtr& env) {
    std::lock_guard lock(mu);
    if (env->header().msg_type == "input_request") {
      EXPECT_EQ(env->channel(), Channel::kStdin);
      input_request = env->message();
    } else if (env->header().msg_type == "stream") {
      text += env->message().content.value("text", "");
    }
  };
  h.on_end = [&](kernel::RequestEnd) { done = true; };
  k.conn->send(Channel::kShell, "execute_request",
               kernel::execute_content("input()", /*allow_stdin=*/true), std::move(h));
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return input_request.has_value();
  }));
  EXPECT_EQ(input_request->content["prompt"], "Name: ");
  k.conn->send_input(*input_request, "Ada");
  ASSERT_TRUE(eventually([&] { return done.load(); }));
  std::lock_guard lock(mu);
  EXPECT_EQ(text, "hello Ada\n");
}

TEST(FakeKernel, KillEndsTheProcessAndStopsHeartbeats) {
  FakeBackend fake;
  Recorded rec;
  auto k = start(fake, rec);
  EXPECT_FALSE(k.process->poll_exit().has_value());
  EXPECT_TRUE(fake.kill(k.process->pid(), "out of memory"));
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(rec.mu);
    return rec.dead.size() == 1;
  }));
  EXPECT_EQ(rec.dead[0], "out of memory");
  EXPECT_FALSE(k.conn->is_alive());
  auto ended = k.process->poll_exit();
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->reason, launcher::ExitReason::kSignaled);
  EXPECT_EQ(ended->message, "out of memory");
}

TEST(FakeKernel, StoppedHeartbeatsAreFoundByTheClientsOwnHeartbeat) {
  FakeBackend fake;
  Recorded rec;
  auto k = start(fake, rec);
  ASSERT_TRUE(k.conn->wait_ready(2s).ok());
  std::atomic<int> ended{0};
  kernel::RequestHandlers h;
  h.on_end = [&](kernel::RequestEnd end) {
    EXPECT_EQ(end, kernel::RequestEnd::kKernelDead);
    ++ended;
  };
  fake.kernel(0)->set_responder([](const std::string&) { return FakeCell().hang(); });
  k.conn->send(Channel::kShell, "execute_request", kernel::execute_content("loop()"), std::move(h));
  ASSERT_TRUE(eventually([&] { return fake.kernel(0)->cell_running(); }));
  fake.kernel(0)->stop_heartbeat();
  ASSERT_TRUE(eventually([&] { return !k.conn->is_alive(); }));
  {
    std::lock_guard lock(rec.mu);
    ASSERT_EQ(rec.dead.size(), 1u);
    // The router's verdict (ClientOptions' defaults: three pings, 200 ms apart), not the fake's.
    EXPECT_EQ(rec.dead[0], "no answer to 3 heartbeats in a row (600 ms)");
  }
  EXPECT_EQ(k.conn->death_reason(), "no answer to 3 heartbeats in a row (600 ms)");
  ASSERT_TRUE(eventually([&] { return ended == 1; }));
  EXPECT_TRUE(fake.kernel(0)->running()) << "the process runs on; only its heartbeat stopped";
}

TEST(FakeKernel, ARequestToADeadKernelEndsAtOnce) {
  FakeBackend fake;
  Recorded rec;
  auto k = start(fake, rec);
  fake.kernel(0)->kill("gone");
  ASSERT_TRUE(eventually([&] { return !k.conn->is_alive(); }));
  auto r = k.conn->request(Channel::kShell, "kernel_info_request", json::object(), 2s);
  ASSERT_TRUE(r.ok()) << r.error().describe();
  EXPECT_EQ(r->end, kernel::RequestEnd::kKernelDead);
  EXPECT_FALSE(r->reply.has_value());
}

TEST(FakeKernel, PostedMessagesAnswerUnrouted) {
  FakeBackend fake;
  Recorded rec;
  auto k = start(fake, rec);
  protocol::Session client("someone");
  k.conn->post(Channel::kShell, protocol::Envelope::from_message(
                                    Channel::kShell, client.make("kernel_info_request", {})));
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(rec.mu);
    return rec.unrouted.size() == 1;
  }));
  std::lock_guard lock(rec.mu);
  EXPECT_EQ(rec.unrouted[0]->header().msg_type, "kernel_info_reply");
  EXPECT_EQ(rec.unrouted[0]->parent().session, client.id());
}

TEST(FakeBackend, KnobsFailDelayAndCount) {
  FakeBackend fake;
  fake.fail_next_launch("no cgroup here");
  auto failed = fake.launch({});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().message, "no cgroup here");
  fake.set_launch_delay(50ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto ok = fake.launch({});
  EXPECT_TRUE(ok.ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
  EXPECT_EQ(fake.launches(), 2);
  EXPECT_EQ(fake.kernels().size(), 1u);
  fake.set_next_unresponsive(true);
  auto silent = fake.launch({});
  auto conn = fake.connect(*silent.value(), {});
  auto ready = conn.value()->wait_ready(50ms);
  ASSERT_FALSE(ready.ok());
  EXPECT_EQ(ready.error().code, ErrorCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace cellgate::testing
