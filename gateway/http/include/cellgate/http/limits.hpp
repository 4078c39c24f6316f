// Limits that keep a hostile client from using a request as a weapon: a small body limit for the
// control routes (a kernel start, a session, an interrupt carries a few hundred bytes of JSON),
// decided from the request head before the body is read, and a nesting-depth check run before a
// JSON body becomes a DOM (a 16 MB body of '[' is 16 M nested arrays, ~1 GB of nlohmann nodes),
// and a check of an unfinished request head, so bytes that can never become a request are
// answered at once rather than after the header deadline.
//
//   parser.body_limit(http::body_limit_for(options, method, target));
//   if (auto deep = http::check_json_depth(body, http::kMaxJsonDepth); !deep) { … 400 … }
//   if (auto start = http::check_head_start(bytes_so_far, limit); !start) { … 400, close … }
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

#include "cellgate/http/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::http {

struct HttpOptions;

// Deeper JSON than any API body needs (a cell's metadata is a few levels).
inline constexpr std::size_t kMaxJsonDepth = 64;
// Answers and events a gateway streams carry kernels' data, which the gateway takes up to 256
// levels deep (protocol::kMaxJsonDepth), wrapped in a few of its own (answer, outputs, output,
// data): a client of a gateway reads them up to this depth.
inline constexpr std::size_t kMaxKernelJsonDepth = 256 + 8;

// The body limit of one request: options.max_control_body_bytes for the control routes
// (POST /api/kernels, /api/kernels/{id}/interrupt|restart, /api/sessions[/{id}], E2B's
// /contexts[/{id}[/restart]]), under any base URL; options.max_body_bytes for the rest (execute,
// file uploads, MCP).
std::size_t body_limit_for(const HttpOptions& options, Verb method, std::string_view target);

// Error "bad_request" (kInvalidArgument) when `text` nests arrays/objects deeper than
// `max_depth`. Strings are skipped (brackets inside them do not count); the text need not be
// valid JSON: the parser that runs next says so.
Result<void> check_json_depth(std::string_view text, std::size_t max_depth = kMaxJsonDepth);

// json::parse(text) without exceptions for text nested at most `max_depth` deep, a discarded
// value (is_discarded()) for anything else: nlohmann::json builds any depth, but its dump(),
// copies and comparisons recurse once per level, so what comes from outside is checked first.
nlohmann::json parse_json(std::string_view text, std::size_t max_depth = kMaxJsonDepth);

// Error "bad_request" (kInvalidArgument) when `head`, the first bytes of a request head whose
// CRLFCRLF has not arrived yet, cannot begin an HTTP/1.1 request: a TLS handshake (this is the
// plain port), HTTP/2's prior-knowledge preface, a NUL, a line ended by a bare LF (RFC 9112 2.2:
// lines end in CRLF; a bare LF is refused, not read as an end of line, since a proxy in front
// may read it otherwise), or anything Beast's parser already refuses (binary, a bad method). A
// head that may still become a request passes; whether it fits `header_limit` is the parser's
// to say once it is whole or over the limit.
Result<void> check_head_start(std::string_view head, std::size_t header_limit);

}  // namespace cellgate::http
