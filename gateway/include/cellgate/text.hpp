// Small text helpers for kernel output.
//
//   strip_ansi("\x1b[0;31mZeroDivisionError\x1b[0m") == "ZeroDivisionError"
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace cellgate {

// Removes ANSI escape sequences (CSI "ESC [ ... final", OSC "ESC ] ... BEL/ST", and two-byte
// ESC sequences), as IPython tracebacks carry colour codes.
std::string strip_ansi(std::string_view text);

}  // namespace cellgate
