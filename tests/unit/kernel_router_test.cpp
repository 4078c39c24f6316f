// The kernel client's router (gateway/kernel/src/router.hpp) on a manual clock over a transport
// that records what it is given: the behaviours a fake kernel never shows by itself: an idle
// status that never comes, replies that answer no request of ours, a heartbeat that stops, a
// frame set that fails its checks, an iopub connection cut under a live kernel.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "router.hpp"

namespace cellgate::kernel {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

class RecordingTransport : public Transport {
 public:
  bool send(Channel channel, std::vector<std::string> frames) override {
    sent.emplace_back(channel, std::move(frames));
    return accept_sends;
  }
  bool ping() override {
    ++pings;
    return true;
  }
  bool wait(std::chrono::milliseconds) override { return true; }
  bool receive(TransportEvents&) override { return true; }
  void wake() override {}
  std::string name() const override { return "recording"; }

  std::vector<std::pair<Channel, std::vector<std::string>>> sent;
  int pings = 0;
  bool accept_sends = true;
};

struct Ended {
  std::vector<RequestEnd> ends;
  std::vector<std::string> types;  // of the messages routed to the request
};

class KernelRouterTest : public ::testing::Test {
 protected:
  KernelRouterTest() {
    options_.heartbeat_interval = 100ms;
    options_.heartbeat_misses = 3;
    options_.on_iopub = [this](const protocol::EnvelopePtr& env) { iopub_.push_back(env); };
    options_.on_unrouted = [this](const protocol::EnvelopePtr& env) { unrouted_.push_back(env); };
    options_.on_dead = [this](const std::string& reason) { dead_.push_back(reason); };
    options_.on_wire_error = [this](Channel, const Error& e) { wire_errors_.push_back(e.reason); };
  }

  Router& router() {
    if (!router_) {
      router_ = std::make_unique<Router>(options_, session_, signer_, transport_,
                                         [this] { return now_; });
    }
    return *router_;
  }

  // Sends a request whose routed messages and end are recorded in `ended`.
  protocol::Message request(const std::string& type, Ended& ended, bool wait_for_idle = true,
                            Channel channel = Channel::kShell) {
    protocol::Message msg = session_.make(type, json::object());
    RequestHandlers h;
    h.wait_for_idle = wait_for_idle;
    h.on_envelope = [&ended](const protocol::EnvelopePtr& env) {
      ended.types.push_back(env->header().msg_type);
    };
    h.on_end = [&ended](RequestEnd end) { ended.ends.push_back(end); };
    router().send(Router::Outgoing{channel, msg, nullptr, std::move(h)});
    return msg;
  }

  // What the kernel sends: `type` answering `parent`, signed with the kernel's key.
  void from_kernel(Channel channel, const std::string& type, json content,
                   const protocol::Message& parent) {
    protocol::Message msg = kernel_session_.make(type, std::move(content));
    msg.parent_header = parent.header;
    deliver(channel, protocol::encode(msg, signer_));
  }

  void deliver(Channel channel, const std::vector<std::string>& frames) {
    std::vector<std::string_view> views(frames.begin(), frames.end());
    router().on_frames(channel, views, [] {});
  }

  void status(const std::string& state, const protocol::Message& parent) {
    from_kernel(Channel::kIopub, "status", json{{"execution_state", state}}, parent);
  }

  // Ticks every `step` until `until` has passed.
  void run_for(std::chrono::milliseconds span, std::chrono::milliseconds step = 10ms) {
    const auto end = now_ + span;
    while (now_ < end) {
      now_ += step;
      router().tick();
    }
  }

  // The kernel answers the ping outstanding now.
  void pong() { router().on_pong(); }

  ClientOptions options_;
  protocol::Session session_{"cellgate"};
  protocol::Session kernel_session_{"kernel"};
  protocol::Signer signer_ = protocol::Signer::create("hmac-sha256", "secret").value();
  RecordingTransport transport_;
  Clock::time_point now_ = Clock::time_point{} + 1h;
  std::unique_ptr<Router> router_;

  std::vector<protocol::EnvelopePtr> iopub_;
  std::vector<protocol::EnvelopePtr> unrouted_;
  std::vector<std::string> dead_;
  std::vector<std::string> wire_errors_;
};

TEST_F(KernelRouterTest, ARequestCompletesWithItsReplyAndItsIdle) {
  Ended e;
  auto req = request("execute_request", e);
  ASSERT_EQ(transport_.sent.size(), 1u);
  EXPECT_EQ(transport_.sent[0].first, Channel::kShell);
  status("busy", req);
  from_kernel(Channel::kShell, "execute_reply", json{{"status", "ok"}}, req);
  EXPECT_TRUE(e.ends.empty()) << "the reply alone does not complete it";
  status("idle", req);
  EXPECT_EQ(e.ends, std::vector<RequestEnd>{RequestEnd::kComplete});
  EXPECT_EQ(e.types, (std::vector<std::string>{"status", "execute_reply", "status"}));
  EXPECT_EQ(router().pending(), 0u);
  EXPECT_EQ(iopub_.size(), 2u);
  EXPECT_TRUE(unrouted_.empty());
}

TEST_F(KernelRouterTest, ALostIdleCompletesTheRequestAfterTheGrace) {
  Ended e;
  auto req = request("execute_request", e);
  status("busy", req);
  from_kernel(Channel::kShell, "execute_reply", json{{"status", "ok"}}, req);
  // The transport is told to come back when the grace ends, not later.
  EXPECT_LE(router().tick(), Router::kIdleGrace);
  now_ += Router::kIdleGrace - 1ms;
  router().tick();
  EXPECT_TRUE(e.ends.empty());
  now_ += 1ms;
  router().tick();
  EXPECT_EQ(e.ends, std::vector<RequestEnd>{RequestEnd::kComplete});
  EXPECT_EQ(router().pending(), 0u);
  // Its idle, late, is only iopub now.
  status("idle", req);
  EXPECT_EQ(e.ends.size(), 1u);
  EXPECT_EQ(e.types.size(), 2u);
  EXPECT_EQ(iopub_.size(), 2u);
}

TEST_F(KernelRouterTest, ARequestThatWaitsForNoIdleEndsWithItsReply) {
  Ended e;
  auto req = request("shutdown_request", e, /*wait_for_idle=*/false, Channel::kControl);
  from_kernel(Channel::kControl, "shutdown_reply", json{{"status", "ok"}}, req);
  EXPECT_EQ(e.ends, std::vector<RequestEnd>{RequestEnd::kComplete});
}

TEST_F(KernelRouterTest, RepliesToNoRequestOfOursGoToOnUnroutedButIopubDoesNot) {
  protocol::Session client("someone");
  protocol::Message theirs = client.make("kernel_info_request", json::object());
  status("busy", theirs);
  from_kernel(Channel::kShell, "kernel_info_reply", json{{"status", "ok"}}, theirs);
  status("idle", theirs);
  ASSERT_EQ(unrouted_.size(), 1u);
  EXPECT_EQ(unrouted_[0]->header().msg_type, "kernel_info_reply");
  EXPECT_EQ(unrouted_[0]->parent().session, client.id());
  EXPECT_EQ(iopub_.size(), 2u);
  // Without a parent at all (a kernel's status at start-up) too.
  deliver(Channel::kShell,
          protocol::encode(kernel_session_.make("comm_msg", json::object()), signer_));
  EXPECT_EQ(unrouted_.size(), 2u);
}

TEST_F(KernelRouterTest, AReplyForAnUnknownRequestLeavesThePendingOneAlone) {
  Ended e;
  auto mine = request("execute_request", e);
  protocol::Message unknown = session_.make("execute_request", json::object());
  from_kernel(Channel::kShell, "execute_reply", json{{"status", "ok"}}, unknown);
  status("idle", unknown);
  EXPECT_TRUE(e.ends.empty());
  EXPECT_TRUE(e.types.empty());
  EXPECT_EQ(router().pending(), 1u);
  ASSERT_EQ(unrouted_.size(), 1u);
  EXPECT_EQ(unrouted_[0]->parent().msg_id, unknown.msg_id());
  // Its own reply and idle still complete it.
  from_kernel(Channel::kShell, "execute_reply", json{{"status", "ok"}}, mine);
  status("idle", mine);
  EXPECT_EQ(e.ends, std::vector<RequestEnd>{RequestEnd::kComplete});
}

TEST_F(KernelRouterTest, AFrameSetThatFailsItsChecksIsDroppedAndCounted) {
  Ended e;
  auto req = request("execute_request", e);
  protocol::Message reply = kernel_session_.make("execute_reply", json{{"status", "ok"}});
  reply.parent_header = req.header;
  auto wrong_key = protocol::Signer::create("hmac-sha256", "not the key").value();
  deliver(Channel::kShell, protocol::encode(reply, wrong_key));
  EXPECT_EQ(router().wire_errors(), 1u);
  ASSERT_EQ(wire_errors_.size(), 1u);
  EXPECT_TRUE(e.types.empty());
  EXPECT_TRUE(unrouted_.empty());
  EXPECT_EQ(router().pending(), 1u);
}

TEST_F(KernelRouterTest, HeartbeatLossDeclaresDeathAndEndsEveryRequest) {
  router().tick();  // the first ping
  ASSERT_EQ(transport_.pings, 1);
  pong();
  Ended e;
  request("execute_request", e);
  // From here on no ping is answered: three misses in a row, an interval each.
  run_for(250ms);
  EXPECT_TRUE(router().alive());
  run_for(250ms);
  EXPECT_FALSE(router().alive());
  ASSERT_EQ(dead_.size(), 1u);
  EXPECT_EQ(dead_[0], "no answer to 3 heartbeats in a row (300 ms)");
  EXPECT_EQ(router().death_reason(), dead_[0]);
  EXPECT_EQ(e.ends, std::vector<RequestEnd>{RequestEnd::kKernelDead});
  // A request sent to a dead kernel ends at once and reaches no transport.
  const auto sent = transport_.sent.size();
  Ended late;
  request("kernel_info_request", late);
  EXPECT_EQ(late.ends, std::vector<RequestEnd>{RequestEnd::kKernelDead});
  EXPECT_EQ(transport_.sent.size(), sent);
  // No more pings, no second on_dead.
  const int pings = transport_.pings;
  EXPECT_LT(router().tick().count(), 0);
  run_for(1s);
  EXPECT_EQ(transport_.pings, pings);
  EXPECT_EQ(dead_.size(), 1u);
}

TEST_F(KernelRouterTest, AnsweredPingsKeepTheKernelAlive) {
  for (int i = 0; i < 50; ++i) {
    run_for(100ms);
    pong();
  }
  EXPECT_TRUE(router().alive());
  EXPECT_GE(transport_.pings, 45);
  EXPECT_TRUE(dead_.empty());
}

TEST_F(KernelRouterTest, AKernelThatNeverAnsweredIsStartingNotDead) {
  run_for(5s);
  EXPECT_TRUE(router().alive());
  EXPECT_GE(transport_.pings, 40);
}

TEST_F(KernelRouterTest, MissesWhileTheProbeSeesProgressDoNotCount) {
  Progress::State state = Progress::State::kRunning;
  options_.progress = [&state] { return Progress{state, "its process used 90 ms of CPU"}; };
  router().tick();
  pong();
  run_for(2s);
  EXPECT_TRUE(router().alive());
  state = Progress::State::kStalled;
  run_for(500ms);
  EXPECT_FALSE(router().alive());
  ASSERT_EQ(dead_.size(), 1u);
  EXPECT_NE(dead_[0].find("its process used 90 ms of CPU"), std::string::npos) << dead_[0];
}

TEST_F(KernelRouterTest, AKernelThatAnswersOnlyWhileIdleIsExcusedWhileBusy) {
  options_.heartbeat_while_busy = false;
  router().tick();
  pong();
  Ended e;
  auto req = request("execute_request", e);
  status("busy", req);
  run_for(2s);  // a long cell: IRkernel answers no ping meanwhile
  EXPECT_TRUE(router().alive());
  status("idle", req);
  run_for(500ms);
  EXPECT_FALSE(router().alive());
}

TEST_F(KernelRouterTest, KernelInfoSettlesWhetherPingsCountWhileBusy) {
  router().settle_heartbeat(json{{"implementation", "ipython"}});
  router().tick();
  pong();
  Ended e;
  auto req = request("execute_request", e);
  status("busy", req);
  run_for(500ms);  // ipykernel answers from a thread of its own: silence while busy is death
  EXPECT_FALSE(router().alive());
}

TEST_F(KernelRouterTest, APeerTheTransportKnowsGoneIsDeadAtOnce) {
  Ended e;
  request("execute_request", e);
  router().on_peer_gone("out of memory");
  EXPECT_FALSE(router().alive());
  EXPECT_EQ(dead_, std::vector<std::string>{"out of memory"});
  EXPECT_EQ(e.ends, std::vector<RequestEnd>{RequestEnd::kKernelDead});
  router().on_peer_gone("again");
  EXPECT_EQ(dead_.size(), 1u);
  EXPECT_FALSE(router().on_iopub_cut()) << "a dead kernel's iopub is not reopened";
}

TEST_F(KernelRouterTest, AnIopubCutUnderALiveKernelIsToldToTheRunningRequest) {
  Ended e;
  auto req = request("execute_request", e);
  status("busy", req);
  ASSERT_TRUE(router().on_iopub_cut());
  router().on_iopub_reopened();
  EXPECT_EQ(e.types, std::vector<std::string>{"status"})
      << "nothing said before the kernel is heard";
  from_kernel(Channel::kIopub, "stream", json{{"name", "stdout"}, {"text", "after\n"}}, req);
  ASSERT_EQ(e.types, (std::vector<std::string>{"status", "stream", "stream"}));
  ASSERT_GE(iopub_.size(), 3u);
  const auto& notice = iopub_[1]->message();
  EXPECT_EQ(notice.content["name"], "stderr");
  EXPECT_EQ(notice.content["cellgate_dropped"], true);
  EXPECT_EQ(notice.parent_header["msg_id"], req.msg_id());
  EXPECT_EQ(iopub_[2]->message().content["text"], "after\n");
}

// The kernel's last output and idle went out before the new connection was up: the echo of a ping
// sent after the reopen is the proof of life; an echo of an earlier ping is not.
TEST_F(KernelRouterTest, AnIopubCutIsToldOnceALaterPingIsEchoed) {
  Ended e;
  auto req = request("execute_request", e);
  status("busy", req);
  router().tick();
  const int before = transport_.pings;
  ASSERT_GE(before, 1);
  now_ += 10ms;
  ASSERT_TRUE(router().on_iopub_cut());
  router().on_iopub_reopened();
  pong();  // answers the ping sent before the cut
  EXPECT_EQ(e.types, std::vector<std::string>{"status"}) << "an earlier ping proves nothing";
  router().tick();
  EXPECT_EQ(transport_.pings, before + 1)
      << "the fresh ping goes out at once, not an interval later";
  pong();
  ASSERT_EQ(e.types, (std::vector<std::string>{"status", "stream"}));
  EXPECT_EQ(iopub_.back()->message().content["cellgate_dropped"], true);
  EXPECT_EQ(iopub_.back()->message().parent_header["msg_id"], req.msg_id());
  from_kernel(Channel::kIopub, "stream", json{{"name", "stdout"}, {"text", "after\n"}}, req);
  EXPECT_EQ(e.types, (std::vector<std::string>{"status", "stream", "stream"})) << "told once";
}

TEST_F(KernelRouterTest, ATransportThatRefusesASendEndsTheRequest) {
  transport_.accept_sends = false;
  Ended e;
  request("execute_request", e);
  EXPECT_EQ(e.ends, std::vector<RequestEnd>{RequestEnd::kKernelDead});
  EXPECT_EQ(router().pending(), 0u);
}

TEST_F(KernelRouterTest, CloseCancelsWhatIsLeft) {
  Ended a, b;
  request("execute_request", a);
  request("kernel_info_request", b);
  router().close();
  EXPECT_EQ(a.ends, std::vector<RequestEnd>{RequestEnd::kCancelled});
  EXPECT_EQ(b.ends, std::vector<RequestEnd>{RequestEnd::kCancelled});
}

// A client destroyed from one of its own handlers leaves its thread to finish the batch in hand,
// possibly after main() returned: a stopped router checks no signature and calls no handler.
TEST_F(KernelRouterTest, AStoppedRouterDropsWhatArrivesUnread) {
  Ended e;
  auto req = request("execute_request", e);
  router().stop();
  from_kernel(Channel::kShell, "execute_reply", json{{"status", "ok"}}, req);
  status("idle", req);
  auto wrong_key = protocol::Signer::create("hmac-sha256", "not the key").value();
  deliver(Channel::kShell,
          protocol::encode(kernel_session_.make("comm_msg", json::object()), wrong_key));
  router().on_peer_gone("gone");
  EXPECT_TRUE(e.types.empty());
  EXPECT_TRUE(e.ends.empty());
  EXPECT_TRUE(iopub_.empty());
  EXPECT_EQ(router().wire_errors(), 0u);
  EXPECT_TRUE(router().alive());
  EXPECT_FALSE(router().on_iopub_cut());
}

}  // namespace
}  // namespace cellgate::kernel
