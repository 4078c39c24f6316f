// The launcher's status protocol: one JSON object per line on the status fd, as bubblewrap's
// --json-status-fd. First {"event":"started","pid":N}, last {"event":"exited","reason":...}.
// Readers ignore fields they do not know.
//
//   {"event":"started","pid":4242}
//   {"event":"exited","reason":"signaled","signal":9,"signal_name":"SIGKILL","pid":4242}
//   {"event":"exited","reason":"setup_error","message":"execve('/usr/bin/python9'): ENOENT ..."}
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::launcher {

// Why a kernel ended, typed as sandbox2's results are.
enum class ExitReason {
  kOk,          // exited by itself (any exit code)
  kSignaled,    // killed by a signal
  kOom,         // killed by the memory limit
  kTimeout,     // killed by a time limit
  kViolation,   // killed by the seccomp policy
  kSetupError,  // never started: the launcher could not set it up
};
const char* to_string(ExitReason reason);
std::optional<ExitReason> exit_reason_from_string(std::string_view text);

struct StatusEvent {
  enum class Kind { kStarted, kExited };
  Kind kind = Kind::kStarted;
  int pid = 0;                          // the kernel's pid, as the gateway sees it
  ExitReason reason = ExitReason::kOk;  // kExited only
  int exit_code = 0;                    // kOk
  int signal = 0;                       // kSignaled
  std::string message;                  // details for people
  // kStarted: the connection file the gateway should use when it differs from the one given
  // (a tcp file was rewritten to ipc endpoints in the kernel's connection dir).
  std::string connection_file;
  // kStarted, jailed kernels: the kernel's cgroup directories (one per hierarchy) and version
  // ("v1"/"v2"), so the gateway can read its CPU and memory figures while it runs.
  std::vector<std::string> cgroup_paths;
  std::string cgroup_version;
  // kStarted: the kernel was forked from the zygote (not exec'd cold), for the gateway's
  // kernel start figures.
  bool zygote = false;
  // kExited, jailed kernels: from the kernel's cgroup.
  std::uint64_t memory_peak_bytes = 0;
  std::uint64_t oom_kills = 0;

  std::string to_line() const;  // JSON + '\n'
  static Result<StatusEvent> parse_line(std::string_view line);

 private:
  static bool parse_object(const nlohmann::json& j, StatusEvent& ev);
};

}  // namespace cellgate::launcher
