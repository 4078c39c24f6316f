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
#include "cellgate/server/e2b_api.hpp"
#include "cellgate/server/kernel_manager.hpp"
#include "cellgate/server/ws_frames.hpp"
#include "sessions.hpp"

namespace cellgate::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using detail::HttpSession;

bool address_is_loopback(const std::string& ip) {
  beast::error_code ec;
  auto address = net::ip::make_address(ip, ec);
  return !ec && address.is_loopback();
}

}  // namespace

// ---- Server ----------------------------------------------------------------------------------

struct Server::Impl {
  ServeOptions options;
  std::string token;
  net::io_context ioc;
  std::optional<ssl::context> tls;
  std::unique_ptr<KernelManager> manager;
  std::unique_ptr<Api> api;
  std::unique_ptr<E2bApi> e2b;
  tcp::acceptor acceptor{net::make_strand(ioc)};
  tcp::acceptor e2b_acceptor{net::make_strand(ioc)};
  int e2b_port = 0;

  void do_accept(tcp::acceptor& from, Handler& handler) {
    from.async_accept(net::make_strand(ioc), [this, &from, &handler](beast::error_code ec,
                                                                      tcp::socket socket) {
      if (ec) {
        if (ec != net::error::operation_aborted) {
          do_accept(from, handler);
        }
        return;
      }
      socket.set_option(tcp::no_delay(true), ec);
      if (tls) {
        std::make_shared<HttpSession<beast::ssl_stream<beast::tcp_stream>>>(
            handler, options, std::move(socket), *tls)
            ->run();
      } else {
        std::make_shared<HttpSession<beast::tcp_stream>>(handler, options, std::move(socket))
            ->run();
      }
      do_accept(from, handler);
    });
  }

  Result<int> listen(tcp::acceptor& into, const std::string& ip, int port) {
    beast::error_code ec;
    auto address = net::ip::make_address(ip, ec);
    if (ec) {
      return make_error(ErrorCode::kInvalidArgument, "bad_ip", "invalid --ip '" + ip + "'");
    }
    tcp::endpoint endpoint{address, static_cast<unsigned short>(port)};
    into.open(endpoint.protocol(), ec);
    if (!ec) {
      into.set_option(net::socket_base::reuse_address(true), ec);
      into.bind(endpoint, ec);
    }
    if (!ec) {
      into.listen(net::socket_base::max_listen_connections, ec);
    }
    if (ec) {
      return make_error(ErrorCode::kFailedPrecondition, "listen",
                        "cannot listen on " + ip + ":" + std::to_string(port) + ": " +
                            ec.message());
    }
    return static_cast<int>(into.local_endpoint().port());
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
  impl_->e2b = std::make_unique<E2bApi>(
      *impl_->manager, impl_->api->executor(), impl_->manager->options(), impl_->token,
      impl_->options.e2b_no_token);
}

Server::~Server() {
  stop();
  impl_->e2b.reset();
  impl_->api.reset();
  impl_->manager.reset();
}

const std::string& Server::token() const { return impl_->token; }
KernelManager& Server::manager() { return *impl_->manager; }
int Server::e2b_port() const { return impl_->e2b_port; }

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
  CELLGATE_ASSIGN_OR_RETURN(const int port, impl_->listen(impl_->acceptor, o.ip, o.port));
  impl_->do_accept(impl_->acceptor, *impl_->api);
  if (o.e2b_port != 0) {
    if (o.e2b_no_token && !address_is_loopback(o.ip)) {
      return make_error(ErrorCode::kInvalidArgument, "e2b_no_token",
                        "--e2b-no-token serves code execution without a token, so it is only "
                        "allowed on a loopback --ip (127.0.0.1 or ::1), not " + o.ip);
    }
    CELLGATE_ASSIGN_OR_RETURN(const int e2b_port,
                              impl_->listen(impl_->e2b_acceptor, o.ip, o.e2b_port));
    impl_->e2b_port = e2b_port;
    impl_->do_accept(impl_->e2b_acceptor, *impl_->e2b);
  }
  return port;
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
  std::optional<Server> server_holder;
  try {
    server_holder.emplace(std::move(options));
  } catch (const std::invalid_argument& e) {
    std::cerr << "cellgate serve: " << e.what() << "\n";
    return 2;
  }
  Server& server = *server_holder;
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
  if (server.e2b_port() != 0) {
    std::cout << "cellgate serve: E2B-compatible endpoints on http://" << o.ip << ":"
              << server.e2b_port() << "\n";
  }
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
