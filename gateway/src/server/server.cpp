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
#include "sessions.hpp"

namespace cellgate::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using detail::HttpSession;

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
