#include "cellgate/sys/error_text.hpp"

#include <cstring>

namespace cellgate::sys {

std::string error_text(int errnum) {
  // glibc 2.32: a pointer into the constant table, nullptr for an unknown value.
  if (const char* text = strerrordesc_np(errnum)) {
    return text;
  }
  return "Unknown error " + std::to_string(errnum);
}

}  // namespace cellgate::sys
