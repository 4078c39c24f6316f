// Internal: the parts of the HTTP and WebSocket sessions that do not depend on the stream type,
// compiled once in session_parts.cpp instead of in every instantiation of the session templates
// (http_session.hpp, ws_session.hpp): reading a request head, what a failed read means, the
// error answers, chunked framing, the WebSocket handshake's options.
//
//   switch (scan_head(bytes, options.max_header_bytes).kind) { … }
//   stream_push(chunk(data));
//
// Thread-safety: pure functions, but for count_rejected/count_dropped (HttpStats is shared).
#pragma once

#include <boost/beast/core/error.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <boost/beast/websocket/stream_base.hpp>
#include <cstddef>
#include <string>
#include <string_view>

#include "cellgate/http/listener.hpp"
#include "cellgate/http/message.hpp"

namespace cellgate::http::detail {

// ---- HTTP ----

// The bytes gathered of a request head (before Beast parses it, to see its raw lines: Beast
// accepts obs-fold, RFC 9112 5.2, and folds it into the value, which a proxy in front may not).
struct HeadScan {
  enum class Kind {
    kPartial,   // no CRLFCRLF yet and nothing wrong so far: read more
    kComplete,  // a whole head (or more bytes than the header limit): let Beast parse it
    kBad,       // can never become a request: answer 400 and close
  };
  Kind kind;
  std::string message;  // kBad: why
};
HeadScan scan_head(std::string_view data, std::size_t max_header_bytes);

// What a failed request read means for the connection.
enum class ReadFailure {
  kNone,         // no failure: a request is in
  kEnd,          // the client ended the connection between requests: close our side
  kBodyLimit,    // 413, then close
  kHeaderLimit,  // 431, then close
  kMalformed,    // 400 (a malformed request line, header or body framing), then close
  kDrop,         // timeouts, resets, a request cut short: drop the connection silently
};
ReadFailure classify_read(boost::beast::error_code ec);

// An error answer made before a request was parsed (or after it was refused): a JSON body with
// `reason` and `message`, Connection: close (what follows on the connection cannot be trusted).
Response refusal(Status status, const std::string& reason, const std::string& message);

// A request answered with this shows the client holds the token (or needs none): anything but
// 400, 401, 403 and 413.
bool proves_client(Status status);

// Chunked transfer coding (RFC 9112 7.1): the head of a streamed answer (its body dropped,
// Transfer-Encoding: chunked set), one chunk of non-empty `data` (a zero-size chunk would end the
// answer), and the last chunk.
std::string chunked_head(Response head);
std::string chunk(std::string_view data);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

void count_rejected(const HttpOptions& options, Status status);

// ---- WebSocket ----

boost::beast::websocket::stream_base::timeout ws_timeouts(const HttpOptions& options);
// Server: cellgate, and the subprotocol chosen (none when empty).
void decorate_ws_handshake(boost::beast::websocket::response_type& res,
                           const std::string& subprotocol);
void count_dropped(const HttpOptions& options, const char* why);

}  // namespace cellgate::http::detail
