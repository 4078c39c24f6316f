// The gateway's side of the launcher's iopub spool (kernel-launcher/src/spool.hpp): what a
// kernel published while no gateway listened, asked of its launcher on the unix socket in the
// kernel's runtime dir. One request per connection, bounded in time and size.
//
//   auto got = fetch_spool(process->spool_socket(), last_delivered_msg_id, 5s);
//   for (auto& frames : got->messages) { Envelope::from_wire(kIopub, views(frames), signer); }
//   if (!got->found && got->dropped > 0) { … tell the client what was lost … }
//
// Thread-safety: a free function; blocking.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::kernel {

struct SpooledIopub {
  // `after` was in the spool: `messages` are those after it, nothing lost between. Otherwise
  // `messages` are all it kept and `dropped` how many went before them since `after`
  // (dropped_exact) or at most that many (the launcher no longer knows `after`).
  bool found = false;
  std::uint64_t dropped = 0;
  bool dropped_exact = false;
  std::vector<std::vector<std::string>> messages;  // each one's ZeroMQ frames, as sent
};

// The reply is at most the launcher's budget (8 MiB) and its framing; anything larger, a
// message of more than kMaxSpoolFrames frames or a reply past `timeout` is refused
// (kUnavailable), as is a launcher without a spool socket.
inline constexpr std::size_t kMaxSpoolReplyBytes = std::size_t{16} << 20;
inline constexpr std::size_t kMaxSpoolFrames = 64;
// `head_only`: found and dropped, no messages.
Result<SpooledIopub> fetch_spool(const std::string& socket_path, const std::string& after,
                                 std::chrono::milliseconds timeout, bool head_only = false);

// Holds the spool (`hold` true: the launcher closes its SUB socket on the kernel's iopub, so a
// checkpoint finds no unix stream leading out of the jail) or lets it go on (false). Answers
// whether it is held now; kUnavailable when the launcher has no spool or did not answer in time.
Result<bool> hold_spool(const std::string& socket_path, bool hold,
                        std::chrono::milliseconds timeout);

}  // namespace cellgate::kernel
