// Connect's protocol (connectrpc.com/docs/protocol), the JSON flavour E2B's SDK speaks to envd:
// unary calls are a JSON body each way; server-streaming calls are envelopes (one flag byte, a
// 4-byte big-endian length, the JSON), ended by an end-of-stream envelope (flag 0x02) holding
// {} or {"error": {"code", "message"}}. Errors carry Connect's codes ("not_found", …).
//
//   auto msg = envd::read_envelope(req.body());          // a streaming request's one message
//   exchange->write(envd::envelope(event.dump()));
//   exchange->write(envd::end_of_stream(error));         // error: nullopt for a clean end
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"

namespace cellgate::envd {

inline constexpr unsigned char kEndStreamFlag = 0x02;

// A Connect error: code ("not_found") and message.
struct ConnectError {
  std::string code;
  std::string message;
};
// Our error codes as Connect's (kNotFound → "not_found", …).
ConnectError connect_error(const Error& error);
// The HTTP status a unary call answers with for a Connect code (not_found → 404, …).
int http_status(std::string_view connect_code);
// {"code": …, "message": …}
std::string error_json(const ConnectError& error);

std::string envelope(std::string_view json, unsigned char flags = 0);
std::string end_of_stream(const std::optional<ConnectError>& error);
// The single message of a server-streaming request body; kInvalidArgument when the body is not
// exactly one uncompressed envelope.
Result<std::string> read_envelope(std::string_view body);

}  // namespace cellgate::envd
