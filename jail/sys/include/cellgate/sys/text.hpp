// Splitting the text of kernel files (/proc, cgroupfs): no allocation but the vector, no copies.
//
//   for (auto line : sys::split(text, '\n')) { auto v = sys::trim(line); ... }
//
// Thread-safety: pure functions; the views point into the caller's string.
#pragma once

#include <string_view>
#include <vector>

namespace cellgate::sys {

// `s` without leading and trailing spaces, tabs, CRs and LFs.
std::string_view trim(std::string_view s);
// The pieces between `sep`s: n separators make n + 1 pieces, empty ones included.
std::vector<std::string_view> split(std::string_view s, char sep);

}  // namespace cellgate::sys
