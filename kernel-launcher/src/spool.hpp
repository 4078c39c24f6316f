// Internal: the launcher's spool of its kernel's iopub messages, kept while no gateway may be
// listening (docs/kernel-gateway.md, "Output while no gateway runs"). Each message is kept as the
// raw ZeroMQ frames it came in; the oldest go first past the byte budget, and what went is counted,
// with the msg_ids of the last kEvictedKept gone, so a reader asking for what came after one of
// them is told exactly how many it lost.
//
//   IopubSpool spool(8 << 20);
//   spool.add(std::move(frames));                 // each message, as received on the SUB socket
//   auto out = spool.after("2b8…_12_7");          // what came after that msg_id (or all)
//   out.write(fd);                                // the reply's wire format (below)
//
// What a kernel sends is hostile: a message of more than kMaxFrames frames, or larger than the
// budget, is dropped and counted; the header (the frame two after "<IDS|MSG>") is read for its
// msg_id only, up to kMaxHeaderBytes and kMaxJsonDepth levels, by a SAX reader (no recursion,
// no DOM); a message whose header does not say is kept with an empty msg_id (it can be replayed,
// not asked for).
//
// The reply, after a request line `{"after":"<msg_id>"}\n` (or `{}\n`: everything; with
// "head_only":true the first line alone, count 0), on the
// launcher's spool socket (launcher.hpp, --spool-socket):
//   {"found":true,"count":N,"bytes":B,"dropped":D,"dropped_exact":true,"budget":8388608}\n
//   then N messages, each: u32 frame count, then per frame u32 length and the bytes (little
//   endian). found: the msg_id is in the spool (the N messages are those after it; D is 0);
//   otherwise the N are all it holds and D how many went before them since that msg_id
//   (dropped_exact) or, when that msg_id is not known at all, since the launcher started.
//
// Thread-safety: none; the launcher's one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cellgate::launcher {

inline constexpr std::size_t kSpoolBudgetBytes = std::size_t{8} << 20;

class IopubSpool {
 public:
  static constexpr std::size_t kMaxFrames = 64;
  static constexpr std::size_t kMaxHeaderBytes = 64 << 10;
  static constexpr std::size_t kMaxJsonDepth = 256;
  static constexpr std::size_t kEvictedKept = 65536;
  // What a message costs beyond its bytes (its entry, its frames' strings).
  static constexpr std::size_t kEntryOverhead = 96;
  static constexpr std::size_t kFrameOverhead = 32;

  explicit IopubSpool(std::size_t budget_bytes) : budget_(budget_bytes) {}

  void add(std::vector<std::string> frames);

  struct Reply {
    bool found = false;
    std::uint64_t dropped = 0;
    bool dropped_exact = false;
    std::vector<const std::vector<std::string>*> messages;  // into the spool; valid until add()
    std::size_t bytes = 0;
    std::string head(std::size_t budget) const;  // the JSON line
    std::string body() const;                    // the messages' frames
  };
  // The messages after `msg_id` (nullopt: all of them).
  Reply after(const std::optional<std::string>& msg_id) const;

  std::size_t bytes() const { return bytes_; }
  std::size_t size() const { return entries_.size(); }
  std::uint64_t evicted() const { return evicted_; }

 private:
  struct Entry {
    std::uint64_t seq = 0;
    std::string msg_id;
    std::vector<std::string> frames;
    std::size_t cost = 0;
  };
  struct Evicted {
    std::uint64_t hash = 0;
    std::uint64_t seq = 0;
  };

  std::size_t budget_;
  std::deque<Entry> entries_;
  std::deque<Evicted> gone_;  // the last kEvictedKept evicted, oldest first
  std::size_t bytes_ = 0;
  std::uint64_t next_seq_ = 0;
  std::uint64_t evicted_ = 0;  // all messages dropped since the start (evicted or refused)
};

// The msg_id of a Jupyter message's header JSON, read without building a DOM; "" when the header
// is not an object with a string msg_id, is deeper than the limit, or larger than it.
std::string header_msg_id(std::string_view header);

}  // namespace cellgate::launcher
