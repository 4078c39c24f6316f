#include "cellgate/api/channels.hpp"

#include <spdlog/spdlog.h>

#include <optional>

#include "cellgate/http/log_limiter.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/protocol/envelope.hpp"
#include "cellgate/protocol/ws_frames.hpp"

namespace cellgate::api {
namespace {

using kernel::Channel;

std::optional<Channel> inbound_channel(const std::string& name) {
  if (name == "shell") {
    return Channel::kShell;
  }
  if (name == "control") {
    return Channel::kControl;
  }
  if (name == "stdin") {
    return Channel::kStdin;
  }
  return std::nullopt;  // iopub and hb are not for clients to send on
}

// Once written, a kernel's iopub message is recorded as the session's last delivered one
// (ManagedKernel::delivered): what a gateway after a kill -9 replays starts after it.
struct DeliveryMark {
  std::shared_ptr<kernels::ManagedKernel> kernel;
  std::string session_id;
};

// A kernel message as one connection's frame: the envelope's encoding for the connection's
// format, made by the first connection that sends it and shared by all.
class EnvelopeFrame : public http::OutFrame {
 public:
  EnvelopeFrame(protocol::EnvelopePtr env, bool v1, std::shared_ptr<const DeliveryMark> mark)
      : env_(std::move(env)), v1_(v1), mark_(std::move(mark)) {}
  const std::string& bytes() const override {
    return v1_ ? env_->ws_v1() : env_->ws_legacy(nullptr);
  }
  bool binary() const override { return v1_ || !env_->frames().buffers.empty(); }
  void written() const override {
    if (mark_) {
      mark_->kernel->delivered(mark_->session_id, *env_);
    }
  }

 private:
  protocol::EnvelopePtr env_;
  bool v1_;
  std::shared_ptr<const DeliveryMark> mark_;
};

// A client's message, checked and made an envelope: v1 frames are cut into their parts and
// forwarded as they are; legacy frames are parsed (their JSON holds the parts).
Result<protocol::EnvelopePtr> inbound(std::string_view frame, bool text, bool v1,
                                      kernel::Channel& channel) {
  if (!text && v1) {
    CELLGATE_ASSIGN_OR_RETURN(protocol::WsFrames parts, protocol::split_v1(frame));
    auto ch = inbound_channel(parts.channel);
    if (!ch) {
      return make_error(ErrorCode::kInvalidArgument, "bad_channel",
                        "a message on channel '" + parts.channel + "'");
    }
    channel = *ch;
    return protocol::Envelope::from_frames(channel, std::move(parts.frames));
  }
  CELLGATE_ASSIGN_OR_RETURN(
      protocol::WsMessage decoded,
      text ? protocol::decode_legacy_json(frame) : protocol::decode_legacy_binary(frame));
  auto ch = inbound_channel(decoded.channel);
  if (!ch) {
    return make_error(ErrorCode::kInvalidArgument, "bad_channel",
                      "a message on channel '" + decoded.channel + "'");
  }
  channel = *ch;
  return protocol::Envelope::from_message(channel, std::move(decoded.message));
}

class ChannelBridge : public http::WsHandler,
                      public kernels::ChannelListener,
                      public std::enable_shared_from_this<ChannelBridge> {
 public:
  ChannelBridge(std::shared_ptr<kernels::ManagedKernel> kernel, std::string session_id, bool v1,
                std::function<void()> resume, std::function<Result<nlohmann::json>()> usage)
      : kernel_(std::move(kernel)),
        session_id_(std::move(session_id)),
        mark_(session_id_.empty()
                  ? nullptr
                  : std::make_shared<const DeliveryMark>(DeliveryMark{kernel_, session_id_})),
        v1_(v1),
        resume_(std::move(resume)),
        usage_(std::move(usage)) {}

  ~ChannelBridge() override { kernel_->detach(this); }

  // ---- http::WsHandler (on the connection's strand) ----

  void on_open(std::shared_ptr<http::WsConnection> connection) override {
    {
      MutexLock lock(mu_);
      connection_ = connection;
    }
    if (!kernel_->attach(shared_from_this(), session_id_)) {
      connection->close(1000, "the kernel is gone");
      return;
    }
    resume_if_hibernated();
  }

  void on_message(std::string_view frame, bool text) override {
    kernel::Channel channel = kernel::Channel::kShell;
    auto env = inbound(frame, text, v1_, channel);
    if (!env) {
      // Bad input changes nothing else: the frame is dropped, the connection stays. Logged
      // within limits: a client sending bad frames in a loop must not fill the disk.
      if (auto suffix = log_limiter_.admit("bad_frame")) {
        spdlog::warn("kernel {}: dropped a bad frame: {}{}", kernel_->id(), env.error().message,
                     *suffix);
      }
      return;
    }
    if (channel == kernel::Channel::kControl && usage_ &&
        (*env)->header().msg_type == "usage_request") {
      return answer_usage((*env)->message());
    }
    auto posted = kernel_->post(channel, std::move(env).value(), shared_from_this());
    if (!posted) {
      if (auto suffix = log_limiter_.admit("post")) {
        spdlog::warn("kernel {}: {}{}", kernel_->id(), posted.error().message, *suffix);
      }
    } else if (*posted) {
      resume_if_hibernated();  // queued: it is sent once the kernel is back
    }
  }

  void on_close() override {
    kernel_->detach(this);
    MutexLock lock(mu_);
    connection_.reset();
  }

  // ---- kernels::ChannelListener (any thread) ----

  void deliver(protocol::EnvelopePtr msg) override {
    if (auto c = connection()) {
      // ManagedKernel::delivered records a kernel's iopub messages only.
      c->send(std::make_shared<EnvelopeFrame>(std::move(msg), v1_, mark_));
    }
  }

  void kernel_gone(const std::string& reason) override {
    if (auto c = connection()) {
      c->close(1000, reason);
    }
  }

 private:
  // jupyter-resource-usage's kernel panel: the usage_reply ipykernel ≥ 6.21 would send,
  // measured from the kernel's cgroup (a jailed kernel's psutil sees only its own namespace).
  void answer_usage(const protocol::Message& request) {
    auto usage = usage_();
    nlohmann::json content = usage ? std::move(usage).value()
                                   : nlohmann::json{{"status", "error"},
                                                    {"ename", usage.error().reason},
                                                    {"evalue", usage.error().message}};
    protocol::Message reply =
        gateway_session_.make_reply(request, "usage_reply", std::move(content));
    reply.identities.clear();
    deliver(protocol::Envelope::from_message(kernel::Channel::kControl, std::move(reply)));
  }

  void resume_if_hibernated() {
    if (resume_ && kernel_->claim_resume()) {
      resume_();  // on a worker; other touches meanwhile wait in the kernel's queue
    }
  }

  std::shared_ptr<http::WsConnection> connection() {
    MutexLock lock(mu_);
    return connection_;
  }

  std::shared_ptr<kernels::ManagedKernel> kernel_;
  std::string session_id_;
  std::shared_ptr<const DeliveryMark> mark_;  // null without a session id
  bool v1_;
  std::function<void()> resume_;
  std::function<Result<nlohmann::json>()> usage_;
  const protocol::Session gateway_session_{"cellgate"};
  http::LogLimiter log_limiter_;  // this connection's repeated warnings
  Mutex mu_;
  std::shared_ptr<http::WsConnection> connection_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace

bool offers_v1(const http::Request& req) {
  auto it = req.find(http::Field::sec_websocket_protocol);
  if (it == req.end()) {
    return false;
  }
  std::string_view offered = it->value();
  while (!offered.empty()) {
    auto comma = offered.find(',');
    std::string_view token = offered.substr(0, comma);
    while (!token.empty() && token.front() == ' ') {
      token.remove_prefix(1);
    }
    while (!token.empty() && token.back() == ' ') {
      token.remove_suffix(1);
    }
    if (token == protocol::kV1Subprotocol) {
      return true;
    }
    offered = comma == std::string_view::npos ? std::string_view() : offered.substr(comma + 1);
  }
  return false;
}

std::shared_ptr<http::WsHandler> make_channel_bridge(
    std::shared_ptr<kernels::ManagedKernel> kernel, std::string session_id, bool v1,
    std::function<void()> resume, std::function<Result<nlohmann::json>()> usage) {
  return std::make_shared<ChannelBridge>(std::move(kernel), std::move(session_id), v1,
                                         std::move(resume), std::move(usage));
}

}  // namespace cellgate::api
