// What the HTTP layer serves: a Handler answers requests and decides WebSocket upgrades; the
// WebSocket it accepts talks to a WsHandler through a WsConnection. The HTTP layer knows nothing
// of Jupyter: the channel bridge (api/) implements WsHandler, the session (http/) WsConnection.
//
//   class Bridge : public http::WsHandler { … };
//   http::Upgrade Api::upgrade(const http::Request& req) {
//     if (!authorized(req)) return {.refusal = http::error_response(req, …)};
//     return {.handler = std::make_shared<Bridge>(kernel), .subprotocol = "v1.kernel…"};
//   }
//
// Outbound frames are OutFrames: made (encoded) on first use, on the connection's strand, so one
// message sent to many connections is encoded once and never on the producer's thread.
//
// Thread-safety: Handler methods may be called from any network thread at once. A WsHandler's
// methods are called on its connection's strand, one at a time. WsConnection's methods may be
// called from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "cellgate/http/message.hpp"

namespace cellgate::http {

// One outbound WebSocket message, made when first asked for.
class OutFrame {
 public:
  virtual ~OutFrame() = default;
  virtual const std::string& bytes() const = 0;
  virtual bool binary() const = 0;
  // Its write completed: every byte is in the kernel's socket buffer (on the strand).
  virtual void written() const {}
};

// A frame already made.
class ReadyFrame : public OutFrame {
 public:
  ReadyFrame(std::string bytes, bool binary) : bytes_(std::move(bytes)), binary_(binary) {}
  const std::string& bytes() const override { return bytes_; }
  bool binary() const override { return binary_; }

 private:
  std::string bytes_;
  bool binary_;
};

// The session's side of an accepted WebSocket.
class WsConnection {
 public:
  virtual ~WsConnection() = default;
  // Queues a message. A client whose unsent bytes pass the limit (HttpOptions) is disconnected
  // with 1008 and a logged reason; the message is dropped for it alone.
  virtual void send(std::shared_ptr<const OutFrame> frame) = 0;
  // Sends what is queued, then a close frame with this code (RFC 6455 §7.4) and reason.
  virtual void close(std::uint16_t code, std::string reason) = 0;
};

// The application's side of an accepted WebSocket.
class WsHandler {
 public:
  virtual ~WsHandler() = default;
  // The handshake is done: `connection` stays valid until on_close().
  virtual void on_open(std::shared_ptr<WsConnection> connection) = 0;
  // A whole message from the client (text or binary), at most HttpOptions::max_ws_message_bytes.
  virtual void on_message(std::string_view data, bool text) = 0;
  // The connection ended (either side closed, an error, or too slow); called once.
  virtual void on_close() = 0;
};

// The answer to an upgrade request: a refusal (401, 403, 404 …) or a handler and the subprotocol
// to accept ("" : none).
struct Upgrade {
  std::optional<Response> refusal;
  std::shared_ptr<WsHandler> handler;
  std::string subprotocol;
};

// Set by the Api on a request it passes to a mounted handler (/mcp): the tenant whose API key
// authenticated it; absent for the operator's token. A client's own is removed first, so a
// handler may trust it.
inline constexpr const char* kTenantField = "X-Cellgate-Tenant";

class Handler {
 public:
  virtual ~Handler() = default;
  virtual void handle(Request req, std::shared_ptr<Exchange> exchange) = 0;
  virtual Upgrade upgrade(const Request& req) = 0;
};

}  // namespace cellgate::http
