#include "cellgate/http/client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>
#include <type_traits>

namespace cellgate::http::client {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

using Request = http::request<http::string_body>;

// Connects, (TLS handshakes,) writes the request and reads the answer, all asynchronously on
// `ioc`: beast::tcp_stream's expiry only holds for asynchronous operations, and it is what
// bounds a read that never ends. Runs `ioc` until the exchange is done.
template <class Stream>
Result<Response> exchange(net::io_context& ioc, Stream& stream,
                          const tcp::resolver::results_type& endpoints, const Request& req,
                          std::size_t body_limit) {
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(body_limit);
  beast::error_code failed;
  const char* step = "connect";
  auto on_read = [&](beast::error_code ec, std::size_t) { failed = ec; };
  auto on_write = [&](beast::error_code ec, std::size_t) {
    if (ec) {
      failed = ec;
      return;
    }
    step = "read the answer";
    http::async_read(stream, buffer, parser, on_read);
  };
  auto send = [&] {
    step = "send the request";
    http::async_write(stream, req, on_write);
  };
  beast::get_lowest_layer(stream).async_connect(
      endpoints, [&](beast::error_code ec, const tcp::endpoint&) {
        if (ec) {
          failed = ec;
          return;
        }
        if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
          send();
        } else {
          step = "TLS handshake";
          stream.async_handshake(ssl::stream_base::client, [&](beast::error_code hec) {
            if (hec) {
              failed = hec;
              return;
            }
            send();
          });
        }
      });
  ioc.run();
  if (failed) {
    return make_error(
        failed == beast::error::timeout ? ErrorCode::kDeadlineExceeded : ErrorCode::kUnavailable,
        "http", std::string("cannot ") + step + ": " + failed.message());
  }
  Response res;
  res.status = static_cast<int>(parser.get().result_int());
  res.body = std::move(parser.get().body());
  return res;
}

}  // namespace

Result<Url> parse_url(std::string_view text) {
  Url u;
  if (text.rfind("http://", 0) == 0) {
    text.remove_prefix(7);
  } else if (text.rfind("https://", 0) == 0) {
    text.remove_prefix(8);
    u.tls = true;
  } else {
    return make_error(ErrorCode::kInvalidArgument, "bad_url",
                      "--url must start with http:// or https://");
  }
  auto slash = text.find('/');
  std::string_view netloc = text.substr(0, slash);
  u.base = slash == std::string_view::npos ? "" : std::string(text.substr(slash));
  while (!u.base.empty() && u.base.back() == '/') {
    u.base.pop_back();
  }
  if (!netloc.empty() && netloc.front() == '[') {  // [::1]:8888
    auto close = netloc.find(']');
    if (close == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument, "bad_url", "unclosed [ in --url");
    }
    u.host = std::string(netloc.substr(1, close - 1));
    netloc.remove_prefix(close + 1);
    u.port = netloc.rfind(':', 0) == 0 ? std::string(netloc.substr(1)) : "";
  } else {
    auto colon = netloc.rfind(':');
    u.host = std::string(netloc.substr(0, colon));
    u.port = colon == std::string_view::npos ? "" : std::string(netloc.substr(colon + 1));
  }
  if (u.port.empty()) {
    u.port = u.tls ? "443" : "80";
  }
  if (u.host.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "bad_url", "--url has no host");
  }
  return u;
}

std::string encode_path(std::string_view path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.' || c == '~' || c == '/';
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    }
  }
  return out;
}

std::string Response::error_message() const {
  auto parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_object() && parsed.contains("message") && parsed["message"].is_string()) {
    return parsed["message"].get<std::string>();
  }
  constexpr std::size_t kShown = 300;
  return body.size() > kShown ? body.substr(0, kShown) + "..." : body;
}

Result<Response> Client::request(std::string_view method, const std::string& target,
                                 std::string body, std::chrono::milliseconds timeout,
                                 std::string_view content_type, std::size_t body_limit) const {
  const http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) {
    return make_error(ErrorCode::kInternal, "bad_method", "unknown HTTP method");
  }
  http::request<http::string_body> req{verb, url_.base + target, 11};
  req.set(http::field::host, url_.host + ":" + url_.port);
  req.set(http::field::user_agent, user_agent_);
  req.set(http::field::accept, "application/json");
  if (!token_.empty()) {
    req.set(http::field::authorization, "token " + token_);
  }
  if (!body.empty() || verb == http::verb::post || verb == http::verb::put) {
    req.set(http::field::content_type, content_type);
  }
  req.keep_alive(false);
  req.body() = std::move(body);
  req.prepare_payload();

  const std::string what = std::string(method) + " " + (url_.tls ? "https://" : "http://") +
                           url_.host + ":" + url_.port + url_.base + target;
  auto annotate = [&](Result<Response> r) -> Result<Response> {
    if (!r) {
      Error e = std::move(r).error();
      e.message = what + ": " + e.message;
      return e;
    }
    return r;
  };
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    auto endpoints = resolver.resolve(url_.host, url_.port);
    if (url_.tls) {
      ssl::context ctx(ssl::context::tls_client);
      ctx.set_default_verify_paths();
      ctx.set_verify_mode(ssl::verify_peer);
      beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
      // SNI; OpenSSL's macro casts the old way.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
      const bool sni = SSL_set_tlsext_host_name(stream.native_handle(), url_.host.c_str()) == 1;
#pragma GCC diagnostic pop
      if (!sni) {
        throw beast::system_error(static_cast<int>(::ERR_get_error()),
                                  net::error::get_ssl_category());
      }
      stream.set_verify_callback(ssl::host_name_verification(url_.host));
      beast::get_lowest_layer(stream).expires_after(timeout);
      return annotate(exchange(ioc, stream, endpoints, req, body_limit));
    }
    beast::tcp_stream stream(ioc);
    stream.expires_after(timeout);
    return annotate(exchange(ioc, stream, endpoints, req, body_limit));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kUnavailable, "http", what + ": " + e.what());
  }
}

}  // namespace cellgate::http::client
