// E2B's sandbox record and the control plane's JSON, as pure functions: request bodies in,
// E2B's shapes out, and the list's filters and pages. docs/e2b.md ("The control plane") says what
// E2B's SDK sends and reads; the routes are in control_plane.hpp, the live sandboxes in
// registry.hpp.
//
//   auto req = sandboxes::parse_create_request(body);          // Result<CreateRequest>
//   auto query = sandboxes::parse_list_query(target.query);    // Result<ListQuery>
//   auto page = sandboxes::list_page(all, *query);             // the items, X-Next-Token
//   json j = sandboxes::listed_json(sandbox, shape);
//
// Every parse error is kInvalidArgument (400), its message for the SDK's user.
//
// Thread-safety: values and pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::sandboxes {

using SystemTime = std::chrono::system_clock::time_point;

// E2B's `base` template: the default kernelspec here.
inline constexpr std::string_view kBaseTemplate = "base";
// @e2b/code-interpreter's default template: the default kernelspec too (a python one).
inline constexpr std::string_view kCodeInterpreterTemplate = "code-interpreter-v1";
// The envd version sandboxes report: every feature of the SDK switched on (envd/versions.ts).
inline constexpr std::string_view kEnvdVersion = "0.6.4";
inline constexpr int kDefaultTimeoutSeconds = 300;  // E2B's default
inline constexpr std::size_t kMaxListLimit = 100;
inline constexpr std::size_t kMaxMetadataEntries = 64;
inline constexpr std::size_t kMaxMetadataBytes = 16u << 10;  // keys and values together
inline constexpr int kMaxForks = 16;                         // KernelRegistry::fork's limit

enum class State { kRunning, kPaused };
enum class OnTimeout { kKill, kPause };
std::string_view to_string(State state);

// Who asks: a tenant (its key), or the operator (the gateway's --token), who sees everything.
struct Caller {
  std::string tenant;  // "" for the operator
  bool sees_all = false;
  bool can_see(const std::string& owner) const { return sees_all || owner == tenant; }
};

// One sandbox: a jailed kernel and E2B's record of it.
struct Sandbox {
  std::string id;           // 20 lowercase hex digits
  std::string template_id;  // as created: "base", a kernelspec, or a snapshot id
  std::string alias;        // the kernelspec it runs ("" when it is the template id)
  std::string tenant;       // "" : the operator's
  std::string kernel_id;
  std::string envd_access_token;     // "" unless created `secure`
  std::string traffic_access_token;  // "" unless created `secure`
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> env_vars;
  SystemTime started_at{};
  SystemTime end_at{};
  State state = State::kRunning;
  OnTimeout on_timeout = OnTimeout::kKill;
  bool auto_resume = false;
  std::uint64_t seq = 0;  // creation order: lists and their tokens
  // A record on disk (records survive a gateway restart with the kernels they name).
  nlohmann::json to_record() const;
  static Result<Sandbox> from_record(const nlohmann::json& record);
};

// What a sandbox looks like to the SDK beyond its record: the jail's limits, the domain.
struct Shape {
  int cpu_count = 1;
  int memory_mb = 1024;
  int disk_mb = 512;
  std::string domain;  // "" : none sent (the SDK uses E2B_DOMAIN / E2B_SANDBOX_URL)
};

// POST /sandboxes, /v2/sandboxes: E2B's NewSandbox (unknown fields ignored).
struct CreateRequest {
  std::string template_id = std::string(kBaseTemplate);
  int timeout_seconds = kDefaultTimeoutSeconds;
  bool secure = true;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> env_vars;
  bool auto_pause = false;
  bool auto_resume = false;
};
Result<CreateRequest> parse_create_request(std::string_view body);
// {timeout: s} of /timeout and /connect; `fallback` when absent. 0..86400 s.
Result<int> parse_timeout(const nlohmann::json& body, int fallback);
// POST /sandboxes/{id}/fork: {timeout?, count?} (count 1..16).
struct ForkRequest {
  int timeout_seconds = kDefaultTimeoutSeconds;
  int count = 1;
};
Result<ForkRequest> parse_fork_request(std::string_view body);

// GET /v2/sandboxes's query.
struct ListQuery {
  std::map<std::string, std::string> metadata;  // every pair must match
  std::set<State> states;                       // empty: all
  std::optional<SystemTime> started_after;      // inclusive
  std::string template_filter;                  // a template id or alias; "": all
  bool ascending = false;                       // E2B's default: newest first
  std::size_t limit = kMaxListLimit;
  std::optional<std::uint64_t> after;  // nextToken: the seq of the previous page's last item
};
Result<ListQuery> parse_list_query(const std::map<std::string, std::string>& query);
struct Page {
  std::vector<Sandbox> items;
  std::string next_token;  // "" on the last page
};
// The page of `all` the query asks for (all: any order).
Page list_page(std::vector<Sandbox> all, const ListQuery& query);
// `?limit=&nextToken=` of the lists with plain seq tokens (GET /snapshots).
Result<std::size_t> parse_limit(const std::map<std::string, std::string>& query);

// Time as E2B writes it (ISO 8601 UTC) and reads it (also without fraction).
std::string iso8601(SystemTime t);
std::optional<SystemTime> parse_iso8601(std::string_view text);

// The shapes the SDK reads (docs/e2b.md, "The control plane").
nlohmann::json sandbox_json(const Sandbox& s, const Shape& shape);  // create, connect, fork
nlohmann::json listed_json(const Sandbox& s, const Shape& shape);   // GET /v2/sandboxes
nlohmann::json detail_json(const Sandbox& s, const Shape& shape);   // GET /sandboxes/{id}

// E2B's error body {"code": <status>, "message"}, with cellgate's "error" (the reason) and
// "reason" (the status phrase) beside them.
nlohmann::json error_json(int status, const std::string& message, const std::string& reason);

}  // namespace cellgate::sandboxes
