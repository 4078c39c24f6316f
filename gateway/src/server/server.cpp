#include "cellgate/server/server.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <iostream>
#include <optional>
#include <thread>
#include <vector>

#include "cellgate/jail/jail.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/server/api.hpp"
#include "cellgate/server/kernel_manager.hpp"
#include "cellgate/server/ws_frames.hpp"

namespace cellgate::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
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

bool offers_v1(const Request& req) {
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
    beast::get_lowest_layer(ws_).expires_never();
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
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

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
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(30));
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
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(60));
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
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(5));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {});
    } else {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    }
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<Response> response_;
  Api& api_;
  const ServeOptions& options_;
};

}  // namespace

// ---- Server ----------------------------------------------------------------------------------

struct Server::Impl {
  ServeOptions options;
  std::string token;
  net::io_context ioc;
  std::optional<ssl::context> tls;
  std::unique_ptr<KernelManager> manager;
  std::unique_ptr<Api> api;
  tcp::acceptor acceptor{net::make_strand(ioc)};

  void do_accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec != net::error::operation_aborted) {
          do_accept();
        }
        return;
      }
      socket.set_option(tcp::no_delay(true), ec);
      if (tls) {
        std::make_shared<HttpSession<beast::ssl_stream<beast::tcp_stream>>>(
            *api, options, std::move(socket), *tls)
            ->run();
      } else {
        std::make_shared<HttpSession<beast::tcp_stream>>(*api, options, std::move(socket))->run();
      }
      do_accept();
    });
  }
};

Server::Server(ServeOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  if (impl_->options.token.empty() && !impl_->options.no_token) {
    impl_->options.token = kernel::random_hex(24);
  }
  impl_->token = impl_->options.no_token ? "" : impl_->options.token;
  impl_->manager = std::make_unique<KernelManager>(impl_->options);
  impl_->api = std::make_unique<Api>(*impl_->manager, impl_->manager->options(), impl_->token);
}

Server::~Server() {
  stop();
  impl_->api.reset();
  impl_->manager.reset();
}

const std::string& Server::token() const { return impl_->token; }
KernelManager& Server::manager() { return *impl_->manager; }

Result<int> Server::start() {
  auto& o = impl_->options;
  if (!o.certfile.empty() || !o.keyfile.empty()) {
    if (o.certfile.empty() || o.keyfile.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "tls", "TLS needs both --certfile and --keyfile");
    }
    try {
      impl_->tls.emplace(ssl::context::tls_server);
      impl_->tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                              ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                              ssl::context::no_tlsv1_1);
      impl_->tls->use_certificate_chain_file(o.certfile);
      impl_->tls->use_private_key_file(o.keyfile, ssl::context::pem);
    } catch (const std::exception& e) {
      return make_error(ErrorCode::kInvalidArgument, "tls",
                        std::string("cannot load the TLS certificate or key: ") + e.what());
    }
  }
  beast::error_code ec;
  auto address = net::ip::make_address(o.ip, ec);
  if (ec) {
    return make_error(ErrorCode::kInvalidArgument, "bad_ip", "invalid --ip '" + o.ip + "'");
  }
  tcp::endpoint endpoint{address, static_cast<unsigned short>(o.port)};
  auto& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) {
    acceptor.set_option(net::socket_base::reuse_address(true), ec);
    acceptor.bind(endpoint, ec);
  }
  if (!ec) {
    acceptor.listen(net::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    return make_error(ErrorCode::kFailedPrecondition, "listen",
                      "cannot listen on " + o.ip + ":" + std::to_string(o.port) + ": " +
                          ec.message());
  }
  impl_->do_accept();
  return static_cast<int>(acceptor.local_endpoint().port());
}

void Server::run() {
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, impl_->options.threads); ++i) {
    threads.emplace_back([this] { impl_->ioc.run(); });
  }
  impl_->ioc.run();
  for (auto& t : threads) {
    t.join();
  }
}

void Server::stop() { impl_->ioc.stop(); }

int run_serve(ServeOptions options) {
  spdlog::info("host: {}", jail::probe_host().describe());
  if (options.no_jail) {
    spdlog::warn("--no-jail: kernels run UNJAILED, as this user; do not give them untrusted code");
  }
  Server server(std::move(options));
  auto port = server.start();
  if (!port) {
    std::cerr << "cellgate serve: " << port.error().message << "\n";
    return 2;
  }
  net::io_context signals_ctx;
  net::signal_set signals(signals_ctx, SIGINT, SIGTERM);
  signals.async_wait([&](beast::error_code, int sig) {
    spdlog::info("signal {}: shutting down", sig);
    server.stop();
  });
  std::thread signal_thread([&] { signals_ctx.run(); });
  const auto& o = server.manager().options();
  const std::string scheme = o.certfile.empty() ? "http" : "https";
  std::cout << "cellgate serve: listening on " << scheme << "://" << o.ip << ":" << *port
            << o.base_url << "\n";
  if (!server.token().empty()) {
    std::cout << "cellgate serve: token " << server.token() << "\n"
              << "  JupyterLab / jupyter server: jupyter server --gateway-url=" << scheme << "://"
              << o.ip << ":" << *port << " --GatewayClient.auth_token=" << server.token() << "\n";
  }
  std::cout << std::flush;
  server.run();
  signals_ctx.stop();
  signal_thread.join();
  server.manager().shutdown_all();
  return 0;
}

}  // namespace cellgate::server
