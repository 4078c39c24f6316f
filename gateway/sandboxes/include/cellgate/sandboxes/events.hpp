// EventLog: E2B's lifecycle events API (`GET /events/sandboxes`, `GET /events/sandboxes/{id}`):
// every lifecycle event of the control plane's sandboxes (created, paused, resumed, snapshotted,
// killed) as the webhooks send it (webhooks.hpp), kept for `retention` (7 days, as E2B) and at
// most `max_events` (the oldest go first), each visible to its tenant only (the operator's token
// sees all).
//
//   EventLog log({.file = state_dir + "/sandboxes/events.ndjson"});
//   log.add("alice", Webhooks::event("created", sandbox));
//   json page = log.query(caller, {.sandbox_id = id, .limit = 10}, now);   // newest first
//
// The file holds one event a line ({"tenant", "event"}), appended as events happen and rewritten
// (atomically) with only the kept ones when it holds twice as many lines as are kept, so a
// restarted gateway answers for the sandboxes of the gateway before it. A damaged line is
// skipped; the file is read up to `max_file_bytes`.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"
#include "cellgate/sandboxes/model.hpp"

namespace cellgate::sandboxes {

struct EventLogOptions {
  std::string file;  // "" : memory only
  std::size_t max_events = 10000;
  std::chrono::hours retention{24 * 7};
  std::size_t max_file_bytes = 64u << 20;
};

struct EventQuery {
  std::string sandbox_id;  // "" : every sandbox the caller sees
  std::size_t offset = 0;
  std::size_t limit = 10;       // 1..100
  bool ascending = false;       // E2B's orderAsc; newest first by default
  std::set<std::string> types;  // "sandbox.lifecycle.killed" …; empty: all
};

// The query of E2B's events routes, from the raw request target (`types` may come more than
// once, or comma-separated): offset, limit (1-100, 10 by default), orderAsc. kInvalidArgument
// "bad_query" names the bad one (model.cpp, beside the other query parsers).
Result<EventQuery> parse_event_query(std::string_view target);

class EventLog {
 public:
  explicit EventLog(EventLogOptions options);
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // `event` must carry "sandboxId", "type" and "timestamp" (Webhooks::event makes it so).
  void add(const std::string& tenant, nlohmann::json event);
  // A JSON array of the caller's events that match, in the asked order, the page asked for.
  nlohmann::json query(const Caller& caller, const EventQuery& q, SystemTime now) const;
  std::size_t size() const;

 private:
  struct Stored {
    std::string tenant;
    SystemTime at;
    nlohmann::json event;
  };
  void load();
  void prune_locked(SystemTime now) CELLGATE_REQUIRES(mu_);
  void rewrite_locked() CELLGATE_REQUIRES(mu_);

  const EventLogOptions options_;
  mutable Mutex mu_;
  std::deque<Stored> events_ CELLGATE_GUARDED_BY(mu_);  // oldest first
  std::size_t file_lines_ CELLGATE_GUARDED_BY(mu_) = 0;
};

}  // namespace cellgate::sandboxes
