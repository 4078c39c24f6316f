#include "cellgate/util/log_fields.hpp"

#include <spdlog/spdlog.h>

#include <string>

namespace cellgate::util {
namespace {
thread_local const nlohmann::json* t_fields = nullptr;
}  // namespace

const nlohmann::json* current_log_fields() {
  return t_fields;
}

void log_with_fields(LogLevel level, const nlohmann::json& fields, std::string_view text) {
  spdlog::level::level_enum to = spdlog::level::info;
  switch (level) {
    case LogLevel::kDebug:
      to = spdlog::level::debug;
      break;
    case LogLevel::kInfo:
      break;
    case LogLevel::kWarn:
      to = spdlog::level::warn;
      break;
    case LogLevel::kError:
      to = spdlog::level::err;
      break;
  }
  const nlohmann::json* previous = t_fields;
  t_fields = &fields;
  spdlog::log(to, "{}", text);
  t_fields = previous;
}

void log_kernel_action(std::string_view action, std::string_view kernel_id,
                       std::string_view kernel_name, bool success, std::string_view msg) {
  nlohmann::json fields = {
      {"action", action}, {"kernel_name", kernel_name}, {"status", success ? "success" : "error"}};
  if (!kernel_id.empty()) {
    fields["kernel_id"] = kernel_id;
  }
  log_with_fields(success ? LogLevel::kInfo : LogLevel::kWarn, fields, msg);
}

}  // namespace cellgate::util
