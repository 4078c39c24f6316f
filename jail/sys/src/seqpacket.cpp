#include "cellgate/sys/seqpacket.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace cellgate::sys {

Result<std::pair<SeqpacketChannel, SeqpacketChannel>> SeqpacketChannel::pair(ChannelLimits limits) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return errno_error(ErrorCode::kInternal, "socketpair", "socketpair(SOCK_SEQPACKET)", errno);
  }
  return std::make_pair(SeqpacketChannel(UniqueFd(fds[0]), limits),
                        SeqpacketChannel(UniqueFd(fds[1]), limits));
}

Result<void> SeqpacketChannel::send(std::string_view data, std::span<const int> fds) const {
  return send_packet(fd_.get(), data, fds, limits_);
}

Result<std::optional<Message>> SeqpacketChannel::receive(bool nonblocking) const {
  return receive_packet(fd_.get(), limits_, nonblocking);
}

Result<void> send_packet(int fd, std::string_view data, std::span<const int> fds,
                         const ChannelLimits& limits) {
  if (data.size() > limits.max_bytes) {
    return make_error(ErrorCode::kInvalidArgument, "message_too_large",
                      "a message of " + std::to_string(data.size()) + " bytes (at most " +
                          std::to_string(limits.max_bytes) + ")");
  }
  if (fds.size() > limits.max_fds) {
    return make_error(ErrorCode::kInvalidArgument, "too_many_fds",
                      "a message with " + std::to_string(fds.size()) + " descriptors (at most " +
                          std::to_string(limits.max_fds) + ")");
  }
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(fds.empty() ? 0 : CMSG_SPACE(sizeof(int) * fds.size()));
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
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(data.size())) {
      return {};
    }
    if (n >= 0) {  // SOCK_SEQPACKET sends all or nothing; be sure anyway
      return make_error(ErrorCode::kInternal, "short_send", "sendmsg(): a short send");
    }
    if (errno == EINTR) {
      continue;
    }
    const int err = errno;
    const bool gone = err == EPIPE || err == ECONNRESET || err == ENOTCONN;
    return errno_error(gone ? ErrorCode::kUnavailable : ErrorCode::kInternal,
                       gone ? "peer_gone" : "send_failed", "sendmsg(SOCK_SEQPACKET)", err);
  }
}

Result<std::optional<Message>> receive_packet(int fd, const ChannelLimits& limits,
                                              bool nonblocking) {
  Message out;
  // One byte more than the limit: a message of exactly max_bytes is not truncated, one longer
  // is (MSG_TRUNC is set either way when the buffer is short; the spare byte keeps the size
  // check independent of it). Not zero-filled: the limit is megabytes and most messages are a
  // few hundred bytes, so a receive costs what recvmsg(2) writes, not a memset of the limit; the
  // message is copied out at its length.
  const std::size_t capacity = limits.max_bytes + 1;
  const auto buffer = std::make_unique_for_overwrite<char[]>(capacity);
  iovec iov{buffer.get(), capacity};
  // Room for max_fds descriptors and no more: a peer's extra ones are dropped by the kernel
  // (closed, MSG_CTRUNC), never installed in our table.
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<std::size_t>(limits.max_fds, 1)));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | (nonblocking ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      return make_error(ErrorCode::kUnavailable, "would_block", "no message yet");
    }
    if (err == ECONNRESET) {
      return std::optional<Message>();
    }
    return errno_error(ErrorCode::kUnavailable, "receive_failed", "recvmsg(SOCK_SEQPACKET)", err);
  }
  // Take ownership of every descriptor first, so that a refused message closes them all.
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      const std::size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(cm) + i * sizeof(int), sizeof received);
        out.fds.emplace_back(received);
      }
    }
  }
  if (n == 0 && out.fds.empty() && (msg.msg_flags & MSG_TRUNC) == 0) {
    // A zero-length datagram and the end of the stream look alike on SOCK_SEQPACKET; the
    // protocols on this channel never send an empty message, so this is the end.
    return std::optional<Message>();
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0 || static_cast<std::size_t>(n) > limits.max_bytes) {
    return make_error(ErrorCode::kInvalidArgument, "message_too_large",
                      "a message over " + std::to_string(limits.max_bytes) +
                          " bytes was refused (its descriptors closed)");
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || out.fds.size() > limits.max_fds) {
    return make_error(ErrorCode::kInvalidArgument, "too_many_fds",
                      "a message with more than " + std::to_string(limits.max_fds) +
                          " descriptors was refused (those received closed)");
  }
  out.data.assign(buffer.get(), static_cast<std::size_t>(n));
  return std::optional<Message>(std::move(out));
}

void SeqpacketChannel::shutdown() const {
  ::shutdown(fd_.get(), SHUT_RDWR);
}

}  // namespace cellgate::sys
