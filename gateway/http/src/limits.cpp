#include "cellgate/http/limits.hpp"

#include <array>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <string>
#include <vector>

#include "cellgate/http/listener.hpp"
#include "cellgate/http/router.hpp"

namespace cellgate::http {

namespace {

// Whether the path's last segments are `tail` ("*" matches any one segment).
bool ends_with(const std::vector<std::string>& segments,
               std::initializer_list<std::string_view> tail) {
  if (segments.size() < tail.size()) {
    return false;
  }
  std::size_t i = segments.size() - tail.size();
  for (std::string_view want : tail) {
    if (want != "*" && segments[i] != want) {
      return false;
    }
    ++i;
  }
  return true;
}

bool is_control_route(std::string_view path) {
  const auto s = split_path(path);
  return ends_with(s, {"api", "kernels"}) || ends_with(s, {"api", "kernels", "*", "interrupt"}) ||
         ends_with(s, {"api", "kernels", "*", "restart"}) || ends_with(s, {"api", "sessions"}) ||
         ends_with(s, {"api", "sessions", "*"}) || ends_with(s, {"contexts"}) ||
         ends_with(s, {"contexts", "*"}) || ends_with(s, {"contexts", "*", "restart"});
}

}  // namespace

std::size_t body_limit_for(const HttpOptions& options, Verb /*method*/, std::string_view target) {
  const auto query = target.find('?');
  const std::string_view path = target.substr(0, query);
  // A file upload may be named ".../files/api/kernels": only the segments after /files/ are
  // the file's, and such a route is not a control route.
  if (path.find("/files/") == std::string_view::npos && is_control_route(path)) {
    return std::min(options.max_control_body_bytes, options.max_body_bytes);
  }
  return options.max_body_bytes;
}

Result<void> check_json_depth(std::string_view text, std::size_t max_depth) {
  std::size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          return bad_request("the JSON nests deeper than " + std::to_string(max_depth) + " levels");
        }
        break;
      case ']':
      case '}':
        if (depth > 0) {
          --depth;
        }
        break;
      default:
        break;
    }
  }
  return {};
}

nlohmann::json parse_json(std::string_view text, std::size_t max_depth) {
  if (!check_json_depth(text, max_depth)) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

Result<void> check_head_start(std::string_view head, std::size_t header_limit) {
  namespace bhttp = boost::beast::http;
  // A TLS record starts with its content type, 22 for a handshake (RFC 8446 5.1): a client
  // speaking https:// to this port. Said plainly, since Beast would only call it a bad method.
  if (!head.empty() && head.front() == '\x16') {
    return bad_request("this port speaks plain HTTP, not TLS: use http://, not https://");
  }
  // RFC 9113 3.4: a client that assumes HTTP/2 opens with this line (Beast: "bad version").
  constexpr std::string_view kHttp2Preface = "PRI * HTTP/2.0\r\n";
  if (head.substr(0, kHttp2Preface.size()) == kHttp2Preface.substr(0, head.size())) {
    if (head.size() >= kHttp2Preface.size()) {
      return bad_request("this port speaks HTTP/1.1 only, not HTTP/2");
    }
    return {};  // still a prefix of the preface; the next bytes tell
  }
  if (head.find('\0') != std::string_view::npos) {
    return bad_request("malformed request: a NUL byte in the request head");
  }
  for (std::size_t lf = head.find('\n'); lf != std::string_view::npos;
       lf = head.find('\n', lf + 1)) {
    if (lf == 0 || head[lf - 1] != '\r') {
      return bad_request("malformed request: a line ends in a bare LF, not CRLF");
    }
  }
  // Beast's parser refuses most garbage within its first bytes (the method must be a token
  // followed by a space), but only while it parses: in a read it waits for the whole head once
  // a first piece was short. A fresh parser over what arrived so far says it now.
  bhttp::request_parser<bhttp::empty_body> probe;
  probe.header_limit(static_cast<std::uint32_t>(header_limit));
  boost::beast::error_code ec;
  probe.put(boost::asio::buffer(head.data(), head.size()), ec);
  if (ec && ec != bhttp::error::need_more && ec != bhttp::error::header_limit) {
    return bad_request("malformed request: " + ec.message());
  }
  return {};
}

}  // namespace cellgate::http
