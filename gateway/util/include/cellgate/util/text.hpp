// Small text helpers for kernel output.
//
//   strip_ansi("\x1b[0;31mZeroDivisionError\x1b[0m") == "ZeroDivisionError"
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cellgate {

// Removes ANSI escape sequences (CSI "ESC [ ... final", OSC "ESC ] ... BEL/ST", and two-byte
// ESC sequences), as IPython tracebacks carry colour codes.
std::string strip_ansi(std::string_view text);

// Standard base64 (RFC 4648, with padding). decode skips ASCII whitespace (Jupyter wraps base64
// image data in newlines) and returns nullopt on any other character or bad padding.
std::string base64_encode(std::string_view bytes);
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace cellgate
