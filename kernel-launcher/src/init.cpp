// pid 1 of a jail and its report pipe: see init.hpp.
#include "init.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>

#include "cellgate/sys/error_text.hpp"
#include "report.hpp"

namespace cellgate::launcher::init {
namespace {

// Reaps everything ready; true once the kernel was among them (its "X" line written).
bool reap(pid_t kernel, int report_fd) {
  for (;;) {
    int wstatus = 0;
    const pid_t done = ::waitpid(-1, &wstatus, WNOHANG);
    if (done <= 0) {
      return false;
    }
    if (done == kernel) {
      report_exit(report_fd, wstatus);
      return true;
    }
  }
}

}  // namespace

sigset_t reaper_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kForwardedSignals) {
    sigaddset(&set, sig);
  }
  sigaddset(&set, SIGCHLD);
  return set;
}

void fail(int fd, std::string_view message) {
  std::string line = "E";
  line.append(message);
  line += '\n';
  write_all(fd, line);
  ::_exit(127);
}

void report_exit(int report_fd, int wait_status) {
  char line[32];
  const int n = std::snprintf(line, sizeof line, "X%d\n", wait_status);
  if (n > 0) {
    (void)::write(report_fd, line, static_cast<std::size_t>(n));
  }
}

pid_t start_kernel(int report_fd, const std::function<void(int setup_fd)>& kernel_main) {
  int setup[2];
  if (::pipe2(setup, O_CLOEXEC) != 0) {
    fail(report_fd, "pipe2(): " + sys::error_text(errno));
  }
  const pid_t kernel = ::fork();
  if (kernel < 0) {
    fail(report_fd, "fork(): " + sys::error_text(errno));
  }
  if (kernel == 0) {
    ::close(setup[0]);
    kernel_main(setup[1]);
    ::_exit(127);  // kernel_main returned: a bug, not a kernel
  }
  ::close(setup[1]);
  const std::string failure = read_until_eof(setup[0]);
  ::close(setup[0]);
  if (!failure.empty()) {
    write_all(report_fd, failure);  // already "E<text>\n"
    ::_exit(127);
  }
  write_all(report_fd, "R\n");
  return kernel;
}

int reap_kernel(pid_t kernel, int report_fd, int go_fd) {
  const sigset_t mask = reaper_signals();
  const int sfd = ::signalfd(-1, &mask, SFD_CLOEXEC);
  if (sfd < 0) {
    ::kill(kernel, SIGKILL);
    return 127;
  }
  if (reap(kernel, report_fd)) {
    return 0;
  }
  for (;;) {
    pollfd fds[2] = {{sfd, POLLIN, 0}, {go_fd, POLLIN, 0}};  // poll skips a negative go_fd
    if (::poll(fds, 2, -1) < 0) {
      continue;
    }
    if (fds[1].revents != 0) {
      char c;
      if (::read(go_fd, &c, 1) <= 0) {
        return 137;  // the launcher is gone: leaving as pid 1 kills the kernel with us
      }
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      if (::read(sfd, &info, sizeof info) == sizeof info && info.ssi_signo != SIGCHLD) {
        ::kill(kernel, static_cast<int>(info.ssi_signo));
      }
      if (reap(kernel, report_fd)) {
        return 0;
      }
    }
  }
}

InitLine parse_line(std::string_view line) {
  InitLine parsed;
  if (line == "R") {
    parsed.kind = InitLine::Kind::kReady;
  } else if (!line.empty() && line.front() == 'E') {
    parsed.kind = InitLine::Kind::kError;
    parsed.text = std::string(line.substr(1));
  } else if (!line.empty() && line.front() == 'X') {
    const char* end = line.data() + line.size();
    auto [ptr, ec] = std::from_chars(line.data() + 1, end, parsed.wait_status);
    if (ec == std::errc{} && ptr == end && line.size() > 1) {
      parsed.kind = InitLine::Kind::kExit;
    }
  }
  return parsed;
}

InitLine InitReport::next() {
  for (;;) {
    const auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      InitLine line = parse_line(std::string_view(buffer_).substr(0, nl));
      buffer_.erase(0, nl + 1);
      return line;
    }
    char buf[512];
    const ssize_t n = ::read(fd_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      if (buffer_.empty()) {
        return InitLine{InitLine::Kind::kEnd, {}, 0};
      }
      InitLine line = parse_line(buffer_);  // a last line without its newline
      buffer_.clear();
      return line;
    }
    buffer_.append(buf, static_cast<std::size_t>(n));
  }
}

Result<void> InitReport::wait_ready(const std::string& ended) {
  const InitLine first = next();
  if (first.kind == InitLine::Kind::kReady) {
    return {};
  }
  // "E" with no text reads as the pipe's end, as the launcher always read it.
  return make_error(
      ErrorCode::kInternal, "init",
      first.kind == InitLine::Kind::kError && !first.text.empty() ? first.text : ended);
}

std::optional<int> InitReport::kernel_status() {
  std::optional<int> status;
  for (InitLine line = next(); line.kind != InitLine::Kind::kEnd; line = next()) {
    if (line.kind == InitLine::Kind::kExit) {
      status = line.wait_status;
    }
  }
  return status;
}

}  // namespace cellgate::launcher::init
