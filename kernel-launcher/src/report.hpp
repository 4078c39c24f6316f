// Internal: writing status lines and small pipe messages.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <string>

#include "cellgate/launcher/status.hpp"

namespace cellgate::launcher {

inline void write_all(int fd, const std::string& text) {
  if (fd < 0) {
    return;
  }
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;  // the reader went away; the kernel still runs and is still reaped
    }
    done += static_cast<std::size_t>(n);
  }
}

// Everything written to `fd` until its last writer closes it (a kernel's setup errors: nothing
// at all means it got through its steps).
inline std::string read_until_eof(int fd) {
  std::string text;
  char buf[512];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      break;
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  return text;
}

inline void report(int fd, const StatusEvent& ev) { write_all(fd, ev.to_line()); }

inline StatusEvent setup_error(std::string message) {
  StatusEvent ev;
  ev.kind = StatusEvent::Kind::kExited;
  ev.reason = ExitReason::kSetupError;
  ev.message = std::move(message);
  return ev;
}

}  // namespace cellgate::launcher
