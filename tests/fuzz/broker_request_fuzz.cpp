// What the unprivileged gateway sends the root broker (kernel-launcher/broker/src/request.cpp):
// one SOCK_SEQPACKET message, parsed before the broker looks at anything. Invariants:
//   - no exception leaves parse_request, whatever the bytes;
//   - a refusal is kInvalidArgument "broker_refused" with a message, and its reply (encode_error)
//     is JSON that error_from_reply reads back as the same error, with the request's id;
//   - an accepted request has an id > 0 and is within the wire's bounds: a plain kernel id, an
//     environment of names without '=' or NUL and at most 1 MiB, connection-dir files with plain
//     names that are not the connection file's, an allowed signal, a log tail of at most 64 KiB
//     and a wait_fast of at most 60 s.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "cellgate/broker/request.hpp"
#include "cellgate/jail/spec.hpp"
#include "fuzz_util.hpp"

using cellgate::fuzz::check;
namespace b = cellgate::broker;

namespace {

void check_launch(const b::LaunchRequest& r) {
  check(cellgate::jail::is_plain_name(r.kernel_id),
        "a launch with a kernel id that is no plain name", r.kernel_id);
  check(r.kernelspec.size() <= b::kMaxKernelspecName, "a kernelspec name over the bound");
  std::size_t bytes = 0;
  for (const auto& [k, v] : r.env) {
    check(!k.empty() && k.find('=') == std::string::npos && k.find('\0') == std::string::npos,
          "an environment name with '=' or NUL", k);
    bytes += k.size() + v.size();
  }
  check(bytes <= b::kMaxEnvBytes, "an environment over 1 MiB");
  check(r.env.size() <= b::kMaxEnvEntries, "too many environment variables");
  check(r.conn_files.size() <= b::kMaxConnFiles, "too many connection-dir files");
  for (const auto& [name, content] : r.conn_files) {
    check(!name.empty() && name.size() <= b::kMaxFileName && name != "." && name != ".." &&
              name.find('/') == std::string::npos && name != "connection.json" &&
              name != "kernel.json" && name != "host-connection.json",
          "a connection-dir file name that is not plain, or the connection file's", name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::uint64_t id = 12345;
  auto r = b::parse_request(text, &id);
  if (!r) {
    const auto& e = r.error();
    check(e.code == cellgate::ErrorCode::kInvalidArgument && e.reason == "broker_refused" &&
              !e.message.empty(),
          "a refusal with another code or reason, or without a message", e.describe());
    const auto reply = nlohmann::json::parse(b::encode_error(id, e), nullptr, false);
    check(reply.is_object() && reply.value("id", std::uint64_t{1}) == id &&
              reply.value("ok", true) == false,
          "a refusal's reply does not parse back with its id");
    const auto back = b::error_from_reply(reply);
    check(back.code == e.code && back.reason == e.reason, "a refusal changed in its reply",
          back.describe());
    return 0;
  }
  check(r->id > 0 && r->id == id, "an accepted request without its id");
  if (const auto* launch = std::get_if<b::LaunchRequest>(&r->body)) {
    check_launch(*launch);
  } else if (const auto* sig = std::get_if<b::SignalRequest>(&r->body)) {
    check(b::allowed_signal(sig->signal), "a signal that is not allowed",
          std::to_string(sig->signal));
  } else if (const auto* tail = std::get_if<b::LogTailRequest>(&r->body)) {
    check(tail->max_bytes <= b::kMaxLogTail, "a log tail over 64 KiB");
  } else if (const auto* release = std::get_if<b::ReleaseWorkRequest>(&r->body)) {
    check(cellgate::jail::is_plain_name(release->kernel_id), "release_work of a path",
          release->kernel_id);
  } else if (const auto* wait = std::get_if<b::WaitFastRequest>(&r->body)) {
    check(wait->timeout.count() >= 0 && wait->timeout <= b::kMaxWaitFast,
          "a wait_fast outside [0, 60 s]");
  }
  check(std::string(b::to_string(r->op())) != "?", "an op without a name");
  return 0;
}
