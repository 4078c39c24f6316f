// Small text helpers for kernel output.
//
//   strip_ansi("\x1b[0;31mZeroDivisionError\x1b[0m") == "ZeroDivisionError"
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "cellgate/result.hpp"

namespace cellgate {

// The value of one hex digit (either case), or -1.
int hex_value(char c);

// Removes ANSI escape sequences (CSI "ESC [ ... final", OSC "ESC ] ... BEL/ST", and two-byte
// ESC sequences), as IPython tracebacks carry colour codes.
std::string strip_ansi(std::string_view text);

// Standard base64 (RFC 4648 section 4, with padding). The decoder is strict — an error
// (kInvalidArgument, "bad_base64") says what is wrong and where — except that it skips line
// breaks (Python's base64.encodebytes and Jupyter wrap base64 data at 76 columns), and with
// kAnyWhitespace also spaces and tabs.
enum class Base64Spaces { kLineBreaks, kAnyWhitespace };
std::string base64_encode(std::string_view bytes);
Result<std::string> base64_decode(std::string_view text,
                                  Base64Spaces spaces = Base64Spaces::kLineBreaks);

}  // namespace cellgate
