#include "cellgate/http/router.hpp"

#include "cellgate/util/text.hpp"

namespace cellgate::http {
namespace {

bool is_param(const std::string& segment) {
  return segment.size() >= 2 && segment.front() == '{' && segment.back() == '}';
}

bool is_rest(const std::string& segment) {
  return is_param(segment) && segment[segment.size() - 2] == '*';
}

std::string param_name(const std::string& segment) {
  return segment.substr(1, segment.size() - (is_rest(segment) ? 3 : 2));
}

// The pattern's segments as written (no decoding).
std::vector<std::string> pattern_segments(std::string_view pattern) {
  std::vector<std::string> out;
  while (!pattern.empty()) {
    auto slash = pattern.find('/');
    auto part = pattern.substr(0, slash);
    if (!part.empty()) {
      out.emplace_back(part);
    }
    pattern = slash == std::string_view::npos ? std::string_view() : pattern.substr(slash + 1);
  }
  return out;
}

bool matches(const std::vector<std::string>& pattern, const std::vector<std::string>& path,
             std::map<std::string, std::string>& params) {
  params.clear();
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (is_rest(pattern[i])) {
      std::string rest;
      for (std::size_t j = i; j < path.size(); ++j) {
        rest += (rest.empty() ? "" : "/") + path[j];
      }
      params[param_name(pattern[i])] = rest;
      return true;
    }
    if (i >= path.size()) {
      return false;
    }
    if (is_param(pattern[i])) {
      params[param_name(pattern[i])] = path[i];
    } else if (pattern[i] != path[i]) {
      return false;
    }
  }
  return pattern.size() == path.size();
}

}  // namespace

std::string percent_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2])));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> parts;
  while (!path.empty()) {
    auto slash = path.find('/');
    auto part = path.substr(0, slash);
    if (!part.empty()) {
      parts.push_back(percent_decode(part, false));
    }
    path = slash == std::string_view::npos ? std::string_view() : path.substr(slash + 1);
  }
  return parts;
}

Target Target::parse(std::string_view target) {
  Target t;
  auto q = target.find('?');
  t.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) {
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
      auto amp = query.find('&');
      std::string_view item = query.substr(0, amp);
      auto eq = item.find('=');
      std::string key = percent_decode(item.substr(0, eq), true);
      std::string value =
          eq == std::string_view::npos ? "" : percent_decode(item.substr(eq + 1), true);
      if (!key.empty()) {
        t.query[key] = value;  // unknown parameters (cache-busters) are kept and ignored
      }
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    }
  }
  return t;
}

const std::string& Call::param(const std::string& name) const {
  static const std::string kEmpty;
  auto it = params.find(name);
  return it == params.end() ? kEmpty : it->second;
}

void Router::add(Verb method, std::string_view pattern, Route route) {
  entries_.push_back({method, std::string(pattern), pattern_segments(pattern), std::move(route)});
}

void Router::add(std::initializer_list<Verb> methods, std::string_view pattern, Route route) {
  for (Verb m : methods) {
    add(m, pattern, route);
  }
}

Router::Match Router::dispatch(Call& call) const {
  const auto path = split_path(call.target.path);
  bool path_known = false;
  std::map<std::string, std::string> params;
  for (const auto& e : entries_) {
    if (!matches(e.segments, path, params)) {
      continue;
    }
    path_known = true;
    if (e.method == call.req.method()) {
      call.params = std::move(params);
      e.route(call);
      return Match::kFound;
    }
  }
  return path_known ? Match::kNoMethod : Match::kNoPath;
}

std::string Router::pattern_of(std::string_view path) const {
  const auto parts = split_path(path);
  std::map<std::string, std::string> params;
  for (const auto& e : entries_) {
    if (matches(e.segments, parts, params)) {
      return e.pattern;
    }
  }
  return "";
}

}  // namespace cellgate::http
