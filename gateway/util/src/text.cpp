#include "cellgate/util/text.hpp"

#include <array>
#include <cstdint>
#include <cstdio>

namespace cellgate {

int hex_value(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

std::string strip_ansi(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] != '\x1b') {
      out.push_back(text[i++]);
      continue;
    }
    if (i + 1 >= text.size()) {
      break;
    }
    const char kind = text[i + 1];
    i += 2;
    if (kind == '[') {
      // CSI: parameter and intermediate bytes 0x20-0x3f, then one final byte 0x40-0x7e.
      while (i < text.size() && text[i] >= 0x20 && text[i] <= 0x3f) {
        ++i;
      }
      if (i < text.size()) {
        ++i;
      }
    } else if (kind == ']') {
      // OSC: until BEL or ESC '\'.
      while (i < text.size() && text[i] != '\x07' &&
             !(text[i] == '\x1b' && i + 1 < text.size() && text[i + 1] == '\\')) {
        ++i;
      }
      i += (i < text.size() && text[i] == '\x07') ? 1 : 2;
    }
  }
  return out;
}

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') {
    return c - 'A';
  }
  if (c >= 'a' && c <= 'z') {
    return c - 'a' + 26;
  }
  if (c >= '0' && c <= '9') {
    return c - '0' + 52;
  }
  if (c == '+') {
    return 62;
  }
  if (c == '/') {
    return 63;
  }
  return -1;
}
}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const auto n = (static_cast<unsigned char>(bytes[i]) << 16) |
                   (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                   static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  if (const std::size_t rest = bytes.size() - i; rest > 0) {
    const auto n = (static_cast<unsigned char>(bytes[i]) << 16) |
                   (rest == 2 ? static_cast<unsigned char>(bytes[i + 1]) << 8 : 0);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += rest == 2 ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> base64_decode(std::string_view text, Base64Spaces spaces) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "bad_base64", "not valid base64: " + what);
  };
  std::string out;
  out.reserve(text.size() / 4 * 3);
  std::array<int, 4> quad{};
  int n = 0;
  int pad = 0;
  bool finished = false;  // a padded quad ends the data
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n' || c == '\r' ||
        (spaces == Base64Spaces::kAnyWhitespace && (c == ' ' || c == '\t'))) {
      continue;
    }
    if (finished) {
      return bad("data after the padding at offset " + std::to_string(i));
    }
    if (c == '=') {
      if (n < 2) {
        return bad("misplaced '=' at offset " + std::to_string(i));
      }
      quad[static_cast<std::size_t>(n++)] = 0;
      ++pad;
    } else {
      const int v = sextet(c);
      if (v < 0 || pad > 0) {
        char what[64];
        std::snprintf(what, sizeof what, "unexpected byte 0x%02x at offset %zu",
                      static_cast<unsigned>(static_cast<unsigned char>(c)), i);
        return bad(what);
      }
      quad[static_cast<std::size_t>(n++)] = v;
    }
    if (n == 4) {
      const auto bits = (static_cast<std::uint32_t>(quad[0]) << 18) |
                        (static_cast<std::uint32_t>(quad[1]) << 12) |
                        (static_cast<std::uint32_t>(quad[2]) << 6) |
                        static_cast<std::uint32_t>(quad[3]);
      out.push_back(static_cast<char>((bits >> 16) & 0xff));
      if (pad < 2) {
        out.push_back(static_cast<char>((bits >> 8) & 0xff));
      }
      if (pad < 1) {
        out.push_back(static_cast<char>(bits & 0xff));
      }
      n = 0;
      finished = pad > 0;
    }
  }
  if (n != 0) {
    return bad("its length is not a multiple of 4");
  }
  return out;
}

}  // namespace cellgate
