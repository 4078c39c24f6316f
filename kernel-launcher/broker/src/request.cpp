// The broker's one parser of the gateway's requests (request.hpp). Everything the gateway sends
// is read here, bounded and typed, before the broker looks at it.
#include "cellgate/broker/request.hpp"

#include <signal.h>

#include <algorithm>
#include <climits>
#include <initializer_list>

#include "cellgate/jail/spec.hpp"

namespace cellgate::broker {
namespace {

using json = nlohmann::json;

// Fields of a request besides id and op; anything else is refused, so that no field the
// gateway adds (a "jail", a "network") is silently dropped or taken.
Result<void> only_fields(const json& req, std::initializer_list<const char*> allowed) {
  for (const auto& [key, value] : req.items()) {
    if (key == "id" || key == "op") {
      continue;
    }
    const bool known = std::any_of(allowed.begin(), allowed.end(),
                                   [&key = key](const char* a) { return key == a; });
    if (!known) {
      return refused("unknown field '" + key +
                     "': a request names a kernelspec, a kernel id, "
                     "a uid, the environment and connection-dir files, never the jail");
    }
  }
  return {};
}

// A required field of `type`; the refusal names it.
Result<const json*> field(const json& req, const char* name, json::value_t type) {
  const auto it = req.find(name);
  if (it == req.end()) {
    return refused(std::string("a field is missing or has the wrong type: '") + name +
                   "' is missing");
  }
  const bool number_ok = type == json::value_t::number_unsigned &&
                         it->type() == json::value_t::number_integer &&
                         it->get<std::int64_t>() >= 0;
  const bool signed_ok = type == json::value_t::number_integer && it->is_number_integer();
  if (it->type() != type && !number_ok && !signed_ok) {
    return refused(std::string("a field is missing or has the wrong type: '") + name + "' is a " +
                   it->type_name());
  }
  return &*it;
}

Result<std::string> string_field(const json& req, const char* name, std::size_t max) {
  CELLGATE_ASSIGN_OR_RETURN(const json* j, field(req, name, json::value_t::string));
  const auto& s = j->get_ref<const std::string&>();
  if (s.size() > max) {
    return refused(std::string("'") + name + "' is longer than " + std::to_string(max) + " bytes");
  }
  return s;
}

Result<std::uint64_t> unsigned_field(const json& req, const char* name) {
  CELLGATE_ASSIGN_OR_RETURN(const json* j, field(req, name, json::value_t::number_unsigned));
  return j->get<std::uint64_t>();
}

Result<std::int64_t> integer_field(const json& req, const char* name) {
  CELLGATE_ASSIGN_OR_RETURN(const json* j, field(req, name, json::value_t::number_integer));
  return j->is_number_unsigned() ? static_cast<std::int64_t>(
                                       std::min<std::uint64_t>(j->get<std::uint64_t>(), INT64_MAX))
                                 : j->get<std::int64_t>();
}

// A connection-dir file's name: one path component, with dots ("cellgate_display.py").
bool plain_file_name(const std::string& s) {
  if (s.empty() || s.size() > kMaxFileName || s == "." || s == "..") {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  });
}

Result<LaunchRequest> parse_launch(const json& req) {
  CELLGATE_TRY(only_fields(req, {"kernel_id", "kernelspec", "uid", "env", "conn_files"}));
  LaunchRequest r;
  CELLGATE_ASSIGN_OR_RETURN(r.kernel_id, string_field(req, "kernel_id", 200));
  // It names the kernel's cgroup ("k-<id>") and work dir: the jail's rule for such names.
  if (!jail::is_plain_name(r.kernel_id)) {
    return refused("a kernel id is a plain name of letters, digits, '-', '_' and '@'");
  }
  CELLGATE_ASSIGN_OR_RETURN(r.kernelspec, string_field(req, "kernelspec", kMaxKernelspecName));
  CELLGATE_ASSIGN_OR_RETURN(const std::uint64_t uid, unsigned_field(req, "uid"));
  if (uid > static_cast<std::uint64_t>(static_cast<uid_t>(-1) - 1)) {
    return refused("uid " + std::to_string(uid) + " is no uid");
  }
  r.uid = static_cast<uid_t>(uid);
  CELLGATE_ASSIGN_OR_RETURN(const json* env, field(req, "env", json::value_t::object));
  if (env->size() > kMaxEnvEntries) {
    return refused("the kernel's environment has more than " + std::to_string(kMaxEnvEntries) +
                   " variables");
  }
  std::size_t env_bytes = 0;
  for (const auto& [k, v] : env->items()) {
    if (!v.is_string()) {
      return refused("a field is missing or has the wrong type: environment variable '" + k +
                     "' is a " + v.type_name());
    }
    const auto& value = v.get_ref<const std::string&>();
    env_bytes += k.size() + value.size();
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
      return refused("an environment variable needs a name without '=' or NUL");
    }
    r.env[k] = value;
  }
  if (env_bytes > kMaxEnvBytes) {
    return refused("the kernel's environment is larger than 1 MiB");
  }
  if (auto it = req.find("conn_files"); it != req.end()) {
    if (!it->is_object()) {
      return refused(std::string("a field is missing or has the wrong type: 'conn_files' is a ") +
                     it->type_name());
    }
    if (it->size() > kMaxConnFiles) {
      return refused("more than " + std::to_string(kMaxConnFiles) + " connection-dir files");
    }
    for (const auto& [name, content] : it->items()) {
      if (!plain_file_name(name) || name == "connection.json" || name == "kernel.json" ||
          name == "host-connection.json") {
        return refused("connection-dir file '" + name.substr(0, kMaxFileName) +
                       "' needs another plain name");
      }
      if (!content.is_string()) {
        return refused("a field is missing or has the wrong type: connection-dir file '" + name +
                       "' is a " + content.type_name());
      }
      r.conn_files[name] = content.get<std::string>();
    }
  }
  return r;
}

Result<Request> parse_object(const json& req, std::uint64_t id) {
  Request out;
  out.id = id;
  const std::string& op = req["op"].get_ref<const std::string&>();
  if (op == "launch") {
    CELLGATE_ASSIGN_OR_RETURN(out.body, parse_launch(req));
    return out;
  }
  if (op == "signal") {
    CELLGATE_TRY(only_fields(req, {"handle", "signal"}));
    SignalRequest r;
    CELLGATE_ASSIGN_OR_RETURN(const std::int64_t sig, integer_field(req, "signal"));
    if (sig < 0 || sig > 64 || !allowed_signal(static_cast<int>(sig))) {
      return refused("signal " + std::to_string(sig) + " is not one a kernel is sent");
    }
    r.signal = static_cast<int>(sig);
    CELLGATE_ASSIGN_OR_RETURN(r.handle, unsigned_field(req, "handle"));
    out.body = r;
    return out;
  }
  if (op == "stop" || op == "detach") {
    CELLGATE_TRY(only_fields(req, {"handle"}));
    CELLGATE_ASSIGN_OR_RETURN(const std::uint64_t handle, unsigned_field(req, "handle"));
    if (op == "stop") {
      out.body = StopRequest{handle};
    } else {
      out.body = DetachRequest{handle};
    }
    return out;
  }
  if (op == "log_tail") {
    CELLGATE_TRY(only_fields(req, {"handle", "max_bytes"}));
    LogTailRequest r;
    CELLGATE_ASSIGN_OR_RETURN(r.handle, unsigned_field(req, "handle"));
    if (req.contains("max_bytes")) {
      CELLGATE_ASSIGN_OR_RETURN(const std::uint64_t max, unsigned_field(req, "max_bytes"));
      r.max_bytes = static_cast<std::size_t>(std::min<std::uint64_t>(max, kMaxLogTail));
    }
    out.body = r;
    return out;
  }
  if (op == "release_work") {
    CELLGATE_TRY(only_fields(req, {"kernel_id"}));
    ReleaseWorkRequest r;
    CELLGATE_ASSIGN_OR_RETURN(r.kernel_id, string_field(req, "kernel_id", 200));
    if (!jail::is_plain_name(r.kernel_id)) {
      return refused("a kernel id is a plain name");
    }
    out.body = r;
    return out;
  }
  if (op == "wait_fast") {
    CELLGATE_TRY(only_fields(req, {"timeout_ms"}));
    CELLGATE_ASSIGN_OR_RETURN(const std::int64_t ms, integer_field(req, "timeout_ms"));
    out.body = WaitFastRequest{
        std::chrono::milliseconds(std::clamp<std::int64_t>(ms, 0, kMaxWaitFast.count()))};
    return out;
  }
  return refused("unknown op '" + op.substr(0, 64) + "'");
}

}  // namespace

const char* to_string(Op op) {
  switch (op) {
    case Op::kLaunch:
      return "launch";
    case Op::kSignal:
      return "signal";
    case Op::kStop:
      return "stop";
    case Op::kDetach:
      return "detach";
    case Op::kLogTail:
      return "log_tail";
    case Op::kReleaseWork:
      return "release_work";
    case Op::kWaitFast:
      return "wait_fast";
  }
  return "?";
}

Op Request::op() const {
  return static_cast<Op>(body.index());
}

Error refused(const std::string& message) {
  return make_error(ErrorCode::kInvalidArgument, "broker_refused", message);
}

bool allowed_signal(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGKILL || sig == SIGHUP || sig == SIGQUIT ||
         sig == SIGUSR1 || sig == SIGUSR2;
}

Result<Request> parse_request(std::string_view text, std::uint64_t* id) {
  *id = 0;
  const Error malformed = refused("a request is a JSON object with a numeric id and an op");
  if (text.size() > kMaxMessage) {
    return refused("a request of " + std::to_string(text.size()) + " bytes (at most " +
                   std::to_string(kMaxMessage) + ")");
  }
  // Values nested deeper than any request's are dropped while parsing (nlohmann's parser keeps
  // its own stack, so depth costs no recursion), and the request is refused once its id is read.
  bool too_deep = false;
  const json req = json::parse(
      text,
      [&too_deep](int depth, json::parse_event_t event, json&) {
        const bool opens =
            event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
        if (opens && static_cast<std::size_t>(depth) >= kMaxJsonDepth) {
          too_deep = true;
          return false;
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (!req.is_object()) {
    return malformed;
  }
  if (const auto it = req.find("id"); it != req.end() && it->is_number_unsigned()) {
    *id = it->get<std::uint64_t>();
  }
  if (too_deep) {
    return refused("a request nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  const auto op = req.find("op");
  if (*id == 0 || op == req.end() || !op->is_string()) {
    return malformed;
  }
  return parse_object(req, *id);
}

std::string encode_ok(std::uint64_t id, nlohmann::json fields) {
  fields["id"] = id;
  fields["ok"] = true;
  return fields.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string encode_error(std::uint64_t id, const Error& e) {
  json out = {{"ok", false},
              {"code", static_cast<int>(e.code)},
              {"reason", e.reason},
              {"message", e.message},
              {"id", id}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string encode_exited(std::uint64_t handle, const std::string& status_line) {
  return json{{"event", "exited"}, {"handle", handle}, {"status", status_line}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

Error error_from_reply(const nlohmann::json& reply) {
  auto text = [&reply](const char* key, const char* fallback) {
    const auto it = reply.find(key);
    return it != reply.end() && it->is_string() ? it->get<std::string>() : std::string(fallback);
  };
  const auto c = reply.find("code");
  const int code = c != reply.end() && c->is_number_integer()
                       ? c->get<int>()
                       : static_cast<int>(ErrorCode::kInternal);
  const bool known = code >= 0 && code <= static_cast<int>(ErrorCode::kInternal);
  return make_error(known ? static_cast<ErrorCode>(code) : ErrorCode::kInternal,
                    text("reason", "broker"), text("message", "the broker refused"));
}

}  // namespace cellgate::broker
