#include "cellgate/launcher/status.hpp"

#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>

namespace cellgate::launcher {

namespace {
constexpr std::pair<ExitReason, const char*> kReasonNames[] = {
    {ExitReason::kOk, "ok"},
    {ExitReason::kSignaled, "signaled"},
    {ExitReason::kOom, "oom"},
    {ExitReason::kTimeout, "timeout"},
    {ExitReason::kViolation, "violation"},
    {ExitReason::kSetupError, "setup_error"},
};
}  // namespace

const char* to_string(ExitReason reason) {
  for (const auto& [r, name] : kReasonNames) {
    if (r == reason) {
      return name;
    }
  }
  return "setup_error";
}

std::optional<ExitReason> exit_reason_from_string(std::string_view text) {
  for (const auto& [r, name] : kReasonNames) {
    if (text == name) {
      return r;
    }
  }
  return std::nullopt;
}

std::string StatusEvent::to_line() const {
  nlohmann::json j;
  if (kind == Kind::kStarted) {
    j = {{"event", "started"}, {"pid", pid}};
    if (!connection_file.empty()) {
      j["connection_file"] = connection_file;
    }
    if (!cgroup_paths.empty()) {
      j["cgroup_paths"] = cgroup_paths;
      j["cgroup_version"] = cgroup_version;
    }
    if (zygote) {
      j["zygote"] = true;
    }
  } else {
    j = {{"event", "exited"}, {"reason", to_string(reason)}, {"pid", pid}};
    if (reason == ExitReason::kOk) {
      j["exit_code"] = exit_code;
    }
    if (signal != 0) {
      j["signal"] = signal;
      const char* abbrev = sigabbrev_np(signal);
      j["signal_name"] = abbrev != nullptr ? std::string("SIG") + abbrev : std::to_string(signal);
    }
    if (!message.empty()) {
      j["message"] = message;
    }
    if (memory_peak_bytes != 0) {
      j["memory_peak_bytes"] = memory_peak_bytes;
    }
    if (oom_kills != 0) {
      j["oom_kills"] = oom_kills;
    }
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<StatusEvent> StatusEvent::parse_line(std::string_view line) {
  auto bad = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "bad_status_line", what);
  };
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return bad("status line is not a JSON object");
  }
  StatusEvent ev;
  try {
    return parse_object(j, ev)
               ? Result<StatusEvent>(ev)
               : Result<StatusEvent>(bad("status line has an unknown event or exit reason"));
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("status line has a field of the wrong type: ") + e.what());
  }
}

bool StatusEvent::parse_object(const nlohmann::json& j, StatusEvent& ev) {
  const std::string event = j.value("event", "");
  if (event == "started") {
    ev.kind = Kind::kStarted;
  } else if (event == "exited") {
    ev.kind = Kind::kExited;
    auto reason = exit_reason_from_string(j.value("reason", ""));
    if (!reason) {
      return false;
    }
    ev.reason = *reason;
    ev.exit_code = j.value("exit_code", 0);
    ev.signal = j.value("signal", 0);
    ev.message = j.value("message", "");
    ev.memory_peak_bytes = j.value("memory_peak_bytes", std::uint64_t{0});
    ev.oom_kills = j.value("oom_kills", std::uint64_t{0});
  } else {
    return false;
  }
  ev.pid = j.value("pid", 0);
  ev.connection_file = j.value("connection_file", "");
  ev.zygote = ev.kind == Kind::kStarted && j.value("zygote", false);
  if (auto paths = j.find("cgroup_paths"); paths != j.end() && paths->is_array()) {
    for (const auto& p : *paths) {
      if (!p.is_string()) {
        return false;
      }
      ev.cgroup_paths.push_back(p.get<std::string>());
    }
    ev.cgroup_version = j.value("cgroup_version", "");
  }
  return true;
}

}  // namespace cellgate::launcher
