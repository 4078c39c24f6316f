// Helpers the fuzz targets share: the one way to fail (print what broke, then abort, which
// libFuzzer reports as a crash and saves the input) and the frame splitting of the multipart
// targets.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace cellgate::fuzz {

// An invariant broke: say which, then abort so libFuzzer keeps the input as a reproducer.
[[noreturn]] inline void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz invariant broken: %s\n%s\n", what, detail.c_str());
  std::abort();
}

inline void check(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) {
    fail(what, detail);
  }
}

// A ZeroMQ multipart message as one fuzz input: its frames separated by two NUL bytes (JSON
// frames never contain a raw NUL; a binary buffer with "\0\0" is simply cut in two).
inline constexpr std::string_view kFrameSeparator{"\0\0", 2};

inline std::vector<std::string_view> split_frames(std::string_view data) {
  std::vector<std::string_view> frames;
  for (;;) {
    const auto at = data.find(kFrameSeparator);
    if (at == std::string_view::npos) {
      frames.push_back(data);
      return frames;
    }
    frames.push_back(data.substr(0, at));
    data.remove_prefix(at + kFrameSeparator.size());
  }
}

}  // namespace cellgate::fuzz
