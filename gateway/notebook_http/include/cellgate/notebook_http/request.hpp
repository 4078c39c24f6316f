// The `REQUEST` global of Kernel Gateway's notebook-http mode (notebook_http/request_utils.py and
// handlers.py, 2.5.2): before an endpoint's cell runs, its kernel runs
//   REQUEST = "{\"body\": …, \"args\": {…}, \"path\": {…}, \"headers\": {…}}"
// a string holding JSON, written as Python's json.dumps writes it (", " and ": ", non-ASCII as
// \uXXXX, keys in the order they came), so `json.loads(REQUEST)` in a cell gets:
//   body     JSON when Content-Type is exactly application/json and the body parses; a dict of
//            lists for application/x-www-form-urlencoded (exactly) and multipart/form-data
//            (fields; file parts left out); else the body as text ("" when empty)
//   args     the query string: {name: [values…]}, '+' a space, blank values kept
//   path     {param: value}, percent-decoded
//   headers  {Name: value}, names in Tornado's Http-Header-Case, values as Latin-1 (Tornado reads
//            the head so), a repeated header a list of its values in order
// Text that is not UTF-8 (a body, a query value, a path parameter) is an error here (Kernel
// Gateway answers it with an empty 200 or a 400 depending on where it is).
//
//   CELLGATE_ASSIGN_OR_RETURN(nlohmann::ordered_json bundle, request_bundle(req, params));
//   std::string code = request_code(bundle, "python");
//
// Thread-safety: pure functions on values.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/http/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::notebook_http {

// Deeper JSON bodies are text, as Python's json.loads gives up on deep ones (RecursionError) and
// Kernel Gateway then keeps the text.
inline constexpr std::size_t kMaxBodyJsonDepth = 256;
// Multipart parts looked at, at most.
inline constexpr std::size_t kMaxFormParts = 1000;

// Python's json.dumps(value) with its defaults (ensure_ascii, ", " and ": "); invalid UTF-8 in
// strings is written as U+FFFD.
std::string python_json(const nlohmann::ordered_json& value);

// urllib.parse.parse_qs(query, keep_blank_values=True) as Tornado decodes it: {name: [values]}.
// Error (kInvalidArgument) when a name or value is not UTF-8 once decoded.
Result<nlohmann::ordered_json> parse_query(std::string_view query);

// The body as Kernel Gateway's parse_body makes it, by the request's Content-Type.
Result<nlohmann::ordered_json> parse_body(std::string_view content_type, std::string_view body);

// Tornado's header name normalisation: "x-FOO-bar" → "X-Foo-Bar".
std::string header_case(std::string_view name);

// The whole bundle: body, args, path, headers, in that order.
Result<nlohmann::ordered_json> request_bundle(
    const http::Request& req, const std::vector<std::pair<std::string, std::string>>& params);

// The statement a kernel runs first: `REQUEST = "<json>"` (`my $REQUEST = …` for Perl).
std::string request_code(const nlohmann::ordered_json& bundle, std::string_view language);

}  // namespace cellgate::notebook_http
