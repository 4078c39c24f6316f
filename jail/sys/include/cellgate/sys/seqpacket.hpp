// SeqpacketChannel: one AF_UNIX SOCK_SEQPACKET socket that sends and receives whole messages,
// each a byte string plus up to a few file descriptors (SCM_RIGHTS, unix(7)). The one wire under
// the broker and the zygote: each message is one datagram, so there is no framing to get wrong.
//
//   CELLGATE_ASSIGN_OR_RETURN(auto pair, sys::SeqpacketChannel::pair({.max_bytes = 1 << 20}));
//   CELLGATE_TRY(pair.first.send(text, {pidfd.get()}));
//   CELLGATE_ASSIGN_OR_RETURN(std::optional<sys::Message> m, pair.second.receive());
//   if (!m) { /* the peer closed */ }
//
// Limits are checked on both sides. A received message longer than max_bytes (MSG_TRUNC) or
// with more descriptors than max_fds (MSG_CTRUNC) is refused with kInvalidArgument
// ("message_too_large" / "too_many_fds"), and every descriptor that did arrive is closed: a
// peer cannot make us hold descriptors by sending them with a message we drop. Received
// descriptors are close-on-exec (MSG_CMSG_CLOEXEC), so none leaks into a child we spawn.
//
// Thread-safety: send() from several threads at once is safe (each is one sendmsg(2)); one
// thread receives.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::sys {

struct ChannelLimits {
  std::size_t max_bytes = std::size_t{1} << 20;
  std::size_t max_fds = 8;
};

struct Message {
  std::string data;
  std::vector<UniqueFd> fds;
};

class SeqpacketChannel {
 public:
  SeqpacketChannel() = default;
  explicit SeqpacketChannel(UniqueFd fd, ChannelLimits limits = {})
      : fd_(std::move(fd)), limits_(limits) {}

  // A connected pair (socketpair(2), close-on-exec).
  static Result<std::pair<SeqpacketChannel, SeqpacketChannel>> pair(ChannelLimits limits = {});

  int fd() const { return fd_.get(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  const ChannelLimits& limits() const { return limits_; }
  UniqueFd release() { return std::move(fd_); }

  // One message. EPIPE/ECONNRESET (the peer is gone) is kUnavailable "peer_gone"; a message over
  // the limits is kInvalidArgument and nothing is sent.
  Result<void> send(std::string_view data, std::span<const int> fds = {}) const;
  // The next message; nullopt when the peer has closed. A message over the limits is an error
  // (see above) and is consumed, so the next call reads the one after it. With `nonblocking`,
  // EAGAIN is kUnavailable "would_block".
  Result<std::optional<Message>> receive(bool nonblocking = false) const;
  // shutdown(2) both ways: a reader blocked in receive() on either side sees the end.
  void shutdown() const;

 private:
  UniqueFd fd_;
  ChannelLimits limits_;
};

// The same on a descriptor the caller owns (a connection accepted from a listening socket).
Result<void> send_packet(int fd, std::string_view data, std::span<const int> fds,
                         const ChannelLimits& limits);
Result<std::optional<Message>> receive_packet(int fd, const ChannelLimits& limits,
                                              bool nonblocking = false);

}  // namespace cellgate::sys
