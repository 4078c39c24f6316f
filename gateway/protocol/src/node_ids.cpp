#include "cellgate/protocol/node_ids.hpp"

#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>

#include "cellgate/protocol/message.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::protocol {
namespace {

// tag << 16 | epoch, with bit 32 set once set_node() ran.
std::atomic<std::uint64_t> g_stamp{0};
constexpr std::uint64_t kSet = std::uint64_t{1} << 32;

}  // namespace

std::string NodeStamp::prefix() const {
  return fmt::format("{:04x}{:04x}", tag, epoch);
}

void set_node(std::uint16_t tag, std::uint16_t epoch) {
  g_stamp.store(kSet | (std::uint64_t{tag} << 16) | epoch);
}

std::optional<NodeStamp> node() {
  const std::uint64_t s = g_stamp.load();
  if ((s & kSet) == 0) {
    return std::nullopt;
  }
  return NodeStamp{static_cast<std::uint16_t>(s >> 16), static_cast<std::uint16_t>(s & 0xffff)};
}

std::string new_node_id() {
  std::string id = new_uuid();  // 8-4-4-4-12, version 4
  if (auto stamp = node(); stamp && id.size() == 36) {
    id.replace(0, 8, stamp->prefix());
  }
  return id;
}

std::string new_node_hex_id() {
  std::string id = new_node_id();
  std::string hex;
  hex.reserve(32);
  for (char c : id) {
    if (c != '-') {
      hex.push_back(c);
    }
  }
  return hex;
}

std::optional<NodeStamp> stamp_of(std::string_view id) {
  if (id.size() < 8) {
    return std::nullopt;
  }
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    const int d = hex_value(id[i]);
    if (d < 0) {
      return std::nullopt;
    }
    v = (v << 4) | static_cast<std::uint32_t>(d);
  }
  return NodeStamp{static_cast<std::uint16_t>(v >> 16), static_cast<std::uint16_t>(v & 0xffff)};
}

bool from_lost_boot(std::string_view id) {
  const auto self = node();
  const auto stamp = stamp_of(id);
  return self && stamp && stamp->tag == self->tag && stamp->epoch != self->epoch;
}

namespace {

constexpr std::size_t kMovedKept = 4096;

struct Moved {
  std::mutex mu;
  std::map<std::string, std::string, std::less<>> where;
  std::deque<std::string> order;  // oldest first, for the bound
};

Moved& moved() {
  static Moved m;
  return m;
}

}  // namespace

void note_moved(const std::string& id, const std::string& where) {
  Moved& m = moved();
  std::lock_guard lock(m.mu);
  if (m.where.insert_or_assign(id, where).second) {
    m.order.push_back(id);
  }
  while (m.order.size() > kMovedKept) {
    m.where.erase(m.order.front());
    m.order.pop_front();
  }
}

Error unknown_id(std::string_view id, Error not_found) {
  {
    Moved& m = moved();
    std::lock_guard lock(m.mu);
    if (auto it = m.where.find(id); it != m.where.end()) {
      return make_error(ErrorCode::kUnavailable, "kernel_moved",
                        fmt::format("{} moved from this node to {}: the router sends it there "
                                    "once told (cellgate drain --move --router …); try again",
                                    id, it->second));
    }
  }
  if (!from_lost_boot(id)) {
    return not_found;
  }
  return make_error(ErrorCode::kNotFound, "node-restarted",
                    fmt::format("{} was made by an earlier run of this node (epoch {}), which "
                                "restarted since: it is gone. Start a new one.",
                                id, id.substr(4, 4)));
}

}  // namespace cellgate::protocol
