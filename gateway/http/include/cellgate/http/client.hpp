// A small blocking HTTP/1.1 client for the CLI's remote modes: one request per connection,
// JSON or bytes in, the status and whole body out. TLS for https:// (peer and host name
// verified against the system's CAs).
//
//   CELLGATE_ASSIGN_OR_RETURN(auto url, http_client::parse_url("http://127.0.0.1:8888/base"));
//   http_client::Client client(url, token, "cellgate-run");
//   auto res = client.request("POST", "/api/kernels", R"({"name":"python3"})", 60s);
//   if (res && res->status == 201) { ... json::parse(res->body) ... }
//
// Transport failures (cannot resolve, connect, read in time) are errors; any HTTP status is a
// Response for the caller to judge (error_message() reads the gateway's {"message"} body).
//
// Thread-safety: a Client is immutable; request() may run from many threads at once (each call
// has its own io_context and connection).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

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

class Client {
 public:
  Client(Url url, std::string token, std::string user_agent)
      : url_(std::move(url)), token_(std::move(token)), user_agent_(std::move(user_agent)) {}

  // `target` is below the base URL ("/api/kernels"). A body is sent as application/json
  // unless content_type says otherwise. The whole exchange must finish within `timeout`.
  Result<Response> request(std::string_view method, const std::string& target, std::string body,
                           std::chrono::milliseconds timeout,
                           std::string_view content_type = "application/json",
                           std::size_t body_limit = std::size_t{1} << 30) const;

  const Url& url() const { return url_; }

 private:
  Url url_;
  std::string token_;
  std::string user_agent_;
};

}  // namespace cellgate::http::client
