// The broker's wire: what the less-trusted gateway may ask the root broker, as typed values, and
// the one parser that turns a message from the channel into one of them (request.cpp). Nothing
// else in the broker reads the gateway's JSON.
//
//   std::uint64_t id = 0;
//   Result<Request> r = parse_request(message.data, &id);
//   if (!r) { send(encode_error(id, r.error())); }               // refused with a reason
//   else if (auto* launch = std::get_if<LaunchRequest>(&r->body)) { ... }
//
// A request is one JSON object in one SOCK_SEQPACKET message: {"id": N > 0, "op": "...", ...}.
// Each op has a fixed set of fields; a field the op does not have is refused, never ignored (a
// gateway that adds "jail" or "network" must not have it silently dropped or taken). Every
// string and map is bounded here, before anything is looked up; the policy checks (the uid
// range, the kernelspec exists, the handle is one of ours) are the broker's.
//
// Replies: {"id", "ok": true, ...} or {"id", "ok": false, "code", "reason", "message"}; the
// broker also sends {"event": "exited", "handle", "status"} once a kernel has ended. A message
// that has no usable id is answered with id 0.
//
// Thread-safety: functions without shared state.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

#include "cellgate/result.hpp"

namespace cellgate::broker {

// Limits of the wire. Connection-dir files (the display formatters' module) make the largest
// requests.
inline constexpr std::size_t kMaxMessage = std::size_t{4} << 20;
inline constexpr std::size_t kMaxEnvBytes = std::size_t{1} << 20;
inline constexpr std::size_t kMaxEnvEntries = 4096;
inline constexpr std::size_t kMaxConnFiles = 32;
inline constexpr std::size_t kMaxFileName = 100;
inline constexpr std::size_t kMaxKernelspecName = 255;
inline constexpr std::size_t kMaxJsonDepth = 8;  // the deepest request is 3 levels
inline constexpr std::size_t kMaxLogTail = std::size_t{64} << 10;
inline constexpr std::chrono::milliseconds kMaxWaitFast{60000};

enum class Op { kLaunch, kSignal, kStop, kDetach, kLogTail, kReleaseWork, kWaitFast };
const char* to_string(Op op);

// Start a jailed kernel of `kernelspec` as `uid`, named `kernel_id`.
struct LaunchRequest {
  std::string kernel_id;   // a plain name (jail::is_plain_name): its cgroup and work dir
  std::string kernelspec;  // looked up by the broker, never a path or an argv
  uid_t uid = 0;           // checked against the broker's range by the broker
  std::map<std::string, std::string> env;         // names without '=' or NUL, ≤ 1 MiB in all
  std::map<std::string, std::string> conn_files;  // plain names, not the connection file's
};
// Signal one of our kernels (through its launcher, into the jail); the signal is one a kernel
// is sent (SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2).
struct SignalRequest {
  std::uint64_t handle = 0;
  int signal = 0;
};
// End a kernel (kill, reap, remove its runtime dir).
struct StopRequest {
  std::uint64_t handle = 0;
};
// Let go of a kernel without ending it.
struct DetachRequest {
  std::uint64_t handle = 0;
};
struct LogTailRequest {
  std::uint64_t handle = 0;
  std::size_t max_bytes = 2000;  // at most kMaxLogTail
};
// Remove the work dir of a kernel that no longer runs.
struct ReleaseWorkRequest {
  std::string kernel_id;
};
// Wait up to `timeout` for the launch path to be fast (the zygote ready).
struct WaitFastRequest {
  std::chrono::milliseconds timeout{0};  // clamped to [0, kMaxWaitFast]
};

struct Request {
  std::uint64_t id = 0;
  std::variant<LaunchRequest, SignalRequest, StopRequest, DetachRequest, LogTailRequest,
               ReleaseWorkRequest, WaitFastRequest>
      body;
  Op op() const;
};

// The request in `text`, or kInvalidArgument "broker_refused" with a message saying what is
// wrong. `id` is set as soon as the text's id is known, so that a refusal still reaches its
// caller (0 when there is none). Never throws, whatever the bytes.
Result<Request> parse_request(std::string_view text, std::uint64_t* id);

// Whether the gateway may send a kernel `sig`.
bool allowed_signal(int sig);

// Replies and events, as sent on the channel.
std::string encode_ok(std::uint64_t id, nlohmann::json fields);
std::string encode_error(std::uint64_t id, const Error& e);
std::string encode_exited(std::uint64_t handle, const std::string& status_line);
// The Error of a {"ok": false, ...} reply.
Error error_from_reply(const nlohmann::json& reply);
// A refusal of the broker's ("broker_refused", kInvalidArgument).
Error refused(const std::string& message);

}  // namespace cellgate::broker
