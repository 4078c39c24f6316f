// Internal: the per-connection session classes of the gateway's network side, templated on the
// stream so they run over TCP, TLS, and Beast's in-memory test::stream (tests/unit).
//
// Thread-safety: each session lives on its own strand (the stream's executor); deliver() and
// kernel_gone() of a WsSession may be called from any thread and post onto it.
#pragma once

#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <optional>
#include <type_traits>

#include "cellgate/server/api.hpp"
#include "cellgate/server/kernel_manager.hpp"
#include "cellgate/server/ws_frames.hpp"

namespace cellgate::server::detail {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using kernel::Channel;

inline std::optional<Channel> inbound_channel(const std::string& name) {
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

inline bool offers_v1(const Request& req) {
  auto it = req.find(http::field::sec_websocket_protocol);
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
    if (token == kV1Subprotocol) {
      return true;
    }
    offered = comma == std::string_view::npos ? std::string_view() : offered.substr(comma + 1);
  }
  return false;
}

// Stream capabilities, so one session template serves tcp_stream, ssl_stream and test::stream.
template <class Stream>
void set_deadline(Stream& stream, std::chrono::seconds d) {
  if constexpr (requires { beast::get_lowest_layer(stream).expires_after(d); }) {
    beast::get_lowest_layer(stream).expires_after(d);
  }
}
template <class Stream>
void clear_deadline(Stream& stream) {
  if constexpr (requires { beast::get_lowest_layer(stream).expires_never(); }) {
    beast::get_lowest_layer(stream).expires_never();
  }
}
template <class Stream>
void shutdown_send(Stream& stream) {
  beast::error_code ec;
  if constexpr (requires { stream.socket().shutdown(tcp::socket::shutdown_send, ec); }) {
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  } else if constexpr (requires { stream.close(); }) {
    stream.close();
  }
}
template <class Stream>
constexpr bool kIsTls = requires(Stream& s) {
  s.async_handshake(ssl::stream_base::server, [](beast::error_code) {});
};

// ---- WebSocket: one client connection to one kernel's channels --------------------------------

template <class Stream>
class WsSession : public ChannelListener, public std::enable_shared_from_this<WsSession<Stream>> {
 public:
  WsSession(Stream&& stream, std::shared_ptr<ManagedKernel> kernel, std::string session_id,
            const ServeOptions& options)
      : ws_(std::move(stream)),
        kernel_(std::move(kernel)),
        session_id_(std::move(session_id)),
        options_(options) {}

  ~WsSession() override { kernel_->detach(this); }

  void run(Request req) {
    v1_ = offers_v1(req);
    websocket::stream_base::timeout timeout{};
    timeout.handshake_timeout = std::chrono::seconds(30);
    timeout.idle_timeout = options_.ws_ping_interval > 0
                               ? std::chrono::milliseconds(static_cast<long long>(
                                     options_.ws_ping_interval * 3000))
                               : websocket::stream_base::none();
    timeout.keep_alive_pings = options_.ws_ping_interval > 0;
    ws_.set_option(timeout);
    const bool v1 = v1_;
    ws_.set_option(websocket::stream_base::decorator([v1](websocket::response_type& res) {
      res.set(http::field::server, "cellgate");
      if (v1) {
        res.set(http::field::sec_websocket_protocol, kV1Subprotocol);
      }
    }));
    ws_.read_message_max(options_.max_ws_message_bytes);
    clear_deadline(ws_);
    ws_.async_accept(req, beast::bind_front_handler(&WsSession::on_accept, this->shared_from_this()));
  }

  void deliver(Channel channel, std::shared_ptr<const protocol::Message> msg) override {
    // Encoded on the caller's (kernel I/O) thread; queued on this connection's strand.
    const std::string name = kernel::to_string(channel);
    bool binary = true;
    auto data = std::make_shared<const std::string>(v1_ ? encode_v1(name, *msg)
                                                        : encode_legacy(name, *msg, binary));
    net::post(ws_.get_executor(), [self = this->shared_from_this(), data, binary] {
      self->enqueue(data, binary);
    });
  }

  void kernel_gone(const std::string& reason) override {
    net::post(ws_.get_executor(), [self = this->shared_from_this(), reason] {
      self->begin_close(websocket::close_code::normal, reason);
    });
  }

 private:
  void on_accept(beast::error_code ec) {
    if (ec) {
      return;
    }
    if (!kernel_->attach(this->shared_from_this(), session_id_)) {
      begin_close(websocket::close_code::normal, "the kernel is gone");
      return;
    }
    do_read();
  }

  void do_read() {
    ws_.async_read(buffer_, beast::bind_front_handler(&WsSession::on_read, this->shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec) {
      if (ec == websocket::error::message_too_big) {
        spdlog::warn("kernel {}: a client sent a message over {} bytes; closing it", kernel_->id(),
                     options_.max_ws_message_bytes);
      }
      kernel_->detach(this);
      return;
    }
    const auto data = buffer_.cdata();
    std::string_view frame(static_cast<const char*>(data.data()), data.size());
    Result<WsMessage> decoded = ws_.got_text() ? decode_legacy_json(frame)
                                : v1_          ? decode_v1(frame)
                                               : decode_legacy_binary(frame);
    if (!decoded) {
      // Bad input changes nothing else: the frame is dropped, the connection stays.
      spdlog::warn("kernel {}: dropped a bad frame: {}", kernel_->id(), decoded.error().message);
    } else if (auto channel = inbound_channel(decoded->channel); !channel) {
      spdlog::warn("kernel {}: dropped a message on channel '{}'", kernel_->id(),
                   decoded->channel);
    } else if (auto posted = kernel_->post(*channel, std::move(decoded->message),
                                           this->shared_from_this());
               !posted) {
      spdlog::warn("kernel {}: {}", kernel_->id(), posted.error().message);
    }
    buffer_.consume(buffer_.size());
    do_read();
  }

  void enqueue(std::shared_ptr<const std::string> data, bool binary) {
    if (closing_) {
      return;
    }
    queued_bytes_ += data->size();
    if (queued_bytes_ > options_.max_ws_queue_bytes) {
      // A client that does not read must not grow the gateway's memory without bound.
      spdlog::warn("kernel {}: a client fell {} bytes behind (limit {}); disconnecting it",
                   kernel_->id(), queued_bytes_, options_.max_ws_queue_bytes);
      queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
      begin_close(websocket::close_code::policy_error, "client too slow: output queue full");
      return;
    }
    queue_.push_back({std::move(data), binary});
    if (!writing_) {
      do_write();
    }
  }

  void do_write() {
    writing_ = true;
    ws_.binary(queue_.front().binary);
    ws_.async_write(net::buffer(*queue_.front().data),
                    beast::bind_front_handler(&WsSession::on_write, this->shared_from_this()));
  }

  void on_write(beast::error_code ec, std::size_t) {
    writing_ = false;
    queued_bytes_ -= queue_.front().data->size();
    queue_.pop_front();
    if (ec) {
      kernel_->detach(this);
      return;
    }
    if (close_reason_) {
      do_close();
      return;
    }
    if (!queue_.empty()) {
      do_write();
    }
  }

  void begin_close(websocket::close_code code, const std::string& reason) {
    if (closing_) {
      return;
    }
    closing_ = true;
    kernel_->detach(this);
    close_reason_ = websocket::close_reason(code, reason.substr(0, 120));
    if (!writing_) {
      do_close();
    }
  }

  void do_close() {
    queue_.clear();
    ws_.async_close(*close_reason_, [self = this->shared_from_this()](beast::error_code) {});
  }

  struct Frame {
    std::shared_ptr<const std::string> data;
    bool binary;
  };

  websocket::stream<Stream> ws_;
  beast::flat_buffer buffer_;
  std::shared_ptr<ManagedKernel> kernel_;
  std::string session_id_;
  const ServeOptions& options_;
  bool v1_ = false;
  std::deque<Frame> queue_;
  std::size_t queued_bytes_ = 0;
  bool writing_ = false;
  bool closing_ = false;
  std::optional<websocket::close_reason> close_reason_;
};

// ---- HTTP: one connection, one request at a time ----------------------------------------------

template <class Stream>
class HttpSession : public std::enable_shared_from_this<HttpSession<Stream>> {
 public:
  static constexpr bool kTls = kIsTls<Stream>;

  template <class... Args>
  HttpSession(Api& api, const ServeOptions& options, Args&&... args)
      : stream_(std::forward<Args>(args)...), api_(api), options_(options) {}

  void run() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&HttpSession::start, this->shared_from_this()));
  }

 private:
  void start() {
    if constexpr (kTls) {
      set_deadline(stream_, std::chrono::seconds(30));
      stream_.async_handshake(ssl::stream_base::server,
                              beast::bind_front_handler(&HttpSession::on_handshake,
                                                        this->shared_from_this()));
    } else {
      do_read();
    }
  }

  void on_handshake(beast::error_code ec) {
    if (!ec) {
      do_read();
    }
  }

  void do_read() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(options_.max_header_bytes));
    set_deadline(stream_, std::chrono::seconds(60));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&HttpSession::on_read, this->shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec == http::error::end_of_stream) {
      return do_eof();
    }
    if (ec == http::error::body_limit || ec == http::error::header_limit) {
      Request stub;
      stub.version(11);
      const bool body = ec == http::error::body_limit;
      auto res = Api::json_response(
          stub, body ? http::status::payload_too_large
                     : http::status::request_header_fields_too_large,
          {{"reason", body ? "Payload Too Large" : "Request Header Fields Too Large"},
           {"message", body ? "the request body is over the limit of " +
                                  std::to_string(options_.max_body_bytes) + " bytes"
                            : "the request headers are over the limit"}});
      res.keep_alive(false);
      return send(std::move(res));
    }
    if (ec) {
      return;  // timeouts, resets, garbage: drop the connection, nothing else changes
    }
    Request req = parser_->release();
    if (websocket::is_upgrade(req)) {
      auto check = api_.check_channels(req);
      if (check.refusal) {
        check.refusal->keep_alive(false);
        return send(std::move(*check.refusal));
      }
      auto ws = std::make_shared<WsSession<Stream>>(std::move(stream_), std::move(check.kernel),
                                                    std::move(check.session_id), options_);
      ws->run(std::move(req));
      return;
    }
    auto self = this->shared_from_this();
    api_.handle(std::move(req), [self](Response res) {
      net::post(self->stream_.get_executor(),
                [self, res = std::move(res)]() mutable { self->send(std::move(res)); });
    });
  }

  void send(Response res) {
    response_ = std::make_shared<Response>(std::move(res));
    http::async_write(stream_, *response_,
                      beast::bind_front_handler(&HttpSession::on_write, this->shared_from_this(),
                                                response_->keep_alive()));
  }

  void on_write(bool keep_alive, beast::error_code ec, std::size_t) {
    response_.reset();
    if (ec) {
      return;
    }
    if (!keep_alive) {
      return do_eof();
    }
    do_read();
  }

  void do_eof() {
    if constexpr (kTls) {
      set_deadline(stream_, std::chrono::seconds(5));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {});
    } else {
      shutdown_send(stream_);
    }
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<Response> response_;
  Api& api_;
  const ServeOptions& options_;
};

}  // namespace cellgate::server::detail
