#include "spool.hpp"

#include <functional>
#include <nlohmann/json.hpp>

namespace cellgate::launcher {
namespace {

using json = nlohmann::json;

// Reads the top level's "msg_id" string and nothing else; stops past the depth limit. nlohmann's
// SAX parser keeps its own stack (no recursion on the input's depth).
class MsgIdReader : public nlohmann::json_sax<json> {
 public:
  std::string msg_id;
  bool ok = false;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t& val) override {
    if (depth_ == 1 && at_msg_id_) {
      msg_id = val;
      ok = true;
    }
    return value();
  }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    at_msg_id_ = false;
    if (++depth_ == 1) {
      if (seen_top_) {
        return false;  // one header, not two
      }
      seen_top_ = true;
    }
    return depth_ <= IopubSpool::kMaxJsonDepth;
  }
  bool key(string_t& val) override {
    at_msg_id_ = depth_ == 1 && val == "msg_id";
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    at_msg_id_ = false;
    return depth_ > 0 && ++depth_ <= IopubSpool::kMaxJsonDepth;  // the header is an object
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  bool value() {
    at_msg_id_ = false;
    return depth_ > 0;  // a bare value is no header
  }
  std::size_t depth_ = 0;
  bool seen_top_ = false;
  bool at_msg_id_ = false;
};

void put_u32(std::string& out, std::size_t n) {
  const auto v = static_cast<std::uint32_t>(n);
  for (int i = 0; i < 4; ++i) {
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

std::uint64_t hash_of(std::string_view id) {
  return std::hash<std::string_view>{}(id);
}

}  // namespace

std::string header_msg_id(std::string_view header) {
  if (header.size() > IopubSpool::kMaxHeaderBytes) {
    return {};
  }
  MsgIdReader reader;
  bool parsed = false;
  try {
    parsed = json::sax_parse(header, &reader);
  } catch (const std::exception&) {
    return {};
  }
  return parsed && reader.ok ? reader.msg_id : std::string();
}

void IopubSpool::add(std::vector<std::string> frames) {
  const std::uint64_t seq = next_seq_++;
  std::size_t cost = kEntryOverhead;
  for (const auto& f : frames) {
    cost += f.size() + kFrameOverhead;
  }
  if (frames.size() > kMaxFrames || cost > budget_) {
    ++evicted_;  // refused: counted as gone, with no msg_id to find it by
    return;
  }
  Entry entry;
  entry.seq = seq;
  entry.cost = cost;
  for (std::size_t i = 0; i + 2 < frames.size(); ++i) {
    if (frames[i] == "<IDS|MSG>") {
      entry.msg_id = header_msg_id(frames[i + 2]);
      entry.cost += entry.msg_id.size();
      break;
    }
  }
  entry.frames = std::move(frames);
  bytes_ += entry.cost;
  entries_.push_back(std::move(entry));
  while (bytes_ > budget_ && !entries_.empty()) {
    Entry& old = entries_.front();
    bytes_ -= old.cost;
    if (gone_.size() >= kEvictedKept) {
      gone_.pop_front();
    }
    gone_.push_back({hash_of(old.msg_id), old.seq});
    ++evicted_;
    entries_.pop_front();
  }
}

IopubSpool::Reply IopubSpool::after(const std::optional<std::string>& msg_id) const {
  Reply reply;
  std::size_t start = 0;
  if (msg_id && !msg_id->empty()) {
    for (std::size_t i = entries_.size(); i-- > 0;) {
      if (entries_[i].msg_id == *msg_id) {
        reply.found = true;
        start = i + 1;
        break;
      }
    }
    if (!reply.found) {
      const std::uint64_t first = entries_.empty() ? next_seq_ : entries_.front().seq;
      const std::uint64_t h = hash_of(*msg_id);
      for (auto it = gone_.rbegin(); it != gone_.rend(); ++it) {
        if (it->hash == h) {
          reply.dropped = first - it->seq - 1;
          reply.dropped_exact = true;
          break;
        }
      }
      if (!reply.dropped_exact) {
        reply.dropped = evicted_;
      }
    }
  } else {
    reply.dropped = evicted_;
  }
  for (std::size_t i = start; i < entries_.size(); ++i) {
    reply.messages.push_back(&entries_[i].frames);
    reply.bytes += 4;
    for (const auto& f : entries_[i].frames) {
      reply.bytes += 4 + f.size();
    }
  }
  return reply;
}

std::string IopubSpool::Reply::head(std::size_t budget) const {
  json j = {{"found", found},     {"count", messages.size()},       {"bytes", bytes},
            {"dropped", dropped}, {"dropped_exact", dropped_exact}, {"budget", budget}};
  return j.dump() + "\n";
}

std::string IopubSpool::Reply::body() const {
  std::string out;
  out.reserve(bytes);
  for (const auto* frames : messages) {
    put_u32(out, frames->size());
    for (const auto& f : *frames) {
      put_u32(out, f.size());
      out += f;
    }
  }
  return out;
}

}  // namespace cellgate::launcher
