// The launcher's iopub spool (kernel-launcher/src/spool.hpp, spool_service.hpp) and the
// gateway's reader of it (gateway/kernel/spool.hpp): what is kept and evicted, what a hostile
// header costs, the reply's wire format read back by fetch_spool, and the hold a checkpoint
// takes (the SUB socket closed, so the kernel's PUB sees its subscriber go; taken up again
// after). A real ZeroMQ PUB on an ipc endpoint in a temp dir plays the kernel. No root.
#include "cellgate/kernel/spool.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "cellgate/testing/fake_kernel.hpp"
#include "spool.hpp"
#include "spool_service.hpp"

namespace cellgate::launcher {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// An iopub message as a kernel's PUB sends it: topic, delimiter, signature, four JSON frames.
std::vector<std::string> message(const std::string& msg_id, const std::string& text = "x") {
  nlohmann::json header = {{"msg_id", msg_id}, {"msg_type", "stream"}};
  nlohmann::json content = {{"name", "stdout"}, {"text", text}};
  return {"stream", "<IDS|MSG>", "sig", header.dump(), "{}", "{}", content.dump()};
}

std::string id_of(const std::vector<std::string>& frames) {
  return header_msg_id(frames.at(3));
}

TEST(IopubSpool, AfterAKeptMessageComesWhatFollowedItAndNothingIsLost) {
  IopubSpool spool(1 << 20);
  for (int i = 0; i < 5; ++i) {
    spool.add(message("m" + std::to_string(i)));
  }
  auto reply = spool.after(std::string("m2"));
  EXPECT_TRUE(reply.found);
  EXPECT_EQ(reply.dropped, 0u);
  ASSERT_EQ(reply.messages.size(), 2u);
  EXPECT_EQ(id_of(*reply.messages[0]), "m3");
  EXPECT_EQ(id_of(*reply.messages[1]), "m4");
  EXPECT_EQ(spool.after(std::nullopt).messages.size(), 5u);
  EXPECT_TRUE(spool.after(std::string("m4")).messages.empty());
}

TEST(IopubSpool, PastTheBudgetTheOldestGoAndAReaderIsToldExactlyHowManyItMissed) {
  const std::size_t one = IopubSpool::kEntryOverhead + 7 * IopubSpool::kFrameOverhead + 200;
  IopubSpool spool(one * 10);
  for (int i = 0; i < 30; ++i) {
    spool.add(message("m" + std::to_string(i), std::string(100, 'x')));
  }
  EXPECT_LE(spool.bytes(), one * 10);
  ASSERT_GT(spool.evicted(), 0u);
  const std::size_t kept = spool.size();
  // m3 went: everything after it that went too is counted, the rest is sent.
  auto reply = spool.after(std::string("m3"));
  EXPECT_FALSE(reply.found);
  EXPECT_TRUE(reply.dropped_exact);
  EXPECT_EQ(reply.dropped, 30 - kept - 4);
  EXPECT_EQ(reply.messages.size(), kept);
  EXPECT_EQ(id_of(*reply.messages.front()), "m" + std::to_string(30 - kept));
  // An id it never had: everything it dropped, not exact.
  auto unknown = spool.after(std::string("never"));
  EXPECT_FALSE(unknown.dropped_exact);
  EXPECT_EQ(unknown.dropped, spool.evicted());
}

TEST(IopubSpool, AMessageLargerThanTheBudgetOrOfTooManyFramesIsRefusedAndCounted) {
  IopubSpool spool(4096);
  spool.add(message("big", std::string(8192, 'x')));
  spool.add(std::vector<std::string>(IopubSpool::kMaxFrames + 1, "f"));
  EXPECT_EQ(spool.size(), 0u);
  EXPECT_EQ(spool.evicted(), 2u);
  EXPECT_EQ(spool.bytes(), 0u);
}

TEST(IopubSpool, AHostileHeaderYieldsNoMsgIdAndCostsBoundedWork) {
  EXPECT_EQ(header_msg_id(R"({"msg_id":"a","x":{"msg_id":"b"}})"), "a");
  EXPECT_EQ(header_msg_id(R"({"x":{"msg_id":"b"}})"), "");  // nested: not the header's
  EXPECT_EQ(header_msg_id(R"({"msg_id":7})"), "");
  EXPECT_EQ(header_msg_id(R"(["msg_id","a"])"), "");
  EXPECT_EQ(header_msg_id(R"({"msg_id":"a"}{"msg_id":"b"})"), "");
  EXPECT_EQ(header_msg_id("{\"msg_id\":\"a\""), "");  // cut off
  // Deep nesting (no recursion on it), and more than the size limit.
  std::string deep = "{\"a\":" + std::string(60000, '[');
  EXPECT_EQ(header_msg_id(deep), "");
  std::string large =
      "{\"msg_id\":\"a\",\"pad\":\"" + std::string(IopubSpool::kMaxHeaderBytes, 'x') + "\"}";
  EXPECT_EQ(header_msg_id(large), "");
  // Such a message is still kept (it can be replayed, not asked for).
  IopubSpool spool(1 << 20);
  spool.add({"t", "<IDS|MSG>", "sig", deep, "{}", "{}", "{}"});
  EXPECT_EQ(spool.size(), 1u);
}

// A PUB socket on an ipc endpoint (the kernel) and a SpoolService on it, polled on a thread of
// its own as the launcher's loop does.
class SpoolServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-spool-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    endpoint_ = "ipc://" + dir_ + "/iopub";
    pub_.set(zmq::sockopt::linger, 0);
    pub_.bind(endpoint_);
    ASSERT_EQ(zmq_socket_monitor(pub_.handle(), "inproc://pub-monitor",
                                 ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED),
              0);
    monitor_.connect("inproc://pub-monitor");
    socket_ = dir_ + "/spool.sock";
    service_ = SpoolService::start(endpoint_, socket_, std::nullopt);
    ASSERT_TRUE(service_);
    loop_ = std::thread([this] {
      while (!stop_.load()) {
        std::vector<pollfd> fds;
        service_->add_pollfds(fds);
        ::poll(fds.data(), fds.size(), service_->poll_timeout_ms(20));
        service_->on_poll(fds);
      }
    });
  }
  void TearDown() override {
    // Monitoring stops first. libzmq 4.3.4 leaks an event's address frame when its monitor
    // socket cannot send it, which happened when the SUB's disconnect below was reported after
    // monitor_ had closed (LeakSanitizer saw it under load).
    if (pub_.handle() != nullptr) {
      (void)zmq_socket_monitor(pub_.handle(), nullptr, 0);
    }
    stop_.store(true);
    if (loop_.joinable()) {
      loop_.join();
    }
    service_.reset();
    monitor_.close();
    pub_.close();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // The next event of the PUB's monitor within `timeout`, or 0.
  int next_event(std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{monitor_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) {
      return 0;
    }
    zmq::message_t event, address;
    (void)monitor_.recv(event);
    (void)monitor_.recv(address);
    std::uint16_t id = 0;
    std::memcpy(&id, event.data(), sizeof id);
    return id;
  }

  void publish(const std::vector<std::string>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      pub_.send(zmq::buffer(frames[i]),
                i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

  // Publishes `id` until the spool has it (a SUB that has just connected misses what came
  // before its subscription reached the PUB).
  bool published_and_spooled(const std::string& id) {
    return testing::eventually([&] {
      publish(message(id));
      auto got = kernel::fetch_spool(socket_, "", 5s);
      if (!got) {
        return false;
      }
      for (const auto& m : got->messages) {
        if (id_of(m) == id) {
          return true;
        }
      }
      return false;
    });
  }

  std::string dir_, endpoint_, socket_;
  zmq::context_t ctx_{1};
  zmq::socket_t pub_{ctx_, zmq::socket_type::pub};
  zmq::socket_t monitor_{ctx_, zmq::socket_type::pair};
  std::unique_ptr<SpoolService> service_;
  std::thread loop_;
  std::atomic<bool> stop_{false};
};

TEST_F(SpoolServiceTest, TheGatewayReadsBackWhatThePubSentFramesIntact) {
  ASSERT_TRUE(published_and_spooled("first"));
  for (int i = 0; i < 3; ++i) {
    publish(message("n" + std::to_string(i), std::string(i, '\0') + "ü"));
  }
  ASSERT_TRUE(testing::eventually([&] {
    auto got = kernel::fetch_spool(socket_, "first", 5s);
    return got && got->messages.size() == 3;
  }));
  auto got = kernel::fetch_spool(socket_, "first", 5s);
  ASSERT_TRUE(got);
  EXPECT_TRUE(got->found);
  EXPECT_EQ(got->messages[2], message("n2", std::string(2, '\0') + "ü"));
  auto head = kernel::fetch_spool(socket_, "n0", 5s, /*head_only=*/true);
  ASSERT_TRUE(head);
  EXPECT_TRUE(head->found);
  EXPECT_TRUE(head->messages.empty());
}

TEST_F(SpoolServiceTest, AHoldClosesTheSubscriptionUntilItIsLetGo) {
  ASSERT_EQ(next_event(30s), ZMQ_EVENT_ACCEPTED);
  ASSERT_TRUE(published_and_spooled("before"));
  auto held = kernel::hold_spool(socket_, true, 10s);
  ASSERT_TRUE(held) << held.error().message;
  EXPECT_TRUE(*held);
  // The kernel's side sees its subscriber go: nothing leads out of the jail for CRIU to find.
  EXPECT_EQ(next_event(30s), ZMQ_EVENT_DISCONNECTED);
  publish(message("while-held"));
  auto released = kernel::hold_spool(socket_, false, 10s);
  ASSERT_TRUE(released);
  EXPECT_FALSE(*released);
  EXPECT_EQ(next_event(30s), ZMQ_EVENT_ACCEPTED);
  ASSERT_TRUE(published_and_spooled("after"));
  auto got = kernel::fetch_spool(socket_, "before", 5s);
  ASSERT_TRUE(got);
  for (const auto& m : got->messages) {
    EXPECT_NE(id_of(m), "while-held");
  }
}

TEST_F(SpoolServiceTest, AReadEndsAHoldThatNoGatewayLetGo) {
  ASSERT_EQ(next_event(30s), ZMQ_EVENT_ACCEPTED);
  auto held = kernel::hold_spool(socket_, true, 10s);
  ASSERT_TRUE(held && *held);
  ASSERT_EQ(next_event(30s), ZMQ_EVENT_DISCONNECTED);
  // A gateway killed mid-snapshot; the next one reads the spool.
  ASSERT_TRUE(kernel::fetch_spool(socket_, "", 5s));
  EXPECT_EQ(next_event(30s), ZMQ_EVENT_ACCEPTED);
  EXPECT_TRUE(published_and_spooled("later"));
}

// Connects to the spool socket, sends `request` and reads until the service closes.
std::string raw_exchange(const std::string& path, const std::string& request) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, sizeof addr.sun_path - 1);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

TEST_F(SpoolServiceTest, AHostileOrSilentRequesterIsAnsweredOrDroppedAndTheSpoolServesOn) {
  ASSERT_TRUE(published_and_spooled("alive"));
  EXPECT_NE(raw_exchange(socket_, "not json\n").find("\"error\""), std::string::npos);
  EXPECT_NE(raw_exchange(socket_, "{\"hold\":\"yes\"}\n").find("\"count\""),
            std::string::npos);  // not a boolean: an ordinary read
  // A line longer than the limit, and a requester that never ends its line: dropped.
  EXPECT_EQ(raw_exchange(socket_, std::string(SpoolService::kMaxRequestBytes * 2, 'x')), "");
  EXPECT_EQ(raw_exchange(socket_, "{\"after\":"), "");
  ASSERT_TRUE(published_and_spooled("still"));
}

}  // namespace
}  // namespace cellgate::launcher
