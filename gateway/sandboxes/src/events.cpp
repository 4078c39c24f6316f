#include "cellgate/sandboxes/events.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "cellgate/sys/file.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::sandboxes {
namespace {

using nlohmann::json;

std::string line_of(const std::string& tenant, const json& event) {
  return json{{"tenant", tenant}, {"event", event}}.dump(-1, ' ', false,
                                                         json::error_handler_t::replace) +
         "\n";
}

}  // namespace

EventLog::EventLog(EventLogOptions options) : options_(std::move(options)) {
  load();
}

void EventLog::load() {
  if (options_.file.empty()) {
    return;
  }
  auto text = sys::read_optional(options_.file, options_.max_file_bytes, "events_file");
  if (!text || !*text) {
    if (!text) {
      spdlog::warn("sandbox events: {}; starting without the earlier ones", text.error().message);
    }
    return;
  }
  MutexLock lock(mu_);
  std::istringstream in(**text);
  std::size_t skipped = 0;
  for (std::string line; std::getline(in, line);) {
    ++file_lines_;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const json* event = j.is_object() && j.contains("event") ? &j["event"] : nullptr;
    const bool ok = event != nullptr && j.contains("tenant") && j["tenant"].is_string() &&
                    event->is_object() && event->contains("timestamp") &&
                    (*event)["timestamp"].is_string() && event->contains("sandboxId") &&
                    (*event)["sandboxId"].is_string() && event->contains("type") &&
                    (*event)["type"].is_string();
    std::optional<SystemTime> at;
    if (ok) {
      at = parse_iso8601((*event)["timestamp"].get<std::string>());
    }
    if (!at) {
      ++skipped;  // damaged, or cut short by a crash mid-append
      continue;
    }
    events_.push_back(Stored{j["tenant"].get<std::string>(), *at, *event});
  }
  if (skipped > 0) {
    spdlog::warn("sandbox events: {} line(s) of {} were not events; skipped", skipped,
                 options_.file);
  }
  prune_locked(std::chrono::system_clock::now());
  if ((*text)->back() != '\n') {
    rewrite_locked();  // a line cut short by a crash: the next append must not join it
  }
}

void EventLog::prune_locked(SystemTime now) {
  while (!events_.empty() &&
         (events_.size() > options_.max_events || events_.front().at + options_.retention < now)) {
    events_.pop_front();
  }
}

void EventLog::rewrite_locked() {
  std::string all;
  for (const auto& e : events_) {
    all += line_of(e.tenant, e.event);
  }
  if (auto written =
          sys::atomic_write(options_.file, all, 0600, sys::Durability::kNone, "events_file");
      !written) {
    spdlog::warn("sandbox events: {}", written.error().message);
    return;
  }
  file_lines_ = events_.size();
}

void EventLog::add(const std::string& tenant, json event) {
  const auto at = parse_iso8601(event.value("timestamp", std::string()))
                      .value_or(std::chrono::system_clock::now());
  const std::string line = options_.file.empty() ? "" : line_of(tenant, event);
  MutexLock lock(mu_);
  events_.push_back(Stored{tenant, at, std::move(event)});
  prune_locked(std::chrono::system_clock::now());
  if (options_.file.empty()) {
    return;
  }
  if (file_lines_ + 1 > 2 * std::max<std::size_t>(1, options_.max_events)) {
    rewrite_locked();
    return;
  }
  // One write of a whole line with O_APPEND: a reader (the next gateway) sees whole lines, but
  // for the last one of a crash, which it skips.
  UniqueFd fd(
      ::open(options_.file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd || ::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    spdlog::warn("sandbox events: cannot append to {}: {}", options_.file, std::strerror(errno));
    return;
  }
  ++file_lines_;
}

json EventLog::query(const Caller& caller, const EventQuery& q, SystemTime now) const {
  MutexLock lock(mu_);
  std::vector<const Stored*> matched;
  for (const auto& e : events_) {
    if (e.at + options_.retention < now || !caller.can_see(e.tenant)) {
      continue;
    }
    if (!q.sandbox_id.empty() && e.event.value("sandboxId", std::string()) != q.sandbox_id) {
      continue;
    }
    if (!q.types.empty() && q.types.count(e.event.value("type", std::string())) == 0) {
      continue;
    }
    matched.push_back(&e);
  }
  if (!q.ascending) {
    std::reverse(matched.begin(), matched.end());
  }
  json page = json::array();
  for (std::size_t i = q.offset; i < matched.size() && page.size() < q.limit; ++i) {
    page.push_back(matched[i]->event);
  }
  return page;
}

std::size_t EventLog::size() const {
  MutexLock lock(mu_);
  return events_.size();
}

}  // namespace cellgate::sandboxes
