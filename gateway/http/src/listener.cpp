#include "cellgate/http/listener.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/error.hpp>
#include <memory>
#include <string>

#include "cellgate/util/descriptors.hpp"
#include "session_start.hpp"

namespace cellgate::http {

using detail::start_plain_session;
using detail::start_tls_session;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

struct TlsContext::Impl {
  ssl::context context{ssl::context::tls_server};
};

TlsContext::TlsContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TlsContext::~TlsContext() = default;

Result<std::shared_ptr<TlsContext>> TlsContext::load(const std::string& certfile,
                                                     const std::string& keyfile,
                                                     const std::string& client_ca) {
  if (certfile.empty() || keyfile.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "tls",
                      client_ca.empty() ? "TLS needs both --certfile and --keyfile"
                                        : "--client-ca needs TLS: --certfile and --keyfile");
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
  if (!client_ca.empty()) {
    try {
      impl->context.load_verify_file(client_ca);
      impl->context.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    } catch (const std::exception& e) {
      return make_error(ErrorCode::kInvalidArgument, "tls",
                        "cannot load --client-ca " + client_ca + ": " + e.what());
    }
  }
  return std::shared_ptr<TlsContext>(new TlsContext(std::move(impl)));
}

struct Listener::Impl {
  net::io_context& ioc;
  Handler& handler;
  const HttpOptions& options;
  std::shared_ptr<TlsContext> tls;
  tcp::acceptor acceptor;
  net::steady_timer backoff;
  int port = 0;
  std::size_t max_connections;
  // Open connections; shared with the slots the sessions hold, which may outlive the listener.
  std::shared_ptr<std::atomic<std::size_t>> open_connections =
      std::make_shared<std::atomic<std::size_t>>(0);
  // A descriptor kept for the moment the process runs out: closed, it lets one pending
  // connection be accepted and shut, so the backlog drains instead of the accept loop spinning.
  int reserve_fd = -1;
  std::size_t refused = 0;  // connections refused since the last log line about it
  std::chrono::steady_clock::time_point last_refusal_log{};

  Impl(net::io_context& c, Handler& h, const HttpOptions& o, std::shared_ptr<TlsContext> t)
      : ioc(c),
        handler(h),
        options(o),
        tls(std::move(t)),
        acceptor(net::make_strand(c)),
        backoff(acceptor.get_executor()),
        max_connections(o.max_connections > 0 ? o.max_connections : default_max_connections()) {
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  ~Impl() {
    if (reserve_fd >= 0) {
      ::close(reserve_fd);
    }
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  static std::size_t default_max_connections() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
      return 4096;
    }
    // A quarter of the descriptors stay for kernels (sockets, pipes), files and the log.
    return std::clamp<std::size_t>(static_cast<std::size_t>(limit.rlim_cur) / 4 * 3, 16, 4096);
  }

  // Logged at most every 10 s, with the count since: a flood must not become a flood of logs.
  void note_refusal(const char* why) {
    if (options.stats) {
      options.stats->rejected.add(why);
    }
    ++refused;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_refusal_log >= std::chrono::seconds(10)) {
      spdlog::warn("refused {} connection(s) in the last 10 s: {}", refused,
                   std::string_view(why) == "max_connections" ? "over --max-connections"
                                                              : "out of file descriptors");
      refused = 0;
      last_refusal_log = now;
    }
  }

  // Out of descriptors: shed one pending connection through the reserve, then wait a moment
  // (the accept would fail again at once while the process stays at its limit).
  void on_no_descriptors() {
    if (reserve_fd < 0) {
      // Lost the last time: another thread took the freed number before we could reopen it.
      reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (reserve_fd >= 0) {
      ::close(reserve_fd);
      reserve_fd = -1;
      const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        ::close(fd);
      }
      reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    note_refusal("out_of_descriptors");
  }

  void accept_later(std::chrono::milliseconds delay) {
    backoff.expires_after(delay);
    backoff.async_wait([this](beast::error_code ec) {
      if (!ec && acceptor.is_open()) {
        do_accept();
      }
    });
  }

  // Over --max-connections: a fixed 503, written without waiting; then the client's request is
  // read and dropped until it closes (at most 2 s, 64 KiB). Closing a socket with unread input
  // sends a reset, and a reset can discard the 503 before the client reads it.
  struct Refused : std::enable_shared_from_this<Refused> {
    tcp::socket socket;
    net::steady_timer deadline;
    std::array<char, 4096> sink{};
    std::size_t drained = 0;
    explicit Refused(tcp::socket s) : socket(std::move(s)), deadline(socket.get_executor()) {}
    void drain() {
      socket.async_read_some(net::buffer(sink),
                             [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                               self->drained += n;
                               if (ec || self->drained > (64u << 10)) {
                                 self->deadline.cancel();
                                 beast::error_code ignored;
                                 self->socket.close(ignored);
                                 return;
                               }
                               self->drain();
                             });
    }
  };

  void refuse(tcp::socket socket, std::string_view body, const char* why) {
    const std::string busy =
        "HTTP/1.1 503 Service Unavailable\r\nServer: cellgate\r\nConnection: close\r\n"
        "Content-Type: text/plain\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
    beast::error_code ec;
    socket.non_blocking(true, ec);
    socket.send(net::buffer(busy), 0, ec);
    socket.shutdown(tcp::socket::shutdown_send, ec);
    auto refused_conn = std::make_shared<Refused>(std::move(socket));
    refused_conn->deadline.expires_after(std::chrono::seconds(2));
    refused_conn->deadline.async_wait([refused_conn](beast::error_code wait_ec) {
      if (!wait_ec) {
        beast::error_code ignored;
        refused_conn->socket.close(ignored);
      }
    });
    refused_conn->drain();
    note_refusal(why);
  }

  void do_accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == net::error::operation_aborted || !acceptor.is_open()) {
          return;
        }
        if (ec == net::error::no_descriptors || ec == beast::errc::too_many_files_open_in_system) {
          on_no_descriptors();
          return accept_later(std::chrono::milliseconds(50));
        }
        return accept_later(std::chrono::milliseconds(5));
      }
      if (open_connections->load() >= max_connections) {
        refuse(std::move(socket), "too many open connections", "max_connections");
        return do_accept();
      }
      // The last descriptors are kept for kernels and files: a connection that would take them
      // is refused like one over --max-connections (a limit lowered under a running gateway,
      // or a --max-connections set above what the descriptor limit allows).
      if (near_descriptor_limit(socket.native_handle())) {
        refuse(std::move(socket), "out of file descriptors", "out_of_descriptors");
        return do_accept();
      }
      socket.set_option(tcp::no_delay(true), ec);
      if (options.stats) {
        options.stats->accepted.add();
      }
      open_connections->fetch_add(1);
      std::shared_ptr<void> slot(open_connections.get(),
                                 [count = open_connections](void*) { count->fetch_sub(1); });
      if (tls) {
        start_tls_session(handler, options, std::move(socket), tls->impl().context,
                          std::move(slot));
      } else {
        start_plain_session(handler, options, std::move(socket), std::move(slot));
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

Result<std::unique_ptr<Listener>> Listener::adopt(net::io_context& ioc, int fd, Handler& handler,
                                                  const HttpOptions& options,
                                                  std::shared_ptr<TlsContext> tls) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return errno_error(ErrorCode::kInvalidArgument, "listen", "getsockname(passed socket)", errno);
  }
  const tcp protocol = address.ss_family == AF_INET6 ? tcp::v6() : tcp::v4();
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // kernels and launchers must not inherit it
  auto impl = std::make_unique<Impl>(ioc, handler, options, std::move(tls));
  beast::error_code ec;
  impl->acceptor.assign(protocol, fd, ec);
  if (ec) {
    return make_error(ErrorCode::kInvalidArgument, "listen",
                      "cannot use the passed socket: " + ec.message());
  }
  impl->port = static_cast<int>(impl->acceptor.local_endpoint(ec).port());
  return std::unique_ptr<Listener>(new Listener(std::move(impl)));
}

int Listener::port() const {
  return impl_->port;
}

void Listener::start() {
  impl_->do_accept();
}

std::size_t Listener::open_connections() const {
  return impl_->open_connections->load();
}

void Listener::stop() {
  net::post(impl_->acceptor.get_executor(), [impl = impl_] {
    beast::error_code ec;
    impl->backoff.cancel();
    impl->acceptor.close(ec);
  });
}

std::size_t raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return 0;
  }
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      spdlog::info("raised the open-file limit from {} to {}", before, limit.rlim_cur);
    } else {
      limit.rlim_cur = before;
    }
  }
  return limit.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<std::size_t>(limit.rlim_cur);
}

bool is_loopback(const std::string& ip) {
  beast::error_code ec;
  auto address = net::ip::make_address(ip, ec);
  return !ec && address.is_loopback();
}

}  // namespace cellgate::http
