// KernelClient: one connection to one Jupyter kernel over ZeroMQ.
//
// It connects shell, control and stdin (DEALER, one routing id so the kernel's input_request
// reaches us), iopub (SUB, everything) and heartbeat (REQ) to the endpoints of a connection file,
// routes replies, iopub messages and input requests to the request they answer (by parent
// msg_id), and declares the kernel dead when it stops answering heartbeats.
//
//   auto client = KernelClient::connect(info, {});
//   client.value()->wait_ready(5s);
//   auto run = client.value()->request(Channel::kShell, "execute_request",
//                                      execute_content("x = 1"), 30s);
//   for (auto& [channel, msg] : run->messages) { ... }
//
// Threading: all five ZeroMQ sockets belong to one I/O thread that the client owns; no socket is
// touched from any other thread. Public methods are thread-safe: they queue work for the I/O
// thread and wake it through an eventfd. Handlers run on the I/O thread and must not block.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/kernel/connection.hpp"
#include "cellgate/protocol/codec.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernel {

using MessageHandler = std::function<void(Channel, const protocol::Message&)>;

struct ClientOptions {
  // A ping every interval; `heartbeat_misses` unanswered pings in a row mean the kernel is dead.
  // Detection takes at most (misses + 1) * interval after the kernel stops. Death is only
  // declared once the kernel has answered a first ping (a starting kernel is not dead).
  std::chrono::milliseconds heartbeat_interval{200};
  int heartbeat_misses = 3;
  protocol::Limits limits;
  std::string username = "cellgate";

  // Every iopub message, whether or not it answers a request of ours (it is also given to that
  // request's handler). When set, on_unrouted no longer sees iopub messages.
  MessageHandler on_iopub;
  // Messages whose parent is no request of ours: status at start-up, other clients' iopub,
  // replies to messages sent with post().
  MessageHandler on_unrouted;
  // The kernel stopped answering heartbeats. Called once.
  std::function<void(const std::string& reason)> on_dead;
  // A frame set from the kernel that failed to decode (bad signature, bad JSON, too large).
  // It is dropped; nothing else changes.
  std::function<void(Channel, const Error&)> on_wire_error;
};

enum class RequestEnd {
  kComplete,    // the reply arrived, and (if waited for) iopub status idle for this request
  kKernelDead,  // the kernel died before the request completed
  kCancelled,   // the client was destroyed first
};
const char* to_string(RequestEnd end);

struct RequestHandlers {
  // The reply, every iopub message and every input_request whose parent is this request.
  MessageHandler on_message;
  // Called exactly once, last.
  std::function<void(RequestEnd)> on_end;
  // Complete only after iopub status "idle" for this request as well as the reply, so every
  // output has been delivered. Turn off for requests whose idle may never come (shutdown, or a
  // kernel_info sent before the iopub subscription is live).
  bool wait_for_idle = true;
};

// Everything one request produced, in arrival order.
struct Collected {
  std::vector<std::pair<Channel, protocol::Message>> messages;
  std::optional<protocol::Message> reply;
  RequestEnd end = RequestEnd::kComplete;
};

// content of an execute_request with the spec's defaults.
nlohmann::json execute_content(std::string code, bool allow_stdin = false,
                               bool store_history = true, bool silent = false);

class KernelClient {
 public:
  static Result<std::unique_ptr<KernelClient>> connect(const ConnectionInfo& info,
                                                       ClientOptions options = {});
  ~KernelClient();
  KernelClient(const KernelClient&) = delete;
  KernelClient& operator=(const KernelClient&) = delete;

  const protocol::Session& session() const;

  // Queues a request; returns its msg_id at once. The handlers run on the I/O thread.
  std::string send(Channel channel, protocol::Message msg, RequestHandlers handlers);
  std::string send(Channel channel, std::string_view msg_type, nlohmann::json content,
                   RequestHandlers handlers);

  // Sends a message as it is (its own header, session and parent), re-signed with the kernel's
  // key, without tracking a reply: what comes back goes to on_unrouted. For bridging clients
  // (WebSockets) that route replies themselves.
  void post(Channel channel, protocol::Message msg);

  // Answers an input_request received on the stdin channel.
  void send_input(const protocol::Message& input_request, std::string value);

  // Sends a request and waits until it ends or `timeout` passes (kDeadlineExceeded; the request
  // stays routed and its late messages are dropped).
  Result<Collected> request(Channel channel, std::string_view msg_type, nlohmann::json content,
                            std::chrono::milliseconds timeout, bool wait_for_idle = true);

  // Waits until the kernel answers kernel_info_request and iopub delivers messages (ZeroMQ's
  // late joiner: a SUB misses what was published before its subscription arrived). Returns the
  // kernel_info_reply content.
  Result<nlohmann::json> wait_ready(std::chrono::milliseconds timeout);

  bool is_alive() const;
  // Wire errors seen so far (dropped frame sets).
  std::size_t wire_errors() const;

 private:
  struct Impl;
  explicit KernelClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cellgate::kernel
