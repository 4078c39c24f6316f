// The E2B-compatible listener's routes (e2b_api.hpp); the protocol's translations are in e2b.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <vector>

#include "cellgate/api/e2b.hpp"
#include "cellgate/api/e2b_api.hpp"
#include "streaming.hpp"

namespace cellgate::api {
namespace {

using http::Call;
using http::Response;
using http::Status;
using http::text_response;
using http::Verb;
using nlohmann::json;

constexpr double kDefaultTimeoutSeconds = 300;  // the SDK keeps its own, shorter, client timeout
constexpr std::chrono::seconds kSetupTimeout{30};

// E2B's SDK shows a plain-text body of an error response to the user (docs/e2b.md).
Response error_text(const http::Request& req, const Error& error) {
  return text_response(req, http::status_for(error), error.message);
}

// E2B's NDJSON lines: each event and the end through one Translator.
class E2bEventEncoder : public detail::EventEncoder {
 public:
  std::string content_type() const override { return "application/x-ndjson"; }
  std::string event(const json& event) override { return lines(event); }
  std::string end(const execute::Answer& answer) override {
    if (answer) {
      return lines(translator_.end(*answer));
    }
    // Why the cell could not run, as E2B's SDK shows an error.
    execute::CellResult failed;
    failed.status = execute::CellStatus::kError;
    failed.error = execute::CellError{"CellgateError", answer.error().message, {}, 0};
    return lines(translator_.end(failed));
  }

 private:
  std::string lines(const json& event) { return lines(translator_.translate(event)); }
  static std::string lines(const std::vector<json>& translated) {
    std::string out;
    for (const auto& line : translated) {
      out += e2b::ndjson_line(line);
    }
    return out;
  }
  e2b::Translator translator_;
};

}  // namespace

E2bApi::E2bApi(kernels::KernelRegistry& registry, execute::Executor& executor, E2bOptions options,
               util::Offload offload)
    : registry_(registry),
      executor_(executor),
      options_(std::move(options)),
      offload_(std::move(offload)) {
  add_routes();
}

E2bApi::~E2bApi() = default;

http::Upgrade E2bApi::upgrade(const http::Request& req) {
  http::Upgrade up;
  up.refusal = text_response(req, Status::not_found, "no WebSocket routes here");
  return up;
}

bool E2bApi::authorized(const http::Request& req) const {
  if (options_.token.empty()) {
    return true;
  }
  auto header = [&](std::string_view name) {
    auto it = req.find(name);
    return it == req.end() ? std::string_view() : std::string_view(it->value());
  };
  const std::string given = e2b::request_token(header("X-Access-Token"), header("Authorization"));
  if (given.empty()) {
    return options_.allow_missing_token;
  }
  return http::token_equals(given, options_.token);
}

void E2bApi::handle(http::Request req, std::shared_ptr<http::Exchange> exchange) {
  if (options_.envd != nullptr) {
    // envd's port, routed by header (E2B_SANDBOX_URL mode): envd checks its own tokens.
    if (auto port = req.find("E2b-Sandbox-Port"); port != req.end() && port->value() == "49983") {
      return options_.envd->handle(std::move(req), std::move(exchange));
    }
  }
  http::Target target = http::Target::parse(req.target());
  if (options_.stats) {
    auto timed = std::make_shared<http::TimedExchange>(options_.stats, http::method_label(req),
                                                       std::move(exchange));
    const std::string_view raw(req.target().data(), req.target().size());
    timed->set_path(raw.substr(0, raw.find('?')));  // the base URL included, the query not
    if (std::string route = router_.pattern_of(target.path); !route.empty()) {
      timed->set_route(std::move(route));
    }
    exchange = std::move(timed);
  }
  Call call{std::move(req), std::move(exchange), std::move(target), {}};
  const auto parts = http::split_path(call.target.path);
  const bool health = parts.size() == 1 && parts[0] == "health";
  if (!health && !authorized(call.req)) {
    return call.reply(text_response(call.req, Status::unauthorized,
                                    "a valid access token is required (X-Access-Token)"));
  }
  switch (router_.dispatch(call)) {
    case http::Router::Match::kFound:
      return;
    case http::Router::Match::kNoMethod:
      return call.reply(http::method_not_allowed(call.req));
    case http::Router::Match::kNoPath:
      return call.reply(text_response(call.req, Status::not_found,
                                      "no route for " + std::string(call.req.target())));
  }
}

void E2bApi::add_routes() {
  router_.add({Verb::get, Verb::head}, "/health",
              [](Call& c) { c.reply(text_response(c.req, Status::ok, "OK")); });
  router_.add(Verb::post, "/execute", [this](Call& c) { execute(c); });

  router_.add(Verb::post, "/contexts", [this](Call& c) {
    auto body = e2b::parse_create_context_request(c.req.body());
    if (!body) {
      return c.reply(error_text(c.req, body.error()));
    }
    offload_([this, req = c.req, ex = c.exchange, body = *body] {
      auto ctx = start_context(body.language, body.cwd);
      ex->reply(ctx ? http::json_response(req, Status::ok,
                                          e2b::context_model(ctx->id, ctx->language, ctx->cwd))
                    : error_text(req, ctx.error()));
    });
  });

  router_.add(Verb::get, "/contexts", [this](Call& c) {
    std::vector<Context> live;
    {
      MutexLock lock(mu_);
      for (auto it = contexts_.begin(); it != contexts_.end();) {
        if (!registry_.find(it->first)) {
          it = contexts_.erase(it);  // deleted through the Jupyter API, or culled
          continue;
        }
        live.push_back(it->second);
        ++it;
      }
    }
    // In creation order, as E2B's server lists them (its SDK's tests take the last as the newest).
    std::sort(live.begin(), live.end(),
              [](const Context& a, const Context& b) { return a.created < b.created; });
    json list = json::array();
    for (const auto& ctx : live) {
      list.push_back(e2b::context_model(ctx.id, ctx.language, ctx.cwd));
    }
    c.reply(http::json_response(c.req, Status::ok, list));
  });

  auto find_context = [this](Call& c) -> std::optional<Context> {
    MutexLock lock(mu_);
    if (auto it = contexts_.find(c.param("id")); it != contexts_.end()) {
      return it->second;
    }
    c.reply(text_response(c.req, Status::not_found, "no context " + c.param("id")));
    return std::nullopt;
  };

  router_.add(Verb::post, "/contexts/{id}/restart", [this, find_context](Call& c) {
    auto ctx = find_context(c);
    if (!ctx) {
      return;
    }
    offload_([this, req = c.req, ex = c.exchange, ctx = *ctx] {
      auto restarted = registry_.restart(ctx.id);
      if (!restarted) {
        return ex->reply(error_text(req, restarted.error()));
      }
      if (auto cd = set_up(ctx); !cd) {
        spdlog::warn("context {}: after its restart, cannot change to {}: {}", ctx.id, ctx.cwd,
                     cd.error().message);
      }
      ex->reply(text_response(req, Status::no_content, ""));
    });
  });

  router_.add(Verb::delete_, "/contexts/{id}", [this, find_context](Call& c) {
    auto ctx = find_context(c);
    if (!ctx) {
      return;
    }
    offload_([this, req = c.req, ex = c.exchange, id = ctx->id] {
      auto down = registry_.shutdown(id);
      {
        MutexLock lock(mu_);
        contexts_.erase(id);
        std::erase_if(default_ids_, [&](const auto& entry) { return entry.second == id; });
      }
      ex->reply(down ? text_response(req, Status::no_content, "") : error_text(req, down.error()));
    });
  });
}

Result<std::string> E2bApi::kernelspec_for(const std::string& language) const {
  auto lower = [](std::string s) {
    for (auto& ch : s) {
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    return s;
  };
  // Python is the default kernelspec when that is a python one (the zygote serves it).
  if (auto def = registry_.kernelspec(registry_.default_kernel_name());
      def && lower(def->language) == language) {
    return def->name;
  }
  std::set<std::string> installed;
  for (const auto& spec : registry_.kernelspecs()) {  // sorted by name
    const std::string spec_language = lower(spec.language);
    if (spec_language == language) {
      return spec.name;
    }
    if (!spec_language.empty()) {
      installed.insert(spec_language);
    }
  }
  std::string names;
  for (const auto& name : installed) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return make_error(
      ErrorCode::kInvalidArgument, "unsupported_language",
      "no kernel for language '" + language + "' is installed here (languages: " + names + ")");
}

Result<void> E2bApi::set_up(const Context& ctx) {
  auto code = e2b::context_setup_code(ctx.language, ctx.cwd);
  if (!code) {
    return ok_result();
  }
  return executor_.run_silently_and_wait(ctx.id, *code, kSetupTimeout);
}

Result<E2bApi::Context> E2bApi::start_context(const std::string& language, const std::string& cwd) {
  CELLGATE_ASSIGN_OR_RETURN(const std::string spec_name, kernelspec_for(language));
  CELLGATE_ASSIGN_OR_RETURN(auto model, registry_.start(spec_name, json::object()));
  Context c{model.id, language, cwd};
  if (auto cd = set_up(c); !cd) {
    (void)registry_.shutdown(model.id);
    return make_error(
        ErrorCode::kInvalidArgument, "bad_cwd",
        "cannot use '" + cwd + "' as the context's working directory: " + cd.error().message);
  }
  MutexLock lock(mu_);
  c.created = ++created_;
  contexts_[c.id] = c;
  return c;
}

Result<std::string> E2bApi::default_context(const std::string& language) {
  MutexLock start_lock(default_start_mu_);
  {
    MutexLock lock(mu_);
    if (auto it = default_ids_.find(language);
        it != default_ids_.end() && registry_.find(it->second)) {
      return it->second;
    }
  }
  CELLGATE_ASSIGN_OR_RETURN(auto c, start_context(language, std::string(e2b::kDefaultCwd)));
  MutexLock lock(mu_);
  default_ids_[language] = c.id;
  return c.id;
}

void E2bApi::execute(Call& c) {
  auto parsed = e2b::parse_run_code_request(c.req.body());
  if (!parsed) {
    return c.reply(error_text(c.req, parsed.error()));
  }
  if (parsed->context_id && !registry_.find(*parsed->context_id)) {
    return c.reply(
        text_response(c.req, Status::not_found, "context " + *parsed->context_id + " not found"));
  }
  std::string language = parsed->language;
  if (parsed->context_id) {
    MutexLock lock(mu_);
    if (auto it = contexts_.find(*parsed->context_id); it != contexts_.end()) {
      language = it->second.language;
    }
  }
  if (!parsed->env_vars.empty() && language != e2b::kLanguage) {
    // env_code is Python.
    return c.reply(text_response(c.req, Status::bad_request,
                                 "env_vars are supported in python contexts only"));
  }
  execute::ExecuteRequest cell;
  cell.code = parsed->code;
  cell.timeout_seconds = std::min(kDefaultTimeoutSeconds, options_.execute_max_timeout);
  if (!parsed->env_vars.empty()) {
    cell.setup_code = e2b::env_code(parsed->env_vars);
    cell.teardown_code = e2b::env_restore_code(parsed->env_vars);
  }
  const auto keepalive = std::chrono::milliseconds(
      static_cast<long long>(std::max(0.05, options_.execute_keepalive) * 1000));
  auto run = [this, req = c.req, ex = c.exchange, cell = std::move(cell),
              keepalive](const std::string& id) mutable {
    detail::answer_cell(req, ex, std::make_shared<E2bEventEncoder>(), keepalive,
                        [this, id, cell = std::move(cell)](execute::RunOptions options,
                                                           execute::Done done) mutable {
                          return executor_.run(id, std::move(cell), std::move(options),
                                               std::move(done));
                        });
  };
  if (parsed->context_id) {
    return run(*parsed->context_id);
  }
  // The default context may have to be started first: off the network thread.
  offload_([this, req = c.req, ex = c.exchange, run = std::move(run), language]() mutable {
    auto id = default_context(language);
    if (!id) {
      return ex->reply(error_text(req, id.error()));
    }
    run(*id);
  });
}

}  // namespace cellgate::api
