#include "cellgate/text.hpp"

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

}  // namespace cellgate
