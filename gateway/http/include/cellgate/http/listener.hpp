// A listening socket serving HTTP/1.1 and WebSocket (optionally over TLS) to a Handler: one
// session per connection on its own strand of the given io_context (Beast's server pattern).
//
//   auto tls = http::TlsContext::load(certfile, keyfile);          // optional
//   auto listener = http::Listener::open(ioc, "127.0.0.1", 0, api, options, tls ? &*tls : nullptr);
//   int port = listener.value()->port();
//   listener.value()->start();                                      // accept on ioc's threads
//
// Thread-safety: open/start/stop from one thread; sessions run on ioc's threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cellgate/http/byte_budget.hpp"
#include "cellgate/http/handler.hpp"
#include "cellgate/http/stats.hpp"
#include "cellgate/result.hpp"

namespace boost::asio {
class io_context;
}

namespace cellgate::http {

struct HttpOptions {
  std::size_t max_body_bytes = 16u << 20;
  std::size_t max_control_body_bytes = 64u << 10;  // control routes: see limits.hpp
  std::size_t max_header_bytes = 16u << 10;
  std::size_t max_ws_message_bytes = 64u << 20;  // one inbound WebSocket message
  std::size_t max_ws_queue_bytes = 256u << 20;   // unsent outbound bytes before a client is dropped
  double ws_ping_interval = 30;                  // seconds; 0: off
  // Shared by every WebSocket connection: bytes of unfinished inbound messages plus unsent
  // outbound ones, across all clients; over it the connections holding the most are dropped.
  // Null: no global cap (the per-connection limits above still hold).
  std::shared_ptr<ByteBudget> ws_budget;
  // Open client connections; past it new ones get a 503 and are closed. 0: derived from the
  // open-file limit (3/4 of it, at most 4096).
  std::size_t max_connections = 0;
  // A request head must arrive within this while the connection has not yet had a request
  // answered with anything but 401/403 (an unauthenticated idle socket is let go early).
  int header_timeout_seconds = 10;
  // Counts of what was accepted and turned away, for /metrics; null: not counted.
  std::shared_ptr<HttpStats> stats;
  // Set on every response, WebSocket handshakes included (X-Cellgate-Node: which node answered).
  std::vector<std::pair<std::string, std::string>> response_headers;
};

// A server certificate chain and key (PEM), TLS 1.2 and later.
class TlsContext {
 public:
  // Error "tls" (kInvalidArgument) when either is missing or cannot be loaded. A client_ca
  // (PEM) makes every client present a certificate it signed (mutual TLS): a handshake without
  // one fails.
  static Result<std::shared_ptr<TlsContext>> load(const std::string& certfile,
                                                  const std::string& keyfile,
                                                  const std::string& client_ca = "");
  ~TlsContext();
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit TlsContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Listener {
 public:
  // Binds ip:port (port 0: any free one). Errors: bad_ip (kInvalidArgument), listen
  // (kFailedPrecondition). `handler`, `options` and `tls` must outlive the listener.
  static Result<std::unique_ptr<Listener>> open(boost::asio::io_context& ioc, const std::string& ip,
                                                int port, Handler& handler,
                                                const HttpOptions& options,
                                                std::shared_ptr<TlsContext> tls = nullptr);
  // The same over a socket already bound and listening (systemd's socket activation); the
  // listener owns `fd` from here on. Error "listen" (kInvalidArgument) when it is no socket.
  static Result<std::unique_ptr<Listener>> adopt(boost::asio::io_context& ioc, int fd,
                                                 Handler& handler, const HttpOptions& options,
                                                 std::shared_ptr<TlsContext> tls = nullptr);
  ~Listener();
  int port() const;
  std::size_t open_connections() const;
  void start();
  void stop();

  struct Impl;

 private:
  explicit Listener(std::unique_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// Raises this process's RLIMIT_NOFILE soft limit to its hard limit (each connection is a
// descriptor); returns the soft limit now in force.
std::size_t raise_open_file_limit();

// Whether `ip` is a loopback address (127.0.0.0/8, ::1).
bool is_loopback(const std::string& ip);

}  // namespace cellgate::http
