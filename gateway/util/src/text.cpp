#include "cellgate/util/text.hpp"

namespace cellgate {

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

std::optional<std::string> base64_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  unsigned int acc = 0;
  int bits = 0;
  int padding = 0;
  std::size_t symbols = 0;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
      continue;
    }
    if (c == '=') {
      ++padding;
      ++symbols;
      continue;
    }
    const int v = sextet(c);
    if (v < 0 || padding > 0) {
      return std::nullopt;  // a stray character, or data after the padding
    }
    ++symbols;
    acc = (acc << 6) | static_cast<unsigned int>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if (symbols % 4 != 0 || padding > 2 || (acc & ((1u << bits) - 1)) != 0) {
    return std::nullopt;
  }
  return out;
}

}  // namespace cellgate
