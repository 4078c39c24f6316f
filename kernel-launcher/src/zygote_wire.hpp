// Internal: the zygote's socket protocol. One AF_UNIX SOCK_SEQPACKET connection per kernel; the
// launcher sends one request (JSON text plus file descriptors as SCM_RIGHTS), the zygote answers
// with one reply (JSON plus the new jail's pidfd) and closes. See zygote.hpp for the fields. The
// framing, limits and truncation checks are the sys floor's SeqpacketChannel
// (cellgate/sys/seqpacket.hpp), shared with the broker.
#pragma once

#include <string>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/sys/seqpacket.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::launcher::zygote_wire {

inline constexpr std::size_t kMaxMessage = 1 << 20;  // a request carries a spec and an env
inline constexpr int kMaxFds = 8;
inline constexpr sys::ChannelLimits kLimits{kMaxMessage, kMaxFds};

inline Result<void> send_message(int sock, const std::string& text, const std::vector<int>& fds) {
  auto sent = sys::send_packet(sock, text, fds, kLimits);
  if (!sent) {
    Error e = std::move(sent).error();
    e.code = e.code == ErrorCode::kInvalidArgument ? e.code : ErrorCode::kUnavailable;
    e.reason = "zygote";
    return e;
  }
  return {};
}

struct Message {
  std::string text;
  std::vector<UniqueFd> fds;
};

// Receives one message (empty at the end of the connection); the descriptors arrive
// close-on-exec. A truncated message or more descriptors than kMaxFds is an error (those that
// arrived are closed).
inline Result<Message> recv_message(int sock) {
  auto received = sys::receive_packet(sock, kLimits);
  if (!received) {
    Error e = std::move(received).error();
    e.reason = "zygote";
    return e;
  }
  Message out;
  if (*received) {
    out.text = std::move((*received)->data);
    out.fds = std::move((*received)->fds);
  }
  return out;
}

}  // namespace cellgate::launcher::zygote_wire
