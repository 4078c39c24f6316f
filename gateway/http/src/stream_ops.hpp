// Internal: what the session templates (ws_session.hpp, sessions.hpp) need of a stream, written
// once for the three they run over: tcp_stream, ssl_stream<tcp_stream> and Beast's in-memory
// test::stream (tests/unit, tests/fuzz), which has no socket and no deadline.
//
//   set_deadline(stream_, std::chrono::seconds(60));  // a no-op on test::stream
//
// Thread-safety: as the stream's own (each session calls these on its strand).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <chrono>
#include <string>

namespace cellgate::http::detail {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

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
void close_stream(Stream& stream) {
  beast::error_code ec;
  if constexpr (requires { beast::get_lowest_layer(stream).socket().close(ec); }) {
    beast::get_lowest_layer(stream).socket().close(ec);
  } else if constexpr (requires { beast::get_lowest_layer(stream).close(); }) {
    beast::get_lowest_layer(stream).close();
  }
}
template <class Stream>
std::string peer_address(Stream& stream) {
  if constexpr (requires { beast::get_lowest_layer(stream).socket().remote_endpoint(); }) {
    beast::error_code ec;
    auto ep = beast::get_lowest_layer(stream).socket().remote_endpoint(ec);
    if (!ec) {
      return ep.address().to_string() + ":" + std::to_string(ep.port());
    }
  }
  return "";
}
template <class Stream>
constexpr bool kIsTls =
    requires(Stream& s) { s.async_handshake(ssl::stream_base::server, [](beast::error_code) {}); };

}  // namespace cellgate::http::detail
