// Internal: the zygote's socket protocol. One AF_UNIX SOCK_SEQPACKET connection per kernel; the
// launcher sends one request (JSON text plus file descriptors as SCM_RIGHTS), the zygote answers
// with one reply (JSON plus the new jail's pidfd) and closes. See zygote.hpp for the fields.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::launcher::zygote_wire {

inline constexpr std::size_t kMaxMessage = 1 << 20;  // a request carries a spec and an env
inline constexpr int kMaxFds = 8;

inline Result<void> send_message(int sock, const std::string& text, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      return {};
    }
    if (errno != EINTR) {
      return errno_error(ErrorCode::kUnavailable, "zygote", "sendmsg()", errno);
    }
  }
}

struct Message {
  std::string text;
  std::vector<UniqueFd> fds;
};

// Receives one message; the descriptors arrive close-on-exec. A truncated message or more
// descriptors than kMaxFds is an error (the extra ones are closed).
inline Result<Message> recv_message(int sock) {
  Message out;
  out.text.resize(kMaxMessage);
  iovec iov{out.text.data(), out.text.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return errno_error(ErrorCode::kUnavailable, "zygote", "recvmsg()", errno);
  }
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      const std::size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        out.fds.emplace_back(fd);
      }
    }
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    return make_error(ErrorCode::kInvalidArgument, "zygote", "message or descriptors truncated");
  }
  out.text.resize(static_cast<std::size_t>(n));
  return out;
}

}  // namespace cellgate::launcher::zygote_wire
