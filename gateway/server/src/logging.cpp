// `cellgate serve`'s log: where it goes (the journal under systemd, else the console), its level
// (--log-level, else SPDLOG_LEVEL, else info) and its format (--log-format text|json).
#include <spdlog/cfg/env.h>
#include <spdlog/formatter.h>
#include <spdlog/spdlog.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/server/server.hpp"
#include "cellgate/util/log_fields.hpp"
#include "systemd.hpp"

namespace cellgate::server {
namespace {

std::string_view level_name(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

// One JSON object per line: {"ts": RFC 3339 UTC with milliseconds, "level", "msg"}, then the
// line's structured fields (util::log_with_fields: a kernel's lifecycle event's). The message
// is escaped by nlohmann (bytes that are not UTF-8 become U+FFFD), so a line is always one
// valid object whatever a kernel or a client put into a logged string.
class JsonFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    const auto since_epoch = duration_cast<milliseconds>(msg.time.time_since_epoch()).count();
    const time_t seconds = static_cast<time_t>(since_epoch / 1000);
    tm utc{};
    ::gmtime_r(&seconds, &utc);
    char ts[96];  // room for any int gcc can prove, not only real dates
    std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                  utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                  static_cast<int>(since_epoch % 1000));
    nlohmann::ordered_json line = {
        {"ts", ts},
        {"level", level_name(msg.level)},
        {"msg", std::string_view(msg.payload.data(), msg.payload.size())}};
    if (const nlohmann::json* fields = util::current_log_fields();
        fields != nullptr && fields->is_object()) {
      for (const auto& [key, value] : fields->items()) {
        if (!line.contains(key)) {
          line[key] = value;
        }
      }
    }
    const std::string text =
        line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

void set_up_logging(const ServeOptions& options) {
  if (auto journal = systemd::journal_logger()) {
    spdlog::set_default_logger(journal);  // under systemd: priorities reach the journal
  }
  if (!options.log_level.empty()) {
    spdlog::set_level(
        spdlog::level::from_str(options.log_level == "warn" ? "warning" : options.log_level));
  } else if (const char* env = std::getenv("SPDLOG_LEVEL"); env != nullptr && *env != '\0') {
    spdlog::cfg::load_env_levels();  // spdlog's own syntax: "debug", or "cellgate=debug,…"
  } else {
    spdlog::set_level(spdlog::level::info);
  }
  if (options.log_format == "json") {
    // The journal keeps its own fields (journalctl -o json); the console gets JSON lines.
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
  }
}

}  // namespace cellgate::server
