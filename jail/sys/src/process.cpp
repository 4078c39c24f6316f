#include "cellgate/sys/process.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace cellgate::sys {

Result<PidFd> PidFd::open(pid_t pid) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    return errno_error(errno == ESRCH ? ErrorCode::kNotFound : ErrorCode::kInternal, "pidfd",
                       "pidfd_open(" + std::to_string(pid) + ")", errno);
  }
  return PidFd(UniqueFd(fd), pid);
}

Result<void> PidFd::signal(int sig) const {
  if (::syscall(SYS_pidfd_send_signal, fd_.get(), sig, nullptr, 0) != 0) {
    return errno_error(
        errno == ESRCH ? ErrorCode::kNotFound : ErrorCode::kInternal, "pidfd",
        "pidfd_send_signal(" + std::to_string(pid_) + ", " + std::to_string(sig) + ")", errno);
  }
  return {};
}

bool PidFd::wait_readable(std::chrono::milliseconds timeout) const {
  pollfd p{fd_.get(), POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    // Rounded up: poll(2) takes whole milliseconds, and the grace is a minimum.
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int n = ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
    if (n > 0) {
      return true;
    }
    if (n == 0 || errno != EINTR) {
      return false;
    }
  }
}

Child::~Child() {
  if (running()) {
    (void)pidfd_.signal(SIGKILL);
    (void)wait();
  }
}

Child::Child(Child&& other) noexcept
    : pidfd_(std::move(other.pidfd_)), status_(std::exchange(other.status_, std::nullopt)) {}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    if (running()) {
      (void)pidfd_.signal(SIGKILL);
      (void)wait();
    }
    pidfd_ = std::move(other.pidfd_);
    status_ = std::exchange(other.status_, std::nullopt);
  }
  return *this;
}

Result<Child> Child::fork(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    return errno_error(ErrorCode::kInternal, "fork", "fork()", errno);
  }
  if (pid == 0) {
    ::_exit(body());
  }
  return adopt(pid);
}

Result<Child> Child::adopt(pid_t pid) {
  auto pidfd = PidFd::open(pid);
  if (!pidfd) {
    return std::move(pidfd).error();
  }
  return Child(std::move(pidfd).value());
}

std::optional<int> Child::poll() {
  if (status_ || !pidfd_) {
    return status_;
  }
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pidfd_.pid(), &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pidfd_.pid()) {
    status_ = status;
  }
  return status_;
}

Result<int> Child::wait() {
  if (status_) {
    return *status_;
  }
  if (!pidfd_) {
    return make_error(ErrorCode::kFailedPrecondition, "child", "no child to wait for");
  }
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pidfd_.pid(), &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r != pidfd_.pid()) {
    return errno_error(ErrorCode::kInternal, "child",
                       "waitpid(" + std::to_string(pidfd_.pid()) + ")", errno);
  }
  status_ = status;
  return status;
}

Result<int> Child::terminate(std::chrono::milliseconds grace) {
  if (poll()) {
    return *status_;
  }
  if (!pidfd_) {
    return make_error(ErrorCode::kFailedPrecondition, "child", "no child to terminate");
  }
  (void)pidfd_.signal(SIGTERM);
  if (!pidfd_.wait_readable(grace)) {
    (void)pidfd_.signal(SIGKILL);
  }
  return wait();
}

pid_t Child::release() {
  const pid_t pid = pidfd_.pid();
  pidfd_ = PidFd();
  status_.reset();
  return pid;
}

}  // namespace cellgate::sys
