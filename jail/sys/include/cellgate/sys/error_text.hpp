// The text of an errno value ("No such file or directory"), for messages that name a failed
// call: `mkdir('/x', 0700): Permission denied` (docs/errors.md, rule 3).
//
//   log("pipe2(): " + sys::error_text(errno));
//
// std::strerror may return a buffer it shares between threads (POSIX allows it; clang-tidy's
// concurrency-mt-unsafe refuses it), so every part of cellgate goes through this one function
// instead. It reads glibc's constant table (strerrordesc_np), untranslated as log lines should
// be.
//
// Thread-safety: a pure function; safe from any thread, and in a child after fork(2) of a
// single-threaded parent (it allocates the returned string).
//
// Inline, so that pid 1's static reaper (kernel-launcher's cellgate_init, which links nothing of
// the sys floor) can use it too.
#pragma once

#include <cstring>
#include <string>

namespace cellgate::sys {

// strerror(3)'s text for `errnum`, without its shared buffer; "Unknown error N" for a value
// glibc has no text for, as strerror says.
inline std::string error_text(int errnum) {
  // glibc 2.32: a pointer into the constant table, nullptr for an unknown value.
  if (const char* text = strerrordesc_np(errnum)) {
    return text;
  }
  return "Unknown error " + std::to_string(errnum);
}

}  // namespace cellgate::sys
