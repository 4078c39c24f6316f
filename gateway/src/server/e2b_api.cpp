#include "cellgate/server/e2b_api.hpp"

#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>

#include "api_internal.hpp"
#include "cellgate/server/e2b.hpp"
#include "cellgate/server/execute.hpp"
#include "streaming.hpp"

namespace cellgate::server {
namespace {

using nlohmann::json;

constexpr double kDefaultTimeoutSeconds = 300;  // the SDK keeps its own, shorter, client timeout
constexpr std::chrono::seconds kSetupTimeout{30};

// E2B's SDK shows a plain-text body of an error response to the user (docs/e2b.md).
Response text_response(const Request& req, http::status status, const std::string& text) {
  Response res{status, req.version()};
  res.set(http::field::server, "cellgate");
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  res.keep_alive(req.keep_alive());
  res.body() = text;
  res.prepare_payload();
  return res;
}

Response error_text(const Request& req, const Error& error) {
  return text_response(req, static_cast<http::status>(http_status(error.code)), error.message);
}

std::vector<std::string> path_parts(std::string_view target) {
  auto q = target.find('?');
  std::string_view path = target.substr(0, q);
  std::vector<std::string> parts;
  while (!path.empty()) {
    auto slash = path.find('/');
    auto part = path.substr(0, slash);
    if (!part.empty()) {
      parts.emplace_back(part);
    }
    path = slash == std::string_view::npos ? std::string_view() : path.substr(slash + 1);
  }
  return parts;
}

}  // namespace

E2bApi::E2bApi(KernelManager& manager, Executor& executor, const ServeOptions& options,
               std::string token, bool allow_missing_token)
    : manager_(manager),
      executor_(executor),
      options_(options),
      token_(std::move(token)),
      allow_missing_token_(allow_missing_token) {}

E2bApi::~E2bApi() { pool_.join(); }

Handler::ChannelsCheck E2bApi::check_channels(const Request& req) {
  ChannelsCheck check;
  check.refusal = text_response(req, http::status::not_found, "no WebSocket routes here");
  return check;
}

bool E2bApi::authorized(const Request& req) const {
  if (token_.empty()) {
    return true;
  }
  auto header = [&](http::field f) {
    auto it = req.find(f);
    return it == req.end() ? std::string_view() : std::string_view(it->value());
  };
  auto x = req.find("X-Access-Token");
  const std::string given = e2b::request_token(
      x == req.end() ? std::string_view() : std::string_view(x->value()),
      header(http::field::authorization));
  if (given.empty()) {
    return allow_missing_token_;
  }
  return given.size() == token_.size() &&
         CRYPTO_memcmp(given.data(), token_.data(), token_.size()) == 0;
}

void E2bApi::handle(Request req, std::shared_ptr<Exchange> exchange) {
  const auto parts = path_parts(req.target());
  const auto method = req.method();
  if (parts.size() == 1 && parts[0] == "health") {
    exchange->reply(method == http::verb::get || method == http::verb::head
                        ? text_response(req, http::status::ok, "OK")
                        : detail::method_not_allowed(req));
    return;
  }
  if (!authorized(req)) {
    exchange->reply(text_response(req, http::status::unauthorized,
                                  "a valid access token is required (X-Access-Token)"));
    return;
  }
  if (parts.size() == 1 && parts[0] == "execute") {
    if (method != http::verb::post) {
      exchange->reply(detail::method_not_allowed(req));
      return;
    }
    execute(std::move(req), std::move(exchange));
    return;
  }
  if (parts.empty() || parts[0] != "contexts") {
    exchange->reply(text_response(req, http::status::not_found, "no route for " +
                                                                    std::string(req.target())));
    return;
  }
  if (parts.size() == 1 && method == http::verb::post) {
    create_context(std::move(req), std::move(exchange));
    return;
  }
  if (parts.size() == 1 && method == http::verb::get) {
    json list = json::array();
    {
      std::lock_guard lock(mu_);
      for (auto it = contexts_.begin(); it != contexts_.end();) {
        if (!manager_.find(it->first)) {
          it = contexts_.erase(it);  // deleted through the Jupyter API, or culled
          continue;
        }
        list.push_back(e2b::context_model(it->second.id, it->second.language, it->second.cwd));
        ++it;
      }
    }
    exchange->reply(Api::json_response(req, http::status::ok, list));
    return;
  }
  if (parts.size() < 2 || parts.size() > 3) {
    exchange->reply(text_response(req, http::status::not_found, "no such route"));
    return;
  }
  const std::string id = parts[1];
  std::optional<Context> context;
  {
    std::lock_guard lock(mu_);
    if (auto it = contexts_.find(id); it != contexts_.end()) {
      context = it->second;
    }
  }
  if (!context) {
    exchange->reply(text_response(req, http::status::not_found, "no context " + id));
    return;
  }
  if (parts.size() == 3 && parts[2] == "restart" && method == http::verb::post) {
    boost::asio::post(pool_, [this, req = std::move(req), exchange, c = *context] {
      auto restarted = manager_.restart(c.id);
      if (!restarted) {
        exchange->reply(error_text(req, restarted.error()));
        return;
      }
      if (auto cd = executor_.run_silently(c.id, e2b::chdir_code(c.cwd), kSetupTimeout); !cd) {
        spdlog::warn("context {}: after its restart, cannot change to {}: {}", c.id, c.cwd,
                     cd.error().message);
      }
      exchange->reply(text_response(req, http::status::no_content, ""));
    });
    return;
  }
  if (parts.size() == 2 && method == http::verb::delete_) {
    boost::asio::post(pool_, [this, req = std::move(req), exchange, id] {
      auto down = manager_.shutdown(id);
      {
        std::lock_guard lock(mu_);
        contexts_.erase(id);
        if (default_id_ == id) {
          default_id_.clear();
        }
      }
      exchange->reply(down ? text_response(req, http::status::no_content, "")
                           : error_text(req, down.error()));
    });
    return;
  }
  exchange->reply(detail::method_not_allowed(req));
}

Result<E2bApi::Context> E2bApi::start_context(const std::string& language,
                                              const std::string& cwd) {
  CELLGATE_ASSIGN_OR_RETURN(auto model,
                            manager_.start(manager_.default_kernel_name(), json::object()));
  if (auto cd = executor_.run_silently(model.id, e2b::chdir_code(cwd), kSetupTimeout); !cd) {
    (void)manager_.shutdown(model.id);
    return make_error(ErrorCode::kInvalidArgument, "bad_cwd",
                      "cannot use '" + cwd + "' as the context's working directory: " +
                          cd.error().message);
  }
  Context c{model.id, language, cwd};
  std::lock_guard lock(mu_);
  contexts_[c.id] = c;
  return c;
}

Result<std::string> E2bApi::default_context() {
  std::lock_guard start_lock(default_start_mu_);
  {
    std::lock_guard lock(mu_);
    if (!default_id_.empty() && manager_.find(default_id_)) {
      return default_id_;
    }
  }
  CELLGATE_ASSIGN_OR_RETURN(auto c, start_context(std::string(e2b::kLanguage),
                                                  std::string(e2b::kDefaultCwd)));
  std::lock_guard lock(mu_);
  default_id_ = c.id;
  return c.id;
}

void E2bApi::create_context(Request req, std::shared_ptr<Exchange> exchange) {
  auto body = e2b::parse_create_context_request(req.body());
  if (!body) {
    exchange->reply(error_text(req, body.error()));
    return;
  }
  boost::asio::post(pool_, [this, req = std::move(req), exchange, body = *body] {
    auto c = start_context(body.language, body.cwd);
    exchange->reply(c ? Api::json_response(req, http::status::ok,
                                           e2b::context_model(c->id, c->language, c->cwd))
                      : error_text(req, c.error()));
  });
}

void E2bApi::execute(Request req, std::shared_ptr<Exchange> exchange) {
  auto parsed = e2b::parse_run_code_request(req.body());
  if (!parsed) {
    exchange->reply(error_text(req, parsed.error()));
    return;
  }
  if (parsed->context_id && !manager_.find(*parsed->context_id)) {
    exchange->reply(text_response(req, http::status::not_found,
                                  "context " + *parsed->context_id + " not found"));
    return;
  }
  const std::string client = detail::describe_client(req, *exchange);
  Request head_req(req.base(), "");
  boost::asio::post(pool_, [this, head_req = std::move(head_req), exchange, client,
                            r = std::move(parsed).value()] {
    std::string id;
    if (r.context_id) {
      id = *r.context_id;
    } else if (auto d = default_context(); d) {
      id = *d;
    } else {
      exchange->reply(error_text(head_req, d.error()));
      return;
    }
    ExecuteRequest cell;
    cell.code = r.code;
    cell.timeout_seconds = std::min(kDefaultTimeoutSeconds, options_.execute_max_timeout);
    if (!r.env_vars.empty()) {
      cell.setup_code = e2b::env_code(r.env_vars);
      cell.teardown_code = e2b::env_restore_code(r.env_vars);
    }
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    exchange->watch([cancelled] { cancelled->store(true); });
    exchange->begin(detail::stream_head(head_req, "application/x-ndjson"));
    auto translator = std::make_shared<e2b::Translator>();
    RunOptions run;
    run.cancelled = cancelled;
    run.client = client;
    run.keepalive = std::chrono::milliseconds(
        static_cast<long long>(std::max(0.05, options_.execute_keepalive) * 1000));
    run.on_event = [exchange, translator](const json& event) {
      for (const auto& line : translator->translate(event)) {
        exchange->write(e2b::ndjson_line(line));
      }
    };
    auto answer = executor_.run(id, cell, run);
    json end = {{"type", "end"}};
    if (answer) {
      end["answer"] = std::move(answer).value();
    } else {
      end["answer"] = {{"status", "error"},
                       {"execution_count", nullptr},
                       {"error", {{"ename", "CellgateError"}, {"evalue", answer.error().message},
                                  {"traceback", json::array()}}}};
    }
    for (const auto& line : translator->translate(end)) {
      exchange->write(e2b::ndjson_line(line));
    }
    exchange->end();
  });
}

}  // namespace cellgate::server
