#include "cellgate/http/listener.hpp"

#include <boost/asio/io_context.hpp>

#include "sessions.hpp"

namespace cellgate::http {

using detail::HttpSession;
namespace net = detail::net;
namespace beast = detail::beast;
namespace ssl = detail::ssl;
using tcp = detail::tcp;

struct TlsContext::Impl {
  ssl::context context{ssl::context::tls_server};
};

TlsContext::TlsContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TlsContext::~TlsContext() = default;

Result<std::shared_ptr<TlsContext>> TlsContext::load(const std::string& certfile,
                                                     const std::string& keyfile) {
  if (certfile.empty() || keyfile.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "tls", "TLS needs both --certfile and --keyfile");
  }
  auto impl = std::make_unique<Impl>();
  try {
    impl->context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                              ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                              ssl::context::no_tlsv1_1);
    impl->context.use_certificate_chain_file(certfile);
    impl->context.use_private_key_file(keyfile, ssl::context::pem);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, "tls",
                      std::string("cannot load the TLS certificate or key: ") + e.what());
  }
  return std::shared_ptr<TlsContext>(new TlsContext(std::move(impl)));
}

struct Listener::Impl {
  net::io_context& ioc;
  Handler& handler;
  const HttpOptions& options;
  std::shared_ptr<TlsContext> tls;
  tcp::acceptor acceptor;
  int port = 0;

  Impl(net::io_context& c, Handler& h, const HttpOptions& o, std::shared_ptr<TlsContext> t)
      : ioc(c), handler(h), options(o), tls(std::move(t)), acceptor(net::make_strand(c)) {}

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
            handler, options, std::move(socket), tls->impl().context)
            ->run();
      } else {
        std::make_shared<HttpSession<beast::tcp_stream>>(handler, options, std::move(socket))
            ->run();
      }
      do_accept();
    });
  }
};

Listener::Listener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Listener::~Listener() {
  // The io_context has stopped (or the acceptor is idle): close it here, directly.
  beast::error_code ec;
  impl_->acceptor.close(ec);
}

Result<std::unique_ptr<Listener>> Listener::open(net::io_context& ioc, const std::string& ip,
                                                 int port, Handler& handler,
                                                 const HttpOptions& options,
                                                 std::shared_ptr<TlsContext> tls) {
  beast::error_code ec;
  auto address = net::ip::make_address(ip, ec);
  if (ec) {
    return make_error(ErrorCode::kInvalidArgument, "bad_ip", "invalid --ip '" + ip + "'");
  }
  auto impl = std::make_unique<Impl>(ioc, handler, options, std::move(tls));
  tcp::endpoint endpoint{address, static_cast<unsigned short>(port)};
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) {
    impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
    impl->acceptor.bind(endpoint, ec);
  }
  if (!ec) {
    impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    return make_error(ErrorCode::kFailedPrecondition, "listen",
                      "cannot listen on " + ip + ":" + std::to_string(port) + ": " + ec.message());
  }
  impl->port = static_cast<int>(impl->acceptor.local_endpoint().port());
  return std::unique_ptr<Listener>(new Listener(std::move(impl)));
}

int Listener::port() const { return impl_->port; }

void Listener::start() { impl_->do_accept(); }

void Listener::stop() {
  net::post(impl_->acceptor.get_executor(), [impl = impl_] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
}

bool is_loopback(const std::string& ip) {
  beast::error_code ec;
  auto address = net::ip::make_address(ip, ec);
  return !ec && address.is_loopback();
}

}  // namespace cellgate::http
