#include "cellgate/notebook_http/annotations.hpp"

#include <algorithm>
#include <limits>

#include "cellgate/http/router.hpp"

namespace cellgate::notebook_http {
namespace {

// Python's `\s` and str.strip() in the ASCII range (Unicode spaces are not looked for).
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= '\x1c' && c <= '\x1f');
}

std::size_t skip_spaces(std::string_view s, std::size_t i) {
  while (i < s.size() && is_space(s[i])) {
    ++i;
  }
  return i;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) {
    s.remove_prefix(1);
  }
  while (!s.empty() && is_space(s.back())) {
    s.remove_suffix(1);
  }
  return s;
}

// `\s+VERB\s+(/.*)` from `i`: the verb and the trimmed rest of the line, or false.
bool verb_and_path(std::string_view s, std::size_t i, Annotation& out) {
  const std::size_t after_space = skip_spaces(s, i);
  if (after_space == i) {
    return false;
  }
  for (std::string_view verb : kVerbs) {
    if (s.substr(after_space, verb.size()) != verb) {
      continue;
    }
    const std::size_t path_start = skip_spaces(s, after_space + verb.size());
    if (path_start == after_space + verb.size() || path_start >= s.size() || s[path_start] != '/') {
      return false;
    }
    const std::size_t line_end = s.find('\n', path_start);
    out.verb = std::string(verb);
    out.path = std::string(trim(s.substr(path_start, line_end - path_start)));
    return true;
  }
  return false;
}

bool is_identifier(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x80 || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9');
  });
}

Error invalid(std::string message) {
  return Error{ErrorCode::kInvalidArgument, "invalid_notebook", std::move(message)};
}

// "/a/b:c" → {"", "a", {"b", "c"}}: the pieces between '/', the first being before the first '/'.
Result<std::vector<Segment>> segments_of(const std::string& path, std::size_t cell) {
  std::vector<Segment> out;
  std::map<std::string, bool> seen;
  std::size_t start = 0;
  while (true) {
    const std::size_t slash = path.find('/', start);
    const std::string piece = path.substr(start, slash - start);
    Segment segment;
    // Kernel Gateway's parameter: ':' then [^/\s]* (here: to the end of the segment).
    if (const std::size_t colon = piece.find(':'); colon != std::string::npos) {
      segment.literal = piece.substr(0, colon);
      segment.param = piece.substr(colon + 1);
      if (!is_identifier(segment.param)) {
        return invalid("cells[" + std::to_string(cell) + "]: the path parameter ':" +
                       segment.param + "' of " + path + " is not a name (letters, digits, _)");
      }
      if (seen[segment.param]) {
        return invalid("cells[" + std::to_string(cell) +
                       "]: the path parameter ':" + segment.param + "' appears twice in " + path);
      }
      seen[segment.param] = true;
    } else {
      segment.literal = piece;
    }
    out.push_back(std::move(segment));
    if (out.size() > kMaxPathSegments) {
      return invalid("cells[" + std::to_string(cell) + "]: the path " + path.substr(0, 200) +
                     "… has more than " + std::to_string(kMaxPathSegments) + " segments");
    }
    if (slash == std::string::npos) {
      return out;
    }
    start = slash + 1;
  }
}

}  // namespace

Annotation annotation_of(std::string_view source, std::string_view comment_prefix) {
  Annotation out;
  if (comment_prefix.empty() || !source.starts_with(comment_prefix)) {
    return out;
  }
  const std::size_t i = comment_prefix.size();
  if (verb_and_path(source, i, out)) {
    out.kind = Annotation::Kind::kEndpoint;
    return out;
  }
  constexpr std::string_view kResponseInfo = "ResponseInfo";
  const std::size_t word = skip_spaces(source, i);
  if (word > i && source.substr(word, kResponseInfo.size()) == kResponseInfo &&
      verb_and_path(source, word + kResponseInfo.size(), out)) {
    out.kind = Annotation::Kind::kResponseInfo;
    return out;
  }
  return Annotation{};
}

std::string comment_prefix_for(std::string_view language) {
  return language == "scala" ? "//" : "#";
}

std::size_t first_param_index(std::string_view path) {
  const std::size_t colon = path.find(':');
  if (colon == std::string_view::npos) {
    return std::numeric_limits<std::size_t>::max();
  }
  const auto slashes =
      static_cast<std::size_t>(std::count(path.begin(), path.begin() + colon, '/'));
  // Python's count - 1 is -1 for ":x" (no slash before it): below every other depth.
  return slashes == 0 ? 0 : slashes - 1;
}

Result<NotebookApi> parse_api(const std::vector<std::string>& code_cells,
                              std::string_view comment_prefix) {
  NotebookApi api;
  std::vector<std::string> order;  // paths in the order first seen
  std::map<std::string, Endpoint> by_path;
  std::vector<std::pair<Annotation, std::size_t>> responses;
  for (std::size_t i = 0; i < code_cells.size(); ++i) {
    const std::string& source = code_cells[i];
    Annotation a = annotation_of(source, comment_prefix);
    if (a.kind == Annotation::Kind::kNone) {
      api.seed_cells.push_back(source);
      continue;
    }
    if (a.kind == Annotation::Kind::kResponseInfo) {
      responses.emplace_back(std::move(a), i);
      continue;
    }
    auto [it, added] = by_path.try_emplace(a.path);
    if (added) {
      if (by_path.size() > kMaxEndpoints) {
        return invalid("more than " + std::to_string(kMaxEndpoints) + " endpoint paths");
      }
      it->second.path = a.path;
      CELLGATE_ASSIGN_OR_RETURN(it->second.segments, segments_of(a.path, i));
      order.push_back(a.path);
    }
    it->second.sources[a.verb] += source + "\n";
  }
  for (auto& [a, i] : responses) {
    auto it = by_path.find(a.path);
    if (it == by_path.end()) {
      api.orphan_responses.push_back(a.path);
      continue;
    }
    it->second.response_sources[a.verb] += code_cells[i] + "\n";
  }
  std::stable_sort(order.begin(), order.end(), [](const std::string& a, const std::string& b) {
    return first_param_index(a) > first_param_index(b);
  });
  for (const auto& path : order) {
    api.endpoints.push_back(std::move(by_path[path]));
  }
  return api;
}

std::optional<std::vector<std::pair<std::string, std::string>>> match_path(
    const Endpoint& endpoint, std::string_view raw_path) {
  std::vector<std::pair<std::string, std::string>> params;
  std::size_t start = 0;
  for (std::size_t n = 0; n < endpoint.segments.size(); ++n) {
    const Segment& want = endpoint.segments[n];
    if (start > raw_path.size()) {
      return std::nullopt;
    }
    const std::size_t slash = raw_path.find('/', start);
    const bool last = n + 1 == endpoint.segments.size();
    if (last != (slash == std::string_view::npos)) {
      return std::nullopt;  // more segments, or fewer, than the endpoint's
    }
    const std::string piece = http::percent_decode(raw_path.substr(start, slash - start), false);
    if (want.param.empty()) {
      if (piece != want.literal) {
        return std::nullopt;
      }
    } else {
      if (!piece.starts_with(want.literal) || piece.size() == want.literal.size()) {
        return std::nullopt;
      }
      params.emplace_back(want.param, piece.substr(want.literal.size()));
    }
    start = slash == std::string_view::npos ? raw_path.size() + 1 : slash + 1;
  }
  return params;
}

}  // namespace cellgate::notebook_http
