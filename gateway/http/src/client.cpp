#include "cellgate/http/client.hpp"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

#include "cellgate/http/limits.hpp"

namespace cellgate::http::client {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

using Request = http::request<http::string_body>;
// Where the answer's body goes, piece by piece, once its status is known.
using BodySink = std::function<void(int status, std::string_view piece)>;

constexpr std::size_t kErrorBodyBytes = std::size_t{1} << 20;  // kept of a stream's error answer
constexpr std::size_t kReadPieceBytes = 16 * 1024;

// When each phase of an exchange must be over; nullopt: no limit.
struct Deadlines {
  std::optional<Clock::time_point> head;   // connect, handshake, write, the answer's headers
  std::optional<Clock::time_point> total;  // everything
  std::chrono::milliseconds idle{0};       // between pieces of the body; 0: no limit

  static Deadlines from(const StreamLimits& limits) {
    const auto now = Clock::now();
    Deadlines d;
    if (limits.head.count() > 0) {
      d.head = now + limits.head;
    }
    if (limits.total.count() > 0) {
      d.total = now + limits.total;
    }
    d.idle = limits.idle;
    return d;
  }
};

std::optional<Clock::time_point> earliest(std::optional<Clock::time_point> a,
                                          std::optional<Clock::time_point> b) {
  if (!a) {
    return b;
  }
  return b ? std::min(*a, *b) : a;
}

// One request and its answer, asynchronously on one io_context, in Beast's do_x/on_x shape:
// connect, (TLS handshake,) write, read the header, then read the body a piece at a time, each
// piece handed to the sink as soon as it is parsed. beast::tcp_stream's expiry bounds each
// phase (it only holds for asynchronous operations: hence async here, run() blocks).
template <class Stream>
class Exchange {
 public:
  Exchange(Stream& stream, const Request& req, Deadlines deadlines,
           std::optional<std::size_t> body_limit, BodySink sink)
      : stream_(stream), req_(req), deadlines_(deadlines), sink_(std::move(sink)) {
    if (body_limit) {
      parser_.body_limit(*body_limit);
    } else {
      parser_.body_limit(boost::none);
    }
  }

  // Returns the answer's status once its body has ended.
  Result<int> run(net::io_context& ioc, const tcp::resolver::results_type& endpoints) {
    expire_at(earliest(deadlines_.head, deadlines_.total));
    do_connect(endpoints);
    ioc.run();
    if (failed_) {
      return make_error(
          failed_ == beast::error::timeout ? ErrorCode::kDeadlineExceeded : ErrorCode::kUnavailable,
          "http", std::string("cannot ") + step_ + ": " + failed_.message());
    }
    return status_;
  }

 private:
  void expire_at(std::optional<Clock::time_point> when) {
    auto& lowest = beast::get_lowest_layer(stream_);
    if (when) {
      lowest.expires_at(*when);
    } else {
      lowest.expires_never();
    }
  }

  void do_connect(const tcp::resolver::results_type& endpoints) {
    step_ = "connect";
    beast::get_lowest_layer(stream_).async_connect(
        endpoints, [this](beast::error_code ec, const tcp::endpoint&) { on_connect(ec); });
  }
  void on_connect(beast::error_code ec) {
    if (ec) {
      failed_ = ec;
      return;
    }
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      do_write();
    } else {
      do_handshake();
    }
  }

  void do_handshake() {
    step_ = "TLS handshake";
    stream_.async_handshake(ssl::stream_base::client,
                            [this](beast::error_code ec) { on_handshake(ec); });
  }
  void on_handshake(beast::error_code ec) {
    if (ec) {
      failed_ = ec;
      return;
    }
    do_write();
  }

  void do_write() {
    step_ = "send the request";
    http::async_write(stream_, req_, [this](beast::error_code ec, std::size_t) { on_write(ec); });
  }
  void on_write(beast::error_code ec) {
    if (ec) {
      failed_ = ec;
      return;
    }
    do_read_header();
  }

  void do_read_header() {
    step_ = "read the answer";
    http::async_read_header(stream_, buffer_, parser_,
                            [this](beast::error_code ec, std::size_t) { on_read_header(ec); });
  }
  void on_read_header(beast::error_code ec) {
    if (ec) {
      failed_ = ec;
      return;
    }
    status_ = static_cast<int>(parser_.get().result_int());
    do_read_body();
  }

  // A read completes as soon as the parser made progress, so a piece is handed over when it
  // arrives, not when the buffer is full.
  void do_read_body() {
    if (parser_.is_done()) {
      return;
    }
    expire_at(deadlines_.idle.count() > 0
                  ? earliest(Clock::now() + deadlines_.idle, deadlines_.total)
                  : deadlines_.total);
    parser_.get().body().data = piece_;
    parser_.get().body().size = sizeof(piece_);
    http::async_read_some(stream_, buffer_, parser_,
                          [this](beast::error_code ec, std::size_t) { on_read_body(ec); });
  }
  void on_read_body(beast::error_code ec) {
    if (ec && ec != http::error::need_buffer) {  // need_buffer: the piece buffer is full
      failed_ = ec;
      return;
    }
    const std::size_t n = sizeof(piece_) - parser_.get().body().size;
    if (n > 0) {
      sink_(status_, std::string_view(piece_, n));
    }
    do_read_body();
  }

  Stream& stream_;
  const Request& req_;
  const Deadlines deadlines_;
  const BodySink sink_;
  beast::flat_buffer buffer_;
  http::response_parser<http::buffer_body> parser_;
  char piece_[kReadPieceBytes];
  int status_ = 0;
  beast::error_code failed_;
  const char* step_ = "connect";
};

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
  auto parsed = parse_json(body, kMaxKernelJsonDepth);
  if (parsed.is_object() && parsed.contains("message") && parsed["message"].is_string()) {
    return parsed["message"].get<std::string>();
  }
  constexpr std::size_t kShown = 300;
  return body.size() > kShown ? body.substr(0, kShown) + "..." : body;
}

namespace {

struct Call {
  std::string_view method;
  const std::string& target;
  std::string body;
  std::string_view content_type;
  std::string_view accept;
  Deadlines deadlines;
  std::optional<std::size_t> body_limit;  // nullopt: none
  BodySink sink;
};

// Builds the request, resolves the host (blocking), and runs the exchange over TCP or TLS.
// Errors name the request: "POST http://127.0.0.1:8888/api/kernels: cannot connect: ...".
Result<int> perform(const Url& url, const std::string& token, const std::string& user_agent,
                    const Client::Headers& headers, Call call) {
  const http::verb verb = http::string_to_verb(call.method);
  if (verb == http::verb::unknown) {
    return make_error(ErrorCode::kInternal, "bad_method", "unknown HTTP method");
  }
  Request req{verb, url.base + call.target, 11};
  req.set(http::field::host, url.host + ":" + url.port);
  req.set(http::field::user_agent, user_agent);
  req.set(http::field::accept, call.accept);
  if (!token.empty()) {
    req.set(http::field::authorization, "token " + token);
  }
  for (const auto& [name, value] : headers) {
    req.set(name, value);
  }
  if (!call.body.empty() || verb == http::verb::post || verb == http::verb::put) {
    req.set(http::field::content_type, call.content_type);
  }
  req.keep_alive(false);
  req.body() = std::move(call.body);
  req.prepare_payload();

  const std::string what = std::string(call.method) + " " + (url.tls ? "https://" : "http://") +
                           url.host + ":" + url.port + url.base + call.target;
  auto annotate = [&](Result<int> r) -> Result<int> {
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
    auto endpoints = resolver.resolve(url.host, url.port);
    if (url.tls) {
      ssl::context ctx(ssl::context::tls_client);
      ctx.set_default_verify_paths();
      ctx.set_verify_mode(ssl::verify_peer);
      beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
      // SNI; OpenSSL's macro casts the old way.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
      const bool sni = SSL_set_tlsext_host_name(stream.native_handle(), url.host.c_str()) == 1;
#pragma GCC diagnostic pop
      if (!sni) {
        throw beast::system_error(static_cast<int>(::ERR_get_error()),
                                  net::error::get_ssl_category());
      }
      stream.set_verify_callback(ssl::host_name_verification(url.host));
      Exchange exchange(stream, req, call.deadlines, call.body_limit, std::move(call.sink));
      return annotate(exchange.run(ioc, endpoints));
    }
    beast::tcp_stream stream(ioc);
    Exchange exchange(stream, req, call.deadlines, call.body_limit, std::move(call.sink));
    return annotate(exchange.run(ioc, endpoints));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kUnavailable, "http", what + ": " + e.what());
  }
}

}  // namespace

Result<Response> Client::request(std::string_view method, const std::string& target,
                                 std::string body, std::chrono::milliseconds timeout,
                                 std::string_view content_type, std::size_t body_limit) const {
  Response res;
  auto collect = [&res](int, std::string_view piece) { res.body.append(piece); };
  CELLGATE_ASSIGN_OR_RETURN(
      res.status, perform(url_, token_, user_agent_, headers_,
                          Call{method, target, std::move(body), content_type, "application/json",
                               Deadlines::from({.head = timeout, .idle = {}, .total = timeout}),
                               body_limit, collect}));
  return res;
}

Result<Response> Client::stream(std::string_view method, const std::string& target,
                                std::string body, std::string_view accept,
                                const std::function<void(std::string_view)>& on_body,
                                StreamLimits limits) const {
  Response res;
  auto route = [&res, &on_body](int status, std::string_view piece) {
    if (status >= 200 && status < 300) {
      on_body(piece);
    } else if (res.body.size() < kErrorBodyBytes) {
      res.body.append(piece.substr(0, kErrorBodyBytes - res.body.size()));
    }
  };
  CELLGATE_ASSIGN_OR_RETURN(
      res.status, perform(url_, token_, user_agent_, headers_,
                          Call{method, target, std::move(body), "application/json", accept,
                               Deadlines::from(limits), std::nullopt, route}));
  return res;
}

}  // namespace cellgate::http::client
