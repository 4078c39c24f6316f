#include "events.hpp"

#include <algorithm>
#include <utility>

#include "outputs.hpp"

namespace cellgate::notebooks {
namespace {

using nlohmann::json;

// What a std::map node of an object member costs besides its key's and value's bytes (links,
// colour, the key's std::string).
constexpr std::size_t kMemberBytes = 64;

// event[key] when it is an object (moved out), else {}: as apply() reads data and metadata.
json take_object(json& event, const char* key) {
  auto it = event.find(key);
  return it != event.end() && it->is_object() ? std::move(*it) : json::object();
}

bool makes_output(const std::string& type) {
  return type == "stream" || type == "display_data" || type == "execute_result" || type == "error";
}

std::string mib(std::size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

}  // namespace

JsonSize json_size(const json& value) {
  JsonSize size;
  std::vector<std::pair<const json*, std::size_t>> stack{{&value, 1}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    size.bytes += sizeof(json);
    switch (v->type()) {
      case json::value_t::object:
        size.depth = std::max(size.depth, depth);
        for (auto it = v->begin(); it != v->end(); ++it) {
          size.bytes += it.key().size() + kMemberBytes;
          stack.emplace_back(&*it, depth + 1);
        }
        break;
      case json::value_t::array:
        size.depth = std::max(size.depth, depth);
        for (const auto& item : *v) {
          stack.emplace_back(&item, depth + 1);
        }
        break;
      case json::value_t::string:
        size.bytes += sizeof(std::string) + v->get_ref<const std::string&>().size();
        break;
      case json::value_t::binary:
        size.bytes += v->get_binary().size();
        break;
      default:
        break;
    }
  }
  return size;
}

void CellEvents::add(json event) {
  if (!event.is_object()) {
    return;
  }
  const std::string type = string_at(event, "type");
  const bool display =
      type == "display_data" || type == "execute_result" || type == "update_display_data";
  if (!makes_output(type) && type != "update_display_data" && type != "clear_output") {
    return;  // keepalive, notice, …: apply() makes nothing of them
  }
  const JsonSize size = json_size(event);
  if (size.depth > kMaxEventDepth) {
    ++too_deep_;
    return;
  }
  if (type == "clear_output") {
    auto wait = event.find("wait");
    if (wait != event.end() && wait->is_boolean() && wait->get<bool>()) {
      clear_pending_ = true;
      if (fits(size.bytes)) {
        events_.push_back(std::move(event));
        sizes_.push_back(size.bytes);
        bytes_ += size.bytes;
      } else {
        drop(size.bytes);
      }
    } else {
      clear_now();
    }
    return;
  }
  const std::string id = display ? tracked_display_id(event) : std::string();
  if (type == "update_display_data") {
    if (id.empty()) {
      return;  // updates nothing in apply()
    }
    auto shown = last_shown_.find(id);
    if (shown == last_shown_.end()) {
      // It may update an earlier cell's display: kept; later updates fold into it.
      if (!fits(size.bytes)) {
        drop(size.bytes);
        return;
      }
      last_shown_[id] = events_.size();
      events_.push_back(std::move(event));
      sizes_.push_back(size.bytes);
      bytes_ += size.bytes;
      return;
    }
    const std::size_t at = shown->second;
    if (!fits(size.bytes, sizes_[at])) {
      drop(size.bytes);
      return;
    }
    json& earlier = events_[at];
    earlier["data"] = take_object(event, "data");
    earlier["metadata"] = take_object(event, "metadata");
    bytes_ = bytes_ - sizes_[at] + size.bytes;
    sizes_[at] = size.bytes;
    return;
  }
  // An output: a pending clear happens first, as in apply().
  if (clear_pending_) {
    clear_now();
  }
  if (type == "stream") {
    json stream = {{"type", "stream"},
                   {"name", string_at(event, "name") == "stderr" ? "stderr" : "stdout"},
                   {"text", string_at(event, "text")}};
    const std::string& text = stream["text"].get_ref<const std::string&>();
    if (!events_.empty() && events_.back().value("type", "") == "stream" &&
        events_.back()["name"] == stream["name"]) {
      if (!fits(text.size())) {
        drop(text.size());
        return;
      }
      events_.back()["text"].get_ref<std::string&>() += text;
      sizes_.back() += text.size();
      bytes_ += text.size();
      return;
    }
    event = std::move(stream);
  }
  if (!fits(size.bytes)) {
    drop(size.bytes);
    return;
  }
  if (!id.empty()) {
    last_shown_[id] = events_.size();
  }
  events_.push_back(std::move(event));
  sizes_.push_back(size.bytes);
  bytes_ += size.bytes;
}

// The outputs made so far are gone; what the events did to earlier cells' displays is one
// update per display id, with its last data and metadata.
void CellEvents::clear_now() {
  std::vector<json> kept;
  std::vector<std::size_t> sizes;
  std::map<std::string, std::size_t> shown;
  for (const auto& [id, at] : last_shown_) {
    json& last = events_[at];
    shown[id] = kept.size();
    kept.push_back(json{{"type", "update_display_data"},
                        {"display_id", id},
                        {"data", take_object(last, "data")},
                        {"metadata", take_object(last, "metadata")}});
    sizes.push_back(sizes_[at]);
  }
  events_ = std::move(kept);
  sizes_ = std::move(sizes);
  last_shown_ = std::move(shown);
  bytes_ = 0;
  for (std::size_t s : sizes_) {
    bytes_ += s;
  }
  clear_pending_ = false;
}

std::vector<std::string> CellEvents::notices() const {
  std::vector<std::string> said;
  if (dropped_ > 0) {
    said.push_back("the cell's outputs are over the limit of " + mib(max_bytes_) +
                   " per cell: " + std::to_string(dropped_) + " of its events (" +
                   std::to_string(dropped_bytes_) + " bytes) were dropped");
  }
  if (too_deep_ > 0) {
    said.push_back(std::to_string(too_deep_) + " of the cell's outputs nest deeper than " +
                   std::to_string(kMaxEventDepth) + " levels and were dropped");
  }
  return said;
}

json CellEvents::take() {
  const std::vector<std::string> said = notices();
  if (!said.empty() && clear_pending_) {
    // The note would set off the pending clear, which no output of the cell did: the
    // clear_output(wait=True) events after the last output go (alone they do nothing).
    std::size_t after = events_.size();
    while (after > 0 && !makes_output(events_[after - 1].value("type", ""))) {
      --after;
    }
    events_.erase(
        std::remove_if(events_.begin() + static_cast<std::ptrdiff_t>(after), events_.end(),
                       [](const json& e) { return e.value("type", "") == "clear_output"; }),
        events_.end());
  }
  json out = json::array();
  for (auto& event : events_) {
    out.push_back(std::move(event));
  }
  for (const auto& line : said) {
    out.push_back(
        json{{"type", "stream"}, {"name", "stderr"}, {"text", "[cellgate run: " + line + "]\n"}});
  }
  events_.clear();
  sizes_.clear();
  last_shown_.clear();
  bytes_ = 0;
  clear_pending_ = false;
  return out;
}

void CellEvents::finish(CellAnswer& answer) {
  const std::vector<std::string> said = notices();
  answer.events = take();
  auto& notices = answer.result.notices;
  notices.insert(notices.end(), said.begin(), said.end());
}

}  // namespace cellgate::notebooks
