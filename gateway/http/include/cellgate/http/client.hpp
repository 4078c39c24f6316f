// The HTTP client of the CLI's remote modes (`cellgate exec --url`, `cellgate run --url`): a small
// blocking HTTP/1.1 client, one request per connection. request() returns the status and the whole
// body; stream() hands a successful answer's body over in pieces as they arrive (NDJSON or
// Server-Sent Events, chunked or not). TLS for https:// (peer and host name verified against the
// system's CAs).
//
//   CELLGATE_ASSIGN_OR_RETURN(auto url, http::client::parse_url("http://127.0.0.1:8888/base"));
//   http::client::Client client(url, token, "cellgate-run");
//   auto res = client.request("POST", "/api/kernels", R"({"name":"python3"})", 60s);
//   if (res && res->status == 201) { ... json::parse(res->body) ... }
//
//   auto streamed = client.stream("POST", "/api/execute", body, "application/x-ndjson",
//                                 [&](std::string_view piece) { lines.feed(piece); },
//                                 {.head = 30s, .total = 1h});
//
// Transport failures (cannot resolve, connect, read in time) are errors; any HTTP status is a
// Response for the caller to judge (error_message() reads the gateway's {"message"} body). Only
// this file's implementation includes Beast and Asio.
//
// Thread-safety: a Client is immutable; request() and stream() may run from many threads at once
// (each call has its own io_context and connection). stream()'s callback runs on the calling
// thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::http::client {

struct Url {
  bool tls = false;
  std::string host, port, base;  // base: "" or "/prefix", no trailing slash
};

// http[s]://host[:port][/base]; IPv6 hosts in brackets.
Result<Url> parse_url(std::string_view text);

// Percent-encodes each segment of a relative path; the slashes between segments stay.
std::string encode_path(std::string_view path);

struct Response {
  int status = 0;
  std::string body;
  // The gateway's error message ({"message": ...}), else the body, shortened.
  std::string error_message() const;
};

// How long a streamed exchange may take; zero is no limit.
struct StreamLimits {
  // Resolving, connecting, the TLS handshake, sending the request and reading the answer's
  // headers.
  std::chrono::milliseconds head{std::chrono::seconds(30)};
  // The longest wait for the next piece of the body (a gateway sends keepalive events).
  std::chrono::milliseconds idle{0};
  // The whole exchange, the head included.
  std::chrono::milliseconds total{0};
};

class Client {
 public:
  using Headers = std::vector<std::pair<std::string, std::string>>;
  // `headers`: more request headers, sent as given (a webhook's signature).
  Client(Url url, std::string token, std::string user_agent, Headers headers = {})
      : url_(std::move(url)),
        token_(std::move(token)),
        user_agent_(std::move(user_agent)),
        headers_(std::move(headers)) {}

  // `target` is below the base URL ("/api/kernels"). A body is sent as application/json
  // unless content_type says otherwise. The whole exchange must finish within `timeout`; a body
  // over `body_limit` bytes is an error.
  Result<Response> request(std::string_view method, const std::string& target, std::string body,
                           std::chrono::milliseconds timeout,
                           std::string_view content_type = "application/json",
                           std::size_t body_limit = std::size_t{1} << 30) const;

  // Sends a JSON body with `Accept: accept`. A 2xx answer's body goes to `on_body` piece by
  // piece as the bytes arrive (the Response's body stays empty); any other answer's body is
  // collected into the Response, as request() does (up to 1 MiB). The status is in the Response
  // either way. A body that ends before its declared length (or last chunk) is an error.
  Result<Response> stream(std::string_view method, const std::string& target, std::string body,
                          std::string_view accept,
                          const std::function<void(std::string_view)>& on_body,
                          StreamLimits limits) const;

  const Url& url() const { return url_; }

 private:
  Url url_;
  std::string token_;
  std::string user_agent_;
  Headers headers_;
};

}  // namespace cellgate::http::client
