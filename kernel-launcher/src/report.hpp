// Internal: writing status lines and small pipe messages.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <string>

#include "cellgate/launcher/status.hpp"
#include "cellgate/sys/error_text.hpp"
#include "cellgate/unique_fd.hpp"

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

// Where the launcher's status lines go: the status fd (a pipe to the gateway) and the copy
// (--status-file), the same lines appended to a file in the kernel's runtime dir, so a gateway
// that restarts learns how a kernel it adopted ended although the pipe's reader is gone.
class StatusSink {
 public:
  explicit StatusSink(int fd) : fd_(fd) {}

  // Opens --status-file (append, 0600) as the copy; false when it cannot be opened ("": none).
  bool open_copy(const std::string& path) {
    if (path.empty()) {
      return true;
    }
    copy_.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    return static_cast<bool>(copy_);
  }

  // One status line: to the copy first (it survives the gateway), then to the pipe. The gateway
  // may be gone (crashed, being upgraded): a write to the reader-less pipe must not end the
  // launcher, which still supervises the kernel, so SIGPIPE is held for the write and its pending
  // instance consumed (the kernel, forked before, keeps its default disposition).
  void report(const StatusEvent& ev) const {
    const std::string line = ev.to_line();
    write_all(copy_.get(), line);
    if (fd_ < 0) {
      return;
    }
    sigset_t pipe_only, previous;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe_only, &previous);
    write_all(fd_, line);
    const timespec none{0, 0};
    while (::sigtimedwait(&pipe_only, nullptr, &none) == SIGPIPE) {
    }
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  }

  // In a child that goes into the jail: neither descriptor (a host file, the gateway's pipe)
  // goes with it.
  void close_in_child() {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
    copy_.reset();
  }

 private:
  int fd_;  // -1: none; not owned (main's)
  UniqueFd copy_;
};

inline StatusEvent setup_error(std::string message) {
  StatusEvent ev;
  ev.kind = StatusEvent::Kind::kExited;
  ev.reason = ExitReason::kSetupError;
  ev.message = std::move(message);
  return ev;
}

// The start of a jailed or a restore launch: the status fd kept from the kernel (close-on-exec)
// and --status-file opened as the copy. When the copy cannot be opened, that is reported as a
// setup error and false returned (the launcher then exits 127).
inline bool open_status(int status_fd, const std::string& status_file, StatusSink& status) {
  if (status_fd >= 0) {
    ::fcntl(status_fd, F_SETFD, FD_CLOEXEC);
  }
  if (!status.open_copy(status_file)) {
    status.report(setup_error("open('" + status_file + "'): " + sys::error_text(errno)));
    return false;
  }
  return true;
}

}  // namespace cellgate::launcher
