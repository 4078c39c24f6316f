// Kernel Gateway's notebook-http annotations (kernel_gateway/notebook_http/cell/parser.py, 2.5.2):
// a code cell whose source begins `# GET /path/:param` is an endpoint, one that begins
// `# ResponseInfo GET /path` prints the response's status and headers as JSON, every other code
// cell seeds each kernel. `#` is the comment of the notebook's language (`//` for Scala).
//
//   NotebookApi api = parse_api(code_cells, "#");
//   for (const Endpoint& e : api.endpoints) …           // matched in this order, first wins
//   if (auto params = match_path(api.endpoints[0], "/hello/w%C3%B6rld")) … (*params)[0].second
//
// As Kernel Gateway does: cells of one verb and path are joined ("\n" after each) and run as one;
// endpoints without parameters come first, then by the depth of their first parameter, deepest
// first, ties in notebook order (first_path_param_index, sorted in reverse, stably). A parameter
// is `:name` up to the next '/', matching one non-empty path segment, percent-decoded.
// Differences, on purpose: a path's literal text is compared as text with the request's decoded
// segment (Kernel Gateway compiles it into a regex and matches the raw, still-encoded path, so
// `.` matches any character and a non-ASCII path can never match), and a parameter name that is
// not an identifier, or used twice in one path, is refused with the cell's index (Kernel Gateway
// stops with a Python regex error).
//
// Hostile notebooks: one pass over each cell's first lines, no regex, no recursion; limits below.
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::notebook_http {

// The verbs Kernel Gateway's annotations know.
inline constexpr std::string_view kVerbs[] = {"GET", "PUT", "POST", "DELETE"};
// More endpoints or path segments than any API needs: refused at start.
inline constexpr std::size_t kMaxEndpoints = 4096;
inline constexpr std::size_t kMaxPathSegments = 64;

// One piece of an endpoint's path: literal text, or a parameter (`:name`) that takes the rest of
// its segment.
struct Segment {
  std::string literal;  // before the parameter, or the whole segment
  std::string param;    // "" : none
};

struct Endpoint {
  std::string path;  // as annotated, trimmed: "/hello/:name"
  std::vector<Segment> segments;
  std::map<std::string, std::string> sources;           // verb → the code run for it
  std::map<std::string, std::string> response_sources;  // verb → its ResponseInfo code
};

struct NotebookApi {
  std::vector<Endpoint> endpoints;  // in matching order
  std::vector<std::string> seed_cells;
  // ResponseInfo cells whose path has no endpoint (Kernel Gateway ignores them too).
  std::vector<std::string> orphan_responses;
};

// What a cell's first line says.
struct Annotation {
  enum class Kind { kNone, kEndpoint, kResponseInfo };
  Kind kind = Kind::kNone;
  std::string verb;
  std::string path;
};

// Kernel Gateway's `PREFIX\s+(ResponseInfo\s+)?(GET|PUT|POST|DELETE)\s+(/.*)` matched at the start
// of `source`, the path being the rest of its line, trimmed.
Annotation annotation_of(std::string_view source, std::string_view comment_prefix);

// The comment prefix of a notebook language (metadata.language_info.name): "//" for scala, else
// "#".
std::string comment_prefix_for(std::string_view language);

// Every code cell's source, in order. Errors (kInvalidArgument, "invalid_notebook"): a bad
// parameter name, too many endpoints or segments.
Result<NotebookApi> parse_api(const std::vector<std::string>& code_cells,
                              std::string_view comment_prefix);

// Kernel Gateway's first_path_param_index: the depth of the first ':' (its count of '/' before it,
// minus one), or the largest size_t for a path without one.
std::size_t first_param_index(std::string_view path);

// The endpoint's parameters (name, percent-decoded value) when `raw_path` (the request's path
// below the base URL, still percent-encoded, starting with '/') is one of its paths.
std::optional<std::vector<std::pair<std::string, std::string>>> match_path(
    const Endpoint& endpoint, std::string_view raw_path);

}  // namespace cellgate::notebook_http
