// The audit log's redaction (store/src/audit.cpp) over text a kernel or a client chose (an
// exception's name goes into every record of a failed cell). Input: the first byte picks the
// patterns (the defaults, a custom set, or a pattern read from the input up to the first
// newline); the rest is the text. Invariants: redact() ends (RE2 is linear: the 10 s libFuzzer
// timeout would catch a stall), and what is left once every "[REDACTED]" is taken out is a
// subsequence of the text (redaction only ever removes, and a kept group is part of the match).
// Run with -max_len of a few MiB (the CTest entry does).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cellgate/store/audit.hpp"
#include "fuzz_util.hpp"

namespace {

using cellgate::fuzz::check;
using cellgate::store::AuditLog;
using cellgate::store::AuditOptions;

bool is_subsequence(std::string_view part, std::string_view whole) {
  std::size_t i = 0;
  for (char c : whole) {
    if (i < part.size() && part[i] == c) {
      ++i;
    }
  }
  return i == part.size();
}

std::string without_tokens(std::string text) {
  constexpr std::string_view kToken = "[REDACTED]";
  std::string out;
  std::size_t from = 0;
  for (auto at = text.find(kToken); at != std::string::npos; at = text.find(kToken, from)) {
    out.append(text, from, at - from);
    from = at + kToken.size();
  }
  out.append(text, from);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  std::string_view data(reinterpret_cast<const char*>(bytes), size);
  if (data.empty()) {
    return 0;
  }
  AuditOptions options;
  options.path = "";
  options.max_string_bytes = 0;
  switch (static_cast<unsigned char>(data[0]) % 3) {
    case 0:
      break;  // the defaults
    case 1:
      options.redact = {"internal-[0-9]+", "(?i)(user=)\\w+", "\\bx?", "[a-z]+y"};
      break;
    default: {
      const auto nl = data.find('\n');
      if (nl == std::string_view::npos || nl > 256) {
        return 0;
      }
      options.redact = {std::string(data.substr(1, nl - 1))};
      data.remove_prefix(nl);
      break;
    }
  }
  data.remove_prefix(1);
  auto log = AuditLog::create(options);
  if (!log) {
    return 0;  // a pattern RE2 refuses, or one that matches the empty string
  }
  const std::string out = (*log)->redact(data);
  check(is_subsequence(without_tokens(out), data), "redaction left text that was not in the input",
        out.substr(0, 500));
  return 0;
}
