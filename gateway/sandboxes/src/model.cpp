#include "cellgate/sandboxes/model.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>

#include "cellgate/http/limits.hpp"
#include "cellgate/http/router.hpp"
#include "cellgate/sandboxes/events.hpp"

namespace cellgate::sandboxes {
namespace {

using nlohmann::json;

constexpr int kMaxTimeoutSeconds = 86400;  // E2B's longest (Pro)

Error invalid(std::string reason, std::string message) {
  return make_error(ErrorCode::kInvalidArgument, std::move(reason), std::move(message));
}

Result<json> parse_body(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return json::object();
  }
  if (auto shallow = http::check_json_depth(body); !shallow) {
    return invalid("bad_json", shallow.error().message);
  }
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return invalid("bad_json", "the request body must be a JSON object");
  }
  return parsed;
}

// {str: str} of metadata and envVars; null or absent: empty.
Result<std::map<std::string, std::string>> string_map(const json& body, const char* field) {
  std::map<std::string, std::string> out;
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    return out;
  }
  if (!it->is_object()) {
    return invalid("bad_" + std::string(field), std::string(field) + " must be an object");
  }
  std::size_t bytes = 0;
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string()) {
      return invalid("bad_" + std::string(field),
                     std::string(field) + "." + k.substr(0, 64) + " must be a string");
    }
    bytes += k.size() + v.get_ref<const std::string&>().size();
    if (out.size() >= kMaxMetadataEntries || bytes > kMaxMetadataBytes) {
      return invalid("bad_" + std::string(field),
                     std::string(field) + " is larger than " + std::to_string(kMaxMetadataEntries) +
                         " entries or " + std::to_string(kMaxMetadataBytes) + " bytes");
    }
    out[k] = v.get<std::string>();
  }
  return out;
}

Result<bool> flag(const json& body, const char* field, bool fallback) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    return fallback;
  }
  if (!it->is_boolean()) {
    return invalid("bad_" + std::string(field), std::string(field) + " must be true or false");
  }
  return it->get<bool>();
}

Result<std::uint64_t> parse_u64(std::string_view text, const char* what) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    return invalid("bad_query", std::string(what) + " must be a non-negative integer");
  }
  return v;
}

}  // namespace

std::string_view to_string(State state) {
  return state == State::kPaused ? "paused" : "running";
}

json Sandbox::to_record() const {
  auto secs = [](SystemTime t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  };
  return json{{"id", id},
              {"template_id", template_id},
              {"alias", alias},
              {"tenant", tenant},
              {"kernel_id", kernel_id},
              {"envd_access_token", envd_access_token},
              {"traffic_access_token", traffic_access_token},
              {"metadata", metadata},
              {"env_vars", env_vars},
              {"started_at_ms", secs(started_at)},
              {"end_at_ms", secs(end_at)},
              {"on_timeout", on_timeout == OnTimeout::kPause ? "pause" : "kill"},
              {"auto_resume", auto_resume},
              {"seq", seq}};
}

Result<Sandbox> Sandbox::from_record(const json& r) {
  try {
    Sandbox s;
    s.id = r.at("id").get<std::string>();
    s.template_id = r.at("template_id").get<std::string>();
    s.alias = r.value("alias", "");
    s.tenant = r.at("tenant").get<std::string>();
    s.kernel_id = r.at("kernel_id").get<std::string>();
    s.envd_access_token = r.value("envd_access_token", "");
    s.traffic_access_token = r.value("traffic_access_token", "");
    s.metadata = r.value("metadata", std::map<std::string, std::string>{});
    s.env_vars = r.value("env_vars", std::map<std::string, std::string>{});
    s.started_at = SystemTime(std::chrono::milliseconds(r.at("started_at_ms").get<std::int64_t>()));
    s.end_at = SystemTime(std::chrono::milliseconds(r.at("end_at_ms").get<std::int64_t>()));
    s.on_timeout = r.value("on_timeout", "kill") == "pause" ? OnTimeout::kPause : OnTimeout::kKill;
    s.auto_resume = r.value("auto_resume", false);
    s.seq = r.value("seq", std::uint64_t{0});
    return s;
  } catch (const json::exception& e) {
    return invalid("bad_record", std::string("a sandbox record is damaged: ") + e.what());
  }
}

Result<CreateRequest> parse_create_request(std::string_view body) {
  CELLGATE_ASSIGN_OR_RETURN(json b, parse_body(body));
  CreateRequest req;
  if (auto it = b.find("templateID"); it != b.end() && !it->is_null()) {
    if (!it->is_string() || it->get_ref<const std::string&>().empty() ||
        it->get_ref<const std::string&>().size() > 256) {
      return invalid("bad_template", "templateID must be a non-empty string");
    }
    req.template_id = it->get<std::string>();
  }
  CELLGATE_ASSIGN_OR_RETURN(req.timeout_seconds, parse_timeout(b, kDefaultTimeoutSeconds));
  CELLGATE_ASSIGN_OR_RETURN(req.secure, flag(b, "secure", true));
  CELLGATE_ASSIGN_OR_RETURN(req.metadata, string_map(b, "metadata"));
  CELLGATE_ASSIGN_OR_RETURN(req.env_vars, string_map(b, "envVars"));
  for (const auto& [name, value] : req.env_vars) {
    if (name.empty() || name.find_first_of("=\0", 0, 2) != std::string::npos ||
        value.find('\0') != std::string::npos) {
      return invalid("bad_envVars",
                     "envVars: '" + name.substr(0, 64) + "' is not a name an environment can hold");
    }
  }
  CELLGATE_ASSIGN_OR_RETURN(req.auto_pause, flag(b, "autoPause", false));
  if (auto it = b.find("autoResume"); it != b.end() && it->is_object()) {
    CELLGATE_ASSIGN_OR_RETURN(req.auto_resume, flag(*it, "enabled", false));
  }
  if (auto it = b.find("autoPauseMemory"); it != b.end() && it->is_boolean() && !it->get<bool>()) {
    return invalid("unsupported",
                   "autoPauseMemory: false (a filesystem-only pause) is not "
                   "supported here: a pause keeps the sandbox's memory");
  }
  if (auto it = b.find("mcp"); it != b.end() && !it->is_null()) {
    return invalid("unsupported",
                   "mcp: the MCP gateway of E2B's templates is not available "
                   "here; cellgate serves MCP at /mcp on its main port");
  }
  return req;
}

Result<int> parse_timeout(const json& body, int fallback) {
  auto it = body.find("timeout");
  if (it == body.end() || it->is_null()) {
    return fallback;
  }
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    return invalid("bad_timeout", "timeout must be a whole number of seconds");
  }
  const auto v = it->get<std::int64_t>();
  if (v < 0 || v > kMaxTimeoutSeconds) {
    return invalid("bad_timeout",
                   "timeout must be 0 to " + std::to_string(kMaxTimeoutSeconds) + " seconds");
  }
  return static_cast<int>(v);
}

Result<ForkRequest> parse_fork_request(std::string_view body) {
  CELLGATE_ASSIGN_OR_RETURN(json b, parse_body(body));
  ForkRequest req;
  CELLGATE_ASSIGN_OR_RETURN(req.timeout_seconds, parse_timeout(b, kDefaultTimeoutSeconds));
  if (auto it = b.find("count"); it != b.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 1 ||
        it->get<std::int64_t>() > kMaxForks) {
      return invalid("bad_count", "count must be 1 to " + std::to_string(kMaxForks));
    }
    req.count = it->get<int>();
  }
  return req;
}

Result<std::size_t> parse_limit(const std::map<std::string, std::string>& query) {
  auto it = query.find("limit");
  if (it == query.end() || it->second.empty()) {
    return kMaxListLimit;
  }
  CELLGATE_ASSIGN_OR_RETURN(auto v, parse_u64(it->second, "limit"));
  if (v < 1 || v > kMaxListLimit) {
    return invalid("bad_query", "limit must be 1 to " + std::to_string(kMaxListLimit));
  }
  return static_cast<std::size_t>(v);
}

Result<ListQuery> parse_list_query(const std::map<std::string, std::string>& query) {
  ListQuery q;
  if (auto it = query.find("metadata"); it != query.end() && !it->second.empty()) {
    // "k=v&k2=v2", each key and value URI-encoded (the SDK's URLSearchParams of encoded pairs).
    std::string_view rest = it->second;
    while (!rest.empty()) {
      const auto amp = rest.find('&');
      const std::string_view pair = rest.substr(0, amp);
      rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
      if (pair.empty()) {
        continue;
      }
      const auto eq = pair.find('=');
      const std::string key = http::percent_decode(pair.substr(0, eq), true);
      const std::string value =
          eq == std::string_view::npos ? "" : http::percent_decode(pair.substr(eq + 1), true);
      q.metadata[http::percent_decode(key, false)] = http::percent_decode(value, false);
      if (q.metadata.size() > kMaxMetadataEntries) {
        return invalid("bad_query", "metadata: too many pairs");
      }
    }
  }
  if (auto it = query.find("state"); it != query.end() && !it->second.empty()) {
    std::string_view rest = it->second;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const std::string_view one = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      if (one == "running") {
        q.states.insert(State::kRunning);
      } else if (one == "paused") {
        q.states.insert(State::kPaused);
      } else if (!one.empty()) {
        return invalid("bad_query", "state must be running and/or paused");
      }
    }
  }
  if (auto it = query.find("startedAfter"); it != query.end() && !it->second.empty()) {
    q.started_after = parse_iso8601(it->second);
    if (!q.started_after) {
      return invalid("bad_query", "startedAfter must be an ISO 8601 time");
    }
  }
  if (auto it = query.find("template"); it != query.end()) {
    q.template_filter = it->second;
  }
  if (auto it = query.find("order"); it != query.end() && !it->second.empty()) {
    if (it->second != "asc" && it->second != "desc") {
      return invalid("bad_query", "order must be asc or desc");
    }
    q.ascending = it->second == "asc";
  }
  CELLGATE_ASSIGN_OR_RETURN(q.limit, parse_limit(query));
  if (auto it = query.find("nextToken"); it != query.end() && !it->second.empty()) {
    CELLGATE_ASSIGN_OR_RETURN(q.after, parse_u64(it->second, "nextToken"));
  }
  return q;
}

Page list_page(std::vector<Sandbox> all, const ListQuery& q) {
  std::erase_if(all, [&](const Sandbox& s) {
    if (!q.states.empty() && q.states.count(s.state) == 0) {
      return true;
    }
    if (q.started_after && s.started_at < *q.started_after) {
      return true;
    }
    if (!q.template_filter.empty() && q.template_filter != s.template_id &&
        q.template_filter != s.alias) {
      return true;
    }
    for (const auto& [k, v] : q.metadata) {
      auto it = s.metadata.find(k);
      if (it == s.metadata.end() || it->second != v) {
        return true;
      }
    }
    if (q.after) {
      return q.ascending ? s.seq <= *q.after : s.seq >= *q.after;
    }
    return false;
  });
  std::sort(all.begin(), all.end(), [&](const Sandbox& a, const Sandbox& b) {
    return q.ascending ? a.seq < b.seq : a.seq > b.seq;
  });
  Page page;
  if (all.size() > q.limit) {
    all.resize(q.limit);
    page.next_token = std::to_string(all.back().seq);
  }
  page.items = std::move(all);
  return page;
}

std::string iso8601(SystemTime t) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

std::optional<SystemTime> parse_iso8601(std::string_view text) {
  // YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)
  if (text.size() < 19 || text.size() > 40) {
    return std::nullopt;
  }
  std::tm tm{};
  int fields[6] = {};
  const int pos[6] = {0, 5, 8, 11, 14, 17};
  const int len[6] = {4, 2, 2, 2, 2, 2};
  for (int i = 0; i < 6; ++i) {
    const char* b = text.data() + pos[i];
    auto [end, ec] = std::from_chars(b, b + len[i], fields[i]);
    if (ec != std::errc() || end != b + len[i]) {
      return std::nullopt;
    }
  }
  if (text[4] != '-' || text[7] != '-' || (text[10] != 'T' && text[10] != ' ') || text[13] != ':' ||
      text[16] != ':') {
    return std::nullopt;
  }
  tm.tm_year = fields[0] - 1900;
  tm.tm_mon = fields[1] - 1;
  tm.tm_mday = fields[2];
  tm.tm_hour = fields[3];
  tm.tm_min = fields[4];
  tm.tm_sec = fields[5];
  std::string_view rest = text.substr(19);
  std::int64_t ms = 0;
  if (!rest.empty() && rest[0] == '.') {
    std::size_t i = 1;
    int scale = 100;
    for (; i < rest.size() && rest[i] >= '0' && rest[i] <= '9'; ++i) {
      ms += (rest[i] - '0') * scale;
      scale /= 10;
    }
    rest = rest.substr(i);
  }
  if (rest != "Z" && rest != "+00:00" && !rest.empty()) {
    return std::nullopt;
  }
  const std::time_t secs = ::timegm(&tm);
  if (secs == static_cast<std::time_t>(-1)) {
    return std::nullopt;
  }
  return std::chrono::system_clock::from_time_t(secs) + std::chrono::milliseconds(ms);
}

json sandbox_json(const Sandbox& s, const Shape& shape) {
  json j{{"sandboxID", s.id},
         {"templateID", s.template_id},
         {"clientID", s.tenant.empty() ? "operator" : s.tenant},
         {"envdVersion", kEnvdVersion}};
  if (!s.alias.empty()) {
    j["alias"] = s.alias;
  }
  if (!s.envd_access_token.empty()) {
    j["envdAccessToken"] = s.envd_access_token;
  }
  if (!s.traffic_access_token.empty()) {
    j["trafficAccessToken"] = s.traffic_access_token;
  }
  if (!shape.domain.empty()) {
    j["domain"] = shape.domain;
  }
  return j;
}

json listed_json(const Sandbox& s, const Shape& shape) {
  json j{{"sandboxID", s.id},
         {"templateID", s.template_id},
         {"clientID", s.tenant.empty() ? "operator" : s.tenant},
         {"cpuCount", shape.cpu_count},
         {"memoryMB", shape.memory_mb},
         {"diskSizeMB", shape.disk_mb},
         {"envdVersion", kEnvdVersion},
         {"metadata", s.metadata},
         {"startedAt", iso8601(s.started_at)},
         {"endAt", iso8601(s.end_at)},
         {"state", to_string(s.state)},
         {"volumeMounts", json::array()}};
  if (!s.alias.empty()) {
    j["alias"] = s.alias;
  }
  return j;
}

json detail_json(const Sandbox& s, const Shape& shape) {
  json j = listed_json(s, shape);
  if (!shape.domain.empty()) {
    j["domain"] = shape.domain;
  }
  if (!s.envd_access_token.empty()) {
    j["envdAccessToken"] = s.envd_access_token;
  }
  j["allowInternetAccess"] = false;  // the jail has no network
  j["lifecycle"] = {{"onTimeout", s.on_timeout == OnTimeout::kPause ? "pause" : "kill"},
                    {"autoResume", s.auto_resume}};
  return j;
}

json error_json(int status, const std::string& message, const std::string& reason) {
  return json{{"code", status}, {"message", message}, {"error", reason}};
}

Result<EventQuery> parse_event_query(std::string_view target) {
  EventQuery q;
  const auto mark = target.find('?');
  std::string_view rest = mark == std::string_view::npos ? "" : target.substr(mark + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const auto eq = pair.find('=');
    const std::string key = http::percent_decode(pair.substr(0, eq), true);
    const std::string value =
        eq == std::string_view::npos ? "" : http::percent_decode(pair.substr(eq + 1), true);
    if (key == "offset") {
      CELLGATE_ASSIGN_OR_RETURN(const std::uint64_t n, parse_u64(value, "offset"));
      q.offset = static_cast<std::size_t>(std::min<std::uint64_t>(n, 1u << 30));
    } else if (key == "limit") {
      // parse_limit's range; present but empty is refused, not its default.
      CELLGATE_ASSIGN_OR_RETURN(q.limit, parse_limit({{"limit", value.empty() ? "-" : value}}));
    } else if (key == "orderAsc") {
      if (value != "true" && value != "false") {
        return invalid("bad_query", "orderAsc must be true or false");
      }
      q.ascending = value == "true";
    } else if (key == "types") {
      std::string_view list = value;
      while (!list.empty() && q.types.size() < 64) {
        const auto comma = list.find(',');
        if (const auto type = list.substr(0, comma); !type.empty()) {
          q.types.emplace(type);
        }
        list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      }
    }
  }
  return q;
}

}  // namespace cellgate::sandboxes
