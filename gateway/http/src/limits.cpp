#include "cellgate/http/limits.hpp"

#include <array>
#include <string>
#include <vector>

#include "cellgate/http/listener.hpp"
#include "cellgate/http/router.hpp"

namespace cellgate::http {

namespace {

// Whether the path's last segments are `tail` ("*" matches any one segment).
bool ends_with(const std::vector<std::string>& segments, std::initializer_list<std::string_view> tail) {
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
          return bad_request("the JSON nests deeper than " +
                             std::to_string(max_depth) + " levels");
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

}  // namespace cellgate::http
