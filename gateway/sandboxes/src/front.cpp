// E2bFront's dispatch (front.hpp): sandbox headers, envd paths, the control plane, the rest.
#include "cellgate/sandboxes/front.hpp"

#include <spdlog/spdlog.h>

#include "cellgate/api/e2b.hpp"
#include "cellgate/http/message.hpp"
#include "front_support.hpp"

namespace cellgate::sandboxes {
namespace {

using http::Status;

// What E2B's SDK in debug mode names its one sandbox: served as before this front existed.
constexpr std::string_view kDebugSandbox = "debug_sandbox_id";
constexpr std::string_view kCodeInterpreterPort = "49999";

std::string_view header(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  return it == req.end() ? std::string_view() : std::string_view(it->value());
}

bool envd_path(std::string_view path) {
  return path == "/files" || path.starts_with("/files?") || path.starts_with("/process.Process/") ||
         path.starts_with("/filesystem.Filesystem/");
}

}  // namespace

http::Response e2b_error(const http::Request& req, Status status, const std::string& message,
                         const std::string& reason) {
  auto body = error_json(static_cast<int>(status), message, reason);
  body["reason"] = std::string(http::beast_http::obsolete_reason(status));
  return http::json_response(req, status, body);
}

Status e2b_status(const Error& error) {
  if (error.code == ErrorCode::kResourceExhausted && error.reason != "no_space") {
    return Status::too_many_requests;  // E2B's answer to a tenant over its limits
  }
  return http::status_for(error);
}

http::Response e2b_error(const http::Request& req, const Error& error) {
  return e2b_error(req, e2b_status(error), error.message, error.reason);
}

E2bFront::E2bFront(SandboxRegistry& sandboxes, tenants::KeyStore* keys, api::E2bApi& legacy,
                   kernels::KernelRegistry& kernels, execute::Executor& executor,
                   FrontOptions options, util::Offload offload)
    : sandboxes_(sandboxes),
      keys_(keys),
      legacy_(legacy),
      kernels_(kernels),
      executor_(executor),
      options_(std::move(options)),
      offload_(std::move(offload)) {
  add_routes();
  sandboxes_.on_ended([this](const std::string& id) { ended(id); });
}

E2bFront::~E2bFront() {
  sandboxes_.on_ended(nullptr);
}

http::Upgrade E2bFront::upgrade(const http::Request& req) {
  return legacy_.upgrade(req);
}

std::optional<Caller> E2bFront::caller_of(const http::Request& req) const {
  std::string key(header(req, "X-API-KEY"));
  if (key.empty()) {
    key = api::e2b::request_token("", header(req, "Authorization"));
  }
  if (key.empty()) {
    if (options_.token.empty()) {
      return Caller{"", true};  // --no-token: the operator asked for no auth
    }
    return std::nullopt;
  }
  if (!options_.token.empty() &&
      (http::token_equals(key, options_.token) ||
       (key.starts_with(tenants::kKeyPrefix) &&
        http::token_equals(std::string_view(key).substr(tenants::kKeyPrefix.size()),
                           options_.token)))) {
    return Caller{"", true};
  }
  if (keys_ != nullptr) {
    if (auto tenant = keys_->tenant_of(key)) {
      return Caller{*tenant, false};
    }
  }
  return std::nullopt;
}

void E2bFront::handle(http::Request req, std::shared_ptr<http::Exchange> exchange) {
  const std::string sandbox_id(header(req, "E2b-Sandbox-Id"));
  const std::string_view raw(req.target().data(), req.target().size());
  const std::string path(raw.substr(0, raw.find('?')));
  if (sandbox_id == kDebugSandbox) {
    return legacy_.handle(std::move(req), std::move(exchange));
  }
  if (!sandbox_id.empty()) {
    auto target = sandboxes_.find(sandbox_id);
    if (header(req, "E2b-Sandbox-Port") == kCodeInterpreterPort) {
      if (!target) {
        // E2B's edge answers an unknown sandbox with 502; the code interpreter SDK shows the body.
        return exchange->reply(http::text_response(
            req, Status::bad_gateway, "sandbox " + sandbox_id.substr(0, 64) + " not found"));
      }
      return code_interpreter(*target, std::move(req), std::move(exchange));
    }
    if (!target && fallback_) {
      target = fallback_(sandbox_id);  // envd only: the code interpreter's ids are sandboxes'
    }
    if (path == "/health") {
      if (target && target->running) {
        return exchange->reply(http::text_response(req, Status::no_content, ""));
      }
      return exchange->reply(e2b_error(req, Status::bad_gateway,
                                       "sandbox " + sandbox_id.substr(0, 64) + " is not running",
                                       "not_running"));
    }
    if (!target || !target->running) {
      return exchange->reply(e2b_error(req, Status::bad_gateway,
                                       "sandbox " + sandbox_id.substr(0, 64) + " is not running",
                                       "not_running"));
    }
  }
  if (!sandbox_id.empty() || envd_path(path)) {
    if (envd_ != nullptr) {
      return envd_->handle(std::move(req), std::move(exchange));
    }
    return exchange->reply(e2b_error(req, Status::not_implemented,
                                     "envd " + path.substr(0, 128) + " not implemented yet",
                                     "not_implemented"));
  }
  if (router_.pattern_of(path).empty()) {
    return legacy_.handle(std::move(req), std::move(exchange));
  }
  http::Call call{std::move(req), std::move(exchange), http::Target::parse(raw), {}};
  if (!caller_of(call.req)) {
    return call.reply(e2b_error(call.req, Status::unauthorized,
                                "a valid API key is required (X-API-KEY: e2b_…)", "unauthorized"));
  }
  switch (router_.dispatch(call)) {
    case http::Router::Match::kFound:
      return;
    case http::Router::Match::kNoMethod:
      return call.reply(e2b_error(call.req, Status::method_not_allowed,
                                  "method not allowed on " + path.substr(0, 128),
                                  "method_not_allowed"));
    case http::Router::Match::kNoPath:
      return call.reply(e2b_error(call.req, Status::not_found,
                                  "no route for " + path.substr(0, 128), "no_route"));
  }
}

void E2bFront::code_interpreter(const SandboxTarget& target, http::Request req,
                                std::shared_ptr<http::Exchange> exchange) {
  std::string_view given = header(req, "X-Access-Token");
  std::string_view traffic = header(req, "E2B-Traffic-Access-Token");
  std::optional<Sandbox> sandbox;
  if (auto s = sandboxes_.get(Caller{"", true}, target.sandbox_id)) {
    sandbox = *s;
  }
  if (!sandbox) {
    return exchange->reply(http::text_response(req, Status::bad_gateway,
                                               "sandbox " + target.sandbox_id + " not found"));
  }
  const bool open = sandbox->envd_access_token.empty();
  const bool allowed =
      open || (!given.empty() && http::token_equals(given, sandbox->envd_access_token)) ||
      (!traffic.empty() && http::token_equals(traffic, sandbox->traffic_access_token)) ||
      (!options_.token.empty() && !given.empty() && http::token_equals(given, options_.token));
  if (!allowed) {
    return exchange->reply(http::text_response(
        req, Status::unauthorized, "this sandbox needs its access token (X-Access-Token)"));
  }
  if (!target.running) {
    if (!sandbox->auto_resume) {
      return exchange->reply(http::text_response(req, Status::bad_gateway,
                                                 "sandbox " + target.sandbox_id + " is paused"));
    }
    // autoResume: traffic resumes it, as on E2B.
    return offload_([this, target, req = std::move(req), exchange = std::move(exchange),
                     tenant = sandbox->tenant]() mutable {
      auto resumed = sandboxes_.connect(Caller{tenant, false}, target.sandbox_id, 0);
      if (!resumed) {
        return exchange->reply(http::text_response(
            req, Status::bad_gateway,
            "sandbox " + target.sandbox_id + " could not resume: " + resumed.error().message));
      }
      interpreter_of(target).handle(std::move(req), std::move(exchange));
    });
  }
  interpreter_of(target).handle(std::move(req), std::move(exchange));
}

api::E2bApi& E2bFront::interpreter_of(const SandboxTarget& target) {
  MutexLock lock(mu_);
  auto& slot = interpreters_[target.sandbox_id];
  if (!slot) {
    api::E2bOptions o = options_.e2b;
    o.token = "";  // checked here, per sandbox
    o.allow_missing_token = true;
    o.default_python_kernel = target.kernel_id;
    slot = std::make_unique<api::E2bApi>(kernels_, executor_, std::move(o), offload_);
  }
  return *slot;
}

void E2bFront::ended(const std::string& sandbox_id) {
  std::vector<std::string> contexts;
  {
    MutexLock lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(retired_, [&](const Retired& r) { return now - r.at > options_.retire_after; });
    auto it = interpreters_.find(sandbox_id);
    if (it == interpreters_.end()) {
      return;
    }
    contexts = it->second->context_kernels();
    retired_.push_back({now, std::move(it->second)});
    interpreters_.erase(it);
  }
  for (const auto& id : contexts) {
    (void)kernels_.shutdown(id);  // blocking: on_ended runs off the network threads
  }
}

}  // namespace cellgate::sandboxes
