// Internal: writing status lines and small pipe messages.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
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

// The launcher's status copy (--status-file, opened once in main): the same lines, appended to
// a file in the kernel's runtime dir, so a gateway that restarts learns how a kernel it adopted
// ended although the pipe's reader is gone. -1: none.
inline int& status_copy_fd() {
  static int fd = -1;
  return fd;
}

// Opens --status-file (append, 0600) as the copy; false when it cannot be opened.
inline bool open_status_copy(const std::string& path) {
  if (path.empty()) {
    return true;
  }
  status_copy_fd() = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  return status_copy_fd() >= 0;
}

// One status line: to the copy first (it survives the gateway), then to the pipe. The gateway may
// be gone (crashed, being upgraded): a write to the reader-less pipe must not end the launcher,
// which still supervises the kernel, so SIGPIPE is held for the write and its pending instance
// consumed (the kernel, forked before, keeps its default disposition).
inline void report(int fd, const StatusEvent& ev) {
  const std::string line = ev.to_line();
  write_all(status_copy_fd(), line);
  if (fd < 0) {
    return;
  }
  sigset_t pipe_only, previous;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  ::sigprocmask(SIG_BLOCK, &pipe_only, &previous);
  write_all(fd, line);
  const timespec none{0, 0};
  while (::sigtimedwait(&pipe_only, nullptr, &none) == SIGPIPE) {
  }
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
}

inline StatusEvent setup_error(std::string message) {
  StatusEvent ev;
  ev.kind = StatusEvent::Kind::kExited;
  ev.reason = ExitReason::kSetupError;
  ev.message = std::move(message);
  return ev;
}

}  // namespace cellgate::launcher
