// Structured fields on one log line: `--log-format json` adds them to the line's object (after
// "ts", "level" and "msg", which they cannot replace); the text format shows only the message.
//
//   util::log_with_fields(util::LogLevel::kInfo, {{"action", "start"}, {"kernel_id", id}},
//                         "kernel " + id + " started");
//
// The fields are handed to the formatter through a thread-local pointer for the length of the
// call: spdlog's default loggers format synchronously, on the calling thread.
//
// Thread-safety: any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace cellgate::util {

// The fields of the line being logged on this thread; null outside log_with_fields().
const nlohmann::json* current_log_fields();

enum class LogLevel { kDebug, kInfo, kWarn, kError };

// Logs `text` through spdlog's default logger with `fields` on the line.
void log_with_fields(LogLevel level, const nlohmann::json& fields, std::string_view text);

// A kernel's lifecycle event, with the field names of jupyter_server's kernel_actions event
// (https://schema.jupyter.org/server/events/kernel-actions/v1): action (start, interrupt,
// restart, shutdown), kernel_id (empty for a start that failed), kernel_name, status (success or
// error) and msg. Logged at info, or warn for an error.
void log_kernel_action(std::string_view action, std::string_view kernel_id,
                       std::string_view kernel_name, bool success, std::string_view msg);

}  // namespace cellgate::util
