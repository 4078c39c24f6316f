#include "cellgate/sys/pipe.hpp"

#include <unistd.h>

#include <cerrno>

namespace cellgate::sys {

Result<Pipe> make_pipe(int extra_flags) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | extra_flags) != 0) {
    return errno_error(ErrorCode::kInternal, "pipe", "pipe2()", errno);
  }
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

Result<SocketPair> make_socket_pair(int type) {
  int fds[2];
  if (::socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, fds) != 0) {
    return errno_error(ErrorCode::kInternal, "socketpair", "socketpair(AF_UNIX)", errno);
  }
  return SocketPair{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

Result<void> write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) {
      continue;
    }
    if (w <= 0) {
      return errno_error(ErrorCode::kUnavailable, "write", "write()", w < 0 ? errno : EIO);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return {};
}

Result<std::size_t> read_some(int fd, void* data, std::size_t n) {
  for (;;) {
    const ssize_t r = ::read(fd, data, n);
    if (r >= 0) {
      return static_cast<std::size_t>(r);
    }
    if (errno != EINTR) {
      return errno_error(ErrorCode::kUnavailable, "read", "read()", errno);
    }
  }
}

}  // namespace cellgate::sys
