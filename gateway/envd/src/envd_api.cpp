// envd's routes (envd_api.hpp): /health and process.Process's RPCs.
#include "cellgate/envd/envd_api.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "call.hpp"
#include "cellgate/envd/connect.hpp"
#include "cellgate/envd/signature.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/http/router.hpp"
#include "cellgate/util/text.hpp"
#include "process.hpp"
#include "watch.hpp"

namespace cellgate::envd {

using nlohmann::json;

namespace {

constexpr std::size_t kMaxArgs = 4096;
constexpr std::size_t kMaxCommandBytes = 1 << 20;  // argv and envs together
constexpr std::size_t kMaxEnvs = 256;

std::string header(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  return it == req.end() ? std::string() : std::string(it->value());
}

Error bad(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "bad_request", std::move(message));
}

// envd's signal enum ("SIGNAL_SIGKILL") or a number.
Result<int> parse_signal(const json& j) {
  if (j.is_number_integer()) {
    const int sig = j.get<int>();
    if (sig > 0 && sig < 65) {
      return sig;
    }
  } else if (j.is_string()) {
    static const std::map<std::string, int> kNames = {
        {"SIGNAL_SIGKILL", SIGKILL}, {"SIGNAL_SIGTERM", SIGTERM}, {"SIGNAL_SIGINT", SIGINT},
        {"SIGNAL_SIGHUP", SIGHUP},   {"SIGNAL_SIGQUIT", SIGQUIT}, {"SIGNAL_SIGUSR1", SIGUSR1},
        {"SIGNAL_SIGUSR2", SIGUSR2}};
    if (auto it = kNames.find(j.get<std::string>()); it != kNames.end()) {
      return it->second;
    }
  }
  return bad("unknown signal " + j.dump().substr(0, 64));
}

Result<kernel::PtySize> parse_size(const json& pty) {
  const json size = pty.is_object() ? pty.value("size", json::object()) : json();
  if (!size.is_object()) {
    return bad("pty.size must be {cols, rows}");
  }
  const int cols = size.value("cols", 0), rows = size.value("rows", 0);
  if (cols <= 0 || rows <= 0 || cols > 1000 || rows > 1000) {
    return bad("pty.size wants cols and rows of 1 to 1000");
  }
  return kernel::PtySize{cols, rows};
}

}  // namespace

// Connect-Timeout-Ms (0 or absent: none), and Keepalive-Ping-Interval (seconds; 50 by default).
void stream_timing(const http::Request& req, Watcher& w) {
  const std::string timeout = header(req, "Connect-Timeout-Ms");
  if (!timeout.empty() && timeout.size() <= 10 &&
      timeout.find_first_not_of("0123456789") == std::string::npos) {
    const long long ms = std::stoll(timeout);
    if (ms > 0) {
      w.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    }
  }
  const std::string ping = header(req, "Keepalive-Ping-Interval");
  if (!ping.empty() && ping.size() <= 4 &&
      ping.find_first_not_of("0123456789") == std::string::npos) {
    w.keepalive = std::chrono::seconds(std::clamp(std::stoi(ping), 1, 300));
  }
}

EnvdApi::EnvdApi(EnvdOptions options) : options_(std::move(options)) {}

EnvdApi::~EnvdApi() {
  std::vector<std::shared_ptr<Process>> all;
  {
    MutexLock lock(mu_);
    for (auto& [kernel, procs] : processes_) {
      for (auto& [pid, p] : procs) {
        all.push_back(p);
      }
    }
  }
  for (auto& p : all) {
    p->stop();
  }
  std::vector<std::shared_ptr<DirWatch>> watches;
  {
    MutexLock lock(mu_);
    for (auto& [kernel, live] : watches_) {
      for (auto& [raw, w] : live) {
        watches.push_back(w);
      }
    }
  }
  for (auto& w : watches) {
    w->stop();
  }
}

http::Upgrade EnvdApi::upgrade(const http::Request& req) {
  http::Upgrade up;
  up.refusal = unary_error(req, make_error(ErrorCode::kNotFound, "no_route", "no WebSocket here"));
  return up;
}

bool EnvdApi::sandbox_alive(const std::string& sandbox_id) const {
  auto t = options_.find(sandbox_id);
  return t && t->running;
}

std::optional<SandboxTarget> EnvdApi::authorize(const http::Request& req,
                                                const http::Target& target,
                                                http::Exchange& exchange) {
  const std::string id = header(req, "E2b-Sandbox-Id");
  auto sandbox = options_.find(id);
  auto signature = target.path == "/files"
                       ? parse_file_signature(req.method(), target.query)
                       : Result<std::optional<FileSignature>>(std::optional<FileSignature>());
  auto rest_error = [&](int status, const std::string& message) {
    exchange.reply(
        unary_response(req, status, json{{"code", status}, {"message", message}}.dump()));
    return std::nullopt;
  };
  if (!signature) {
    return rest_error(400, signature.error().message);
  }
  if (*signature && (!sandbox || !sandbox->access_token.empty()) &&
      !(sandbox && http::token_equals(header(req, "X-Access-Token"), sandbox->access_token))) {
    // A signed URL: the named sandbox's token signs it, or (no E2b-Sandbox-Id: one URL for every
    // sandbox) the control plane's sandbox whose token does; bounded by their number.
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    std::vector<SandboxTarget> candidates;
    if (sandbox) {
      candidates.push_back(*sandbox);
    } else if (id.empty() && options_.all) {
      candidates = options_.all();
    }
    for (auto& c : candidates) {
      switch (check_file_signature(**signature, c.access_token, now)) {
        case SignatureCheck::kValid:
          return std::move(c);
        case SignatureCheck::kExpired:
          return rest_error(401, "signature is already expired");
        case SignatureCheck::kWrong:
          break;
      }
    }
    return rest_error(401, "invalid signature");
  }
  if (!sandbox) {
    exchange.reply(unary_error(req, make_error(ErrorCode::kNotFound, "no_such_sandbox",
                                               "sandbox '" + id.substr(0, 128) + "' not found")));
    return std::nullopt;
  }
  if (!sandbox->access_token.empty() &&
      !http::token_equals(header(req, "X-Access-Token"), sandbox->access_token)) {
    exchange.reply(
        unary_error(req, make_error(ErrorCode::kUnauthenticated, "unauthenticated",
                                    "a valid access token is required (X-Access-Token)")));
    return std::nullopt;
  }
  return sandbox;
}

void EnvdApi::handle(http::Request req, std::shared_ptr<http::Exchange> exchange) {
  const http::Target target = http::Target::parse(req.target());
  if (target.path == "/health") {
    // 204 while the sandbox runs; 502 when it is unknown, paused or gone (E2B's proxy's answer,
    // which the SDK reads as "the sandbox was killed or reached its end of life").
    const auto sandbox = options_.find(header(req, "E2b-Sandbox-Id"));
    http::Response res{
        sandbox && sandbox->running ? http::Status::no_content : http::Status::bad_gateway,
        req.version()};
    res.set(http::Field::server, "cellgate");
    res.keep_alive(req.keep_alive());
    res.prepare_payload();
    return exchange->reply(std::move(res));
  }
  const auto sandbox = authorize(req, target, *exchange);
  if (!sandbox) {
    return;
  }
  if (target.path == "/files") {
    auto path = target.query.find("path");
    return files(std::move(req), std::move(exchange), *sandbox,
                 path == target.query.end() ? std::string() : path->second);
  }
  const std::string prefix = "/process.Process/";
  const std::string fs_prefix = "/filesystem.Filesystem/";
  const bool fs = target.path.rfind(fs_prefix, 0) == 0;
  if ((target.path.rfind(prefix, 0) != 0 && !fs) || req.method() != http::Verb::post) {
    return exchange->reply(
        unary_error(req, make_error(ErrorCode::kNotFound, "no_route",
                                    "no route for " + std::string(req.target()).substr(0, 256))));
  }
  const std::string method = target.path.substr(fs ? fs_prefix.size() : prefix.size());
  const bool streaming = fs ? method == "WatchDir" : (method == "Start" || method == "Connect");
  Call call{std::move(req), std::move(exchange), *sandbox, {}};
  std::string text = call.req.body();
  if (streaming) {
    auto message = read_envelope(text);
    if (!message) {
      return stream_error(*call.exchange, call.req, message.error());
    }
    text = std::move(message).value();
  }
  call.body = text.empty() ? json::object() : http::parse_json(text);
  if (call.body.is_discarded() || !call.body.is_object()) {
    const Error e = bad("the request message must be a JSON object");
    return streaming ? stream_error(*call.exchange, call.req, e)
                     : call.exchange->reply(unary_error(call.req, e));
  }
  if (!sandbox->running) {
    const Error e = make_error(ErrorCode::kUnavailable, "sandbox_not_running",
                               "the sandbox is not running (paused?)");
    return streaming ? stream_error(*call.exchange, call.req, e)
                     : call.exchange->reply(unary_error(call.req, e));
  }
  if (fs) {
    return method == "WatchDir" ? watch_dir(call) : filesystem(call, method);
  }
  if (method == "Start") {
    return start(call);
  }
  if (method == "Connect") {
    return connect(call);
  }
  if (method == "List") {
    return list(call);
  }
  if (method == "SendInput") {
    return send_input(call);
  }
  if (method == "CloseStdin") {
    return close_stdin(call);
  }
  if (method == "SendSignal") {
    return send_signal(call);
  }
  if (method == "Update") {
    return update(call);
  }
  call.exchange->reply(unary_error(
      call.req, make_error(ErrorCode::kNotFound, "no_route",
                           "process.Process/" + method.substr(0, 64) + " is not served")));
}

Result<std::shared_ptr<Process>> EnvdApi::select(const Call& call, const json& selector) {
  if (!selector.is_object()) {
    return bad("process must be a selector {pid} or {tag}");
  }
  // The JSON mapping flattens the oneof ({"pid": 7}); accept the nested form too.
  const json& s = selector.contains("selector") ? selector["selector"] : selector;
  MutexLock lock(mu_);
  auto procs = processes_.find(call.sandbox.kernel_id);
  if (procs != processes_.end()) {
    if (s.contains("pid") && s["pid"].is_number_integer()) {
      if (auto it = procs->second.find(s["pid"].get<pid_t>()); it != procs->second.end()) {
        return it->second;
      }
    } else if (s.contains("tag") && s["tag"].is_string()) {
      for (auto& [pid, p] : procs->second) {
        if (!p->config().tag.empty() && p->config().tag == s["tag"].get<std::string>()) {
          return p;
        }
      }
    }
  }
  return make_error(ErrorCode::kNotFound, "no_such_process",
                    "process " + s.dump().substr(0, 64) + " not found");
}

void EnvdApi::start(Call& call) {
  const json process = call.body.value("process", json());
  if (!process.is_object() || !process.contains("cmd") || !process["cmd"].is_string() ||
      process["cmd"].get<std::string>().empty()) {
    return stream_error(*call.exchange, call.req, bad("process.cmd must be a command"));
  }
  ProcessConfig config;
  config.cmd = process["cmd"].get<std::string>();
  std::size_t bytes = config.cmd.size();
  const json args = process.value("args", json::array());
  const json envs = process.value("envs", json::object());
  if (!args.is_array() || args.size() > kMaxArgs || !envs.is_object() || envs.size() > kMaxEnvs) {
    return stream_error(*call.exchange, call.req,
                        bad("process.args must be strings (4096 at most), process.envs an object "
                            "of strings (256 at most)"));
  }
  for (const auto& a : args) {
    if (!a.is_string()) {
      return stream_error(*call.exchange, call.req, bad("process.args must be strings"));
    }
    config.args.push_back(a.get<std::string>());
    bytes += config.args.back().size();
  }
  kernel::CommandRequest request;
  request.env = {"HOME=" + options_.home, "USER=" + options_.user, "LOGNAME=" + options_.user};
  for (const auto& [k, v] : envs.items()) {
    if (!v.is_string() || k.empty() || k.find('=') != std::string::npos ||
        k.find('\0') != std::string::npos || v.get<std::string>().find('\0') != std::string::npos) {
      return stream_error(*call.exchange, call.req,
                          bad("process.envs must map names (no '=') to strings"));
    }
    config.envs[k] = v.get<std::string>();
    request.env.push_back(k + "=" + v.get<std::string>());
    bytes += k.size() + v.get<std::string>().size();
  }
  if (bytes > kMaxCommandBytes) {
    return stream_error(*call.exchange, call.req, bad("the command and its envs exceed 1 MiB"));
  }
  config.cwd = process.value("cwd", json("")).is_string() ? process.value("cwd", "") : "";
  request.cwd = config.cwd.empty() ? options_.home : config.cwd;
  if (call.body.contains("tag") && call.body["tag"].is_string()) {
    config.tag = call.body["tag"].get<std::string>().substr(0, 256);
  }
  if (call.body.contains("pty") && !call.body["pty"].is_null()) {
    auto size = parse_size(call.body["pty"]);
    if (!size) {
      return stream_error(*call.exchange, call.req, size.error());
    }
    request.pty = *size;
  }
  const bool stdin_open =
      call.body.value("stdin", json(true)).is_boolean() ? call.body.value("stdin", true) : true;
  request.argv.push_back(config.cmd);
  request.argv.insert(request.argv.end(), config.args.begin(), config.args.end());
  {
    MutexLock lock(mu_);
    if (processes_[call.sandbox.kernel_id].size() >= options_.max_processes) {
      return stream_error(*call.exchange, call.req,
                          make_error(ErrorCode::kResourceExhausted, "too_many_processes",
                                     "the sandbox runs " + std::to_string(options_.max_processes) +
                                         " processes already"));
    }
  }
  Watcher watcher;
  watcher.exchange = call.exchange;
  stream_timing(call.req, watcher);
  // The launcher's spawn and the jail's entry take milliseconds, but block: not on a network
  // thread.
  options_.offload([this, req = std::move(call.req), sandbox = call.sandbox,
                    request = std::move(request), config = std::move(config), stdin_open,
                    watcher = std::move(watcher)]() mutable {
    auto& ex = *watcher.exchange;
    auto target = options_.jail_of(sandbox.kernel_id);
    if (!target) {
      return stream_error(ex, req, target.error());
    }
    auto command = kernel::JailCommand::start(*target, request);
    if (!command) {
      spdlog::info("envd: a command in sandbox {} did not start: {}", sandbox.sandbox_id,
                   command.error().message);
      return stream_error(ex, req, command.error());
    }
    const pid_t pid = (*command)->pid();
    const std::string kernel_id = sandbox.kernel_id;
    ProcessHooks hooks;
    hooks.sandbox_alive = [this, id = sandbox.sandbox_id] { return sandbox_alive(id); };
    hooks.on_finished = [this, kernel_id, pid] {
      MutexLock lock(mu_);
      auto procs = processes_.find(kernel_id);
      if (procs != processes_.end()) {
        procs->second.erase(pid);
        if (procs->second.empty()) {
          processes_.erase(procs);
        }
      }
    };
    auto p = Process::create(std::move(command).value(), std::move(config), stdin_open,
                             std::move(hooks));
    {
      MutexLock lock(mu_);
      processes_[kernel_id][pid] = p;
    }
    ex.begin(stream_head(req));
    p->attach(std::move(watcher));
    p->run();
  });
}

void EnvdApi::connect(Call& call) {
  auto p = select(call, call.body.value("process", json()));
  if (!p) {
    return stream_error(*call.exchange, call.req, p.error());
  }
  Watcher watcher;
  watcher.exchange = call.exchange;
  stream_timing(call.req, watcher);
  call.exchange->begin(stream_head(call.req));
  if (!(*p)->attach(std::move(watcher))) {
    call.exchange->write(end_of_stream(ConnectError{"not_found", "the process has ended"}));
    call.exchange->end();
  }
}

void EnvdApi::list(Call& call) {
  json processes = json::array();
  {
    MutexLock lock(mu_);
    auto procs = processes_.find(call.sandbox.kernel_id);
    if (procs != processes_.end()) {
      for (const auto& [pid, p] : procs->second) {
        const ProcessConfig& c = p->config();
        json info = {{"pid", pid},
                     {"config", {{"cmd", c.cmd}, {"args", c.args}, {"envs", c.envs}}}};
        if (!c.cwd.empty()) {
          info["config"]["cwd"] = c.cwd;
        }
        if (!c.tag.empty()) {
          info["tag"] = c.tag;
        }
        processes.push_back(std::move(info));
      }
    }
  }
  call.exchange->reply(unary_response(call.req, 200, json{{"processes", processes}}.dump()));
}

void EnvdApi::send_input(Call& call) {
  auto p = select(call, call.body.value("process", json()));
  if (!p) {
    return call.exchange->reply(unary_error(call.req, p.error()));
  }
  const json input = call.body.value("input", json::object());
  const bool to_pty = input.is_object() && input.contains("pty");
  const json data = input.is_object() ? input.value(to_pty ? "pty" : "stdin", json("")) : json();
  if (!data.is_string()) {
    return call.exchange->reply(unary_error(call.req, bad("input must be {stdin} or {pty}")));
  }
  auto bytes = cellgate::base64_decode(data.get<std::string>());
  if (!bytes) {
    return call.exchange->reply(unary_error(call.req, bytes.error()));
  }
  // Writing may wait for the process to read (up to 5 s): not on a network thread.
  options_.offload([p = *p, bytes = std::move(bytes).value(), to_pty, req = std::move(call.req),
                    ex = call.exchange] {
    auto sent = p->send_input(bytes, to_pty);
    ex->reply(sent ? unary_response(req, 200, "{}") : unary_error(req, sent.error()));
  });
}

void EnvdApi::close_stdin(Call& call) {
  auto p = select(call, call.body.value("process", json()));
  auto closed = p ? (*p)->close_stdin() : Result<void>(p.error());
  call.exchange->reply(closed ? unary_response(call.req, 200, "{}")
                              : unary_error(call.req, closed.error()));
}

void EnvdApi::send_signal(Call& call) {
  auto p = select(call, call.body.value("process", json()));
  if (!p) {
    return call.exchange->reply(unary_error(call.req, p.error()));
  }
  auto sig = parse_signal(call.body.value("signal", json()));
  auto sent = sig ? (*p)->signal(*sig) : Result<void>(sig.error());
  call.exchange->reply(sent ? unary_response(call.req, 200, "{}")
                            : unary_error(call.req, sent.error()));
}

void EnvdApi::update(Call& call) {
  auto p = select(call, call.body.value("process", json()));
  if (!p) {
    return call.exchange->reply(unary_error(call.req, p.error()));
  }
  if (!call.body.contains("pty") || call.body["pty"].is_null()) {
    return call.exchange->reply(unary_response(call.req, 200, "{}"));
  }
  auto size = parse_size(call.body["pty"]);
  auto resized = size ? (*p)->resize(*size) : Result<void>(size.error());
  call.exchange->reply(resized ? unary_response(call.req, 200, "{}")
                               : unary_error(call.req, resized.error()));
}

}  // namespace cellgate::envd
