// The Jupyter routes of the Api: /api, kernelspecs, kernels (start, list, get, delete,
// interrupt, restart), sessions; and the Api's front door (base_url, CORS, token auth, routing).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cellgate/api/api.hpp"
#include "cellgate/api/channels.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/protocol/node_ids.hpp"
#include "cellgate/protocol/ws_frames.hpp"
#include "cellgate/store/artifacts.hpp"
#include "executions.hpp"
#include "openapi_yaml.hpp"  // generated from openapi.yaml

namespace cellgate::api {
namespace {

namespace fs = std::filesystem;
using http::bad_request;
using http::body_object;
using http::Call;
using http::error_response;
using http::json_response;
using http::Request;
using http::Response;
using http::Status;
using http::Verb;
using nlohmann::json;

constexpr const char* kApiVersion = "2.14.0";  // the jupyter_server REST level we follow
constexpr const char* kGatewayVersion = "0.1.0";

// serve --list-kernels=false: Kernel Gateway's answer to a list it keeps to itself.
Error listing_forbidden(const std::string& what) {
  return make_error(ErrorCode::kPermissionDenied, "list_forbidden",
                    "listing " + what + " is turned off on this gateway (--list-kernels)");
}

std::string content_type_for(const std::string& file) {
  auto ext = fs::path(file).extension().string();
  if (ext == ".png") {
    return "image/png";
  }
  if (ext == ".svg") {
    return "image/svg+xml";
  }
  if (ext == ".js") {
    return "application/javascript";
  }
  if (ext == ".css") {
    return "text/css";
  }
  if (ext == ".json") {
    return "application/json";
  }
  return "application/octet-stream";
}

}  // namespace

Api::Api(kernels::KernelRegistry& registry, execute::Executor& executor, ApiOptions options,
         util::Offload offload)
    : registry_(registry),
      executor_(executor),
      options_(std::move(options)),
      offload_(std::move(offload)),
      executions_(std::make_shared<Executions>(
          options_.state_dir.empty() ? "" : options_.state_dir + "/executions")) {
  base_ = options_.base_url;
  while (!base_.empty() && base_.back() == '/') {
    base_.pop_back();
  }
  if (!base_.empty() && base_.front() != '/') {
    base_ = "/" + base_;
  }
  add_jupyter_routes();
  add_agent_routes();
  add_node_routes();
  add_move_routes();
}

Api::~Api() = default;

bool Api::strip_base(std::string& path) const {
  if (base_.empty()) {
    return true;
  }
  // "/prefix" serves "/prefix" and "/prefix/..." only, never "/prefixapi/...".
  if (path.rfind(base_, 0) != 0 || (path.size() > base_.size() && path[base_.size()] != '/')) {
    return false;
  }
  path = path.substr(base_.size());
  return true;
}

bool Api::origin_allowed(const Request& req) const {
  auto it = req.find(http::Field::origin);
  if (it == req.end()) {
    return true;  // not a browser: scripts, jupyter_server, agents
  }
  const std::string origin(it->value());
  for (const auto& allowed : options_.allow_origins) {
    if (allowed == "*" || allowed == origin) {
      return true;
    }
  }
  // Same origin: the Origin's host:port is the Host header.
  auto host = req.find(http::Field::host);
  if (host == req.end()) {
    return true;
  }
  auto scheme_end = origin.find("://");
  std::string netloc = scheme_end == std::string::npos ? origin : origin.substr(scheme_end + 3);
  return netloc == std::string(host->value());
}

void Api::mount(std::string path, http::Handler& handler, bool tenants) {
  mounts_[std::move(path)] = Mount{&handler, tenants};
}

void Api::decorate(const Request& req, Response& res) const {
  auto it = req.find(http::Field::origin);
  if (it == req.end() || options_.allow_origins.empty() || !origin_allowed(req)) {
    return;
  }
  res.set(http::Field::access_control_allow_origin, it->value());
  res.set(http::Field::vary, "Origin");
  res.set(http::Field::access_control_allow_headers,
          "accept, content-type, authorization, x-xsrftoken, mcp-session-id, "
          "mcp-protocol-version, last-event-id");
  res.set(http::Field::access_control_expose_headers, "Mcp-Session-Id");
  res.set(http::Field::access_control_allow_methods, "GET, PUT, POST, PATCH, DELETE, OPTIONS");
}

std::optional<Response> Api::authenticate(const Request& req, const http::Target& target,
                                          std::string* tenant) const {
  if (options_.token.empty()) {
    return std::nullopt;
  }
  std::string given;
  bool offered = false;
  if (auto it = req.find(http::Field::authorization); it != req.end()) {
    std::string value(it->value());
    auto space = value.find(' ');
    std::string scheme = value.substr(0, space);
    for (auto& c : scheme) {
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    if ((scheme == "token" || scheme == "bearer") && space != std::string::npos) {
      given = value.substr(space + 1);
      offered = !given.empty();
    }
  }
  if (!offered) {
    if (auto it = target.query.find("token"); it != target.query.end() && !it->second.empty()) {
      given = it->second;
      offered = true;
    }
  }
  if (!offered) {
    return error_response(req, make_error(ErrorCode::kUnauthenticated, "no_token",
                                          "a token is required: 'Authorization: token <token>' "
                                          "or '?token=<token>'"));
  }
  if (!http::token_equals(given, options_.token)) {
    if (tenant != nullptr && options_.keys != nullptr) {
      if (auto who = options_.keys->tenant_of(given)) {
        *tenant = *who;
        return std::nullopt;
      }
    }
    return error_response(
        req, make_error(ErrorCode::kPermissionDenied, "bad_token", "the token is not valid"));
  }
  return std::nullopt;
}

void Api::offload(std::function<Response()> work, http::Reply reply) {
  offload_([work = std::move(work), reply = std::move(reply)]() mutable { reply(work()); });
}

// An Exchange that adds the CORS headers to whatever is answered.
namespace {
class DecoratedExchange : public http::Exchange {
 public:
  DecoratedExchange(const Api& api, Request head, std::shared_ptr<http::Exchange> inner)
      : api_(api), head_(std::move(head)), inner_(std::move(inner)) {}
  void reply(Response res) override {
    api_.decorate(head_, res);
    inner_->reply(std::move(res));
  }
  void begin(Response head) override {
    api_.decorate(head_, head);
    inner_->begin(std::move(head));
  }
  bool write(std::string data) override { return inner_->write(std::move(data)); }
  void end() override { inner_->end(); }
  void watch(std::function<void()> on_gone) override { inner_->watch(std::move(on_gone)); }
  std::string peer() const override { return inner_->peer(); }

 private:
  const Api& api_;
  Request head_;
  std::shared_ptr<http::Exchange> inner_;
};
}  // namespace

void Api::handle(Request req, std::shared_ptr<http::Exchange> exchange) {
  http::Target target = http::Target::parse(req.target());
  const bool under_base = strip_base(target.path);
  std::string bare = target.path;
  while (bare.size() > 1 && bare.back() == '/') {
    bare.pop_back();
  }
  const auto mount = mounts_.find(bare);
  if (options_.stats) {
    // Timed by route pattern (GET /metrics): every answer below, refusals included.
    auto timed = std::make_shared<http::TimedExchange>(options_.stats, http::method_label(req),
                                                       std::move(exchange));
    const std::string_view raw(req.target().data(), req.target().size());
    timed->set_path(raw.substr(0, raw.find('?')));  // the base URL included, the query not
    std::string route = !under_base              ? ""
                        : mount != mounts_.end() ? mount->first
                                                 : router_.pattern_of(target.path);
    if (!route.empty()) {
      timed->set_route(std::move(route));
    }
    exchange = std::move(timed);
  }
  if (!under_base) {
    exchange->reply(error_response(
        req, make_error(ErrorCode::kNotFound, "not_found", "no route for " + target.path)));
    return;
  }
  if (!origin_allowed(req)) {
    if (options_.stats) {
      options_.stats->rejected.add("origin");
    }
    exchange->reply(error_response(req, make_error(ErrorCode::kPermissionDenied, "origin",
                                                   "origin not allowed (see --allow-origin)")));
    return;
  }
  if (req.method() == Verb::options) {
    Response res = json_response(req, Status::no_content, json());
    decorate(req, res);
    exchange->reply(std::move(res));
    return;
  }
  const auto parts = http::split_path(target.path);
  const bool open_route = parts.size() == 1 && parts[0] == "api" && req.method() == Verb::get;
  std::string tenant;  // "" : the gateway's token (or an open route)
  if (!open_route) {
    if (auto refusal = authenticate(req, target, &tenant)) {
      if (options_.stats) {
        options_.stats->rejected.add("unauthenticated");
      }
      // MCP (basic/authorization): an invalid token is 401, not 403.
      if (mount != mounts_.end() && refusal->result() == Status::forbidden) {
        refusal->result(Status::unauthorized);
      }
      decorate(req, *refusal);
      exchange->reply(std::move(*refusal));
      return;
    }
  }
  if (mount != mounts_.end()) {
    req.erase(http::kTenantField);  // only ours is trusted
    if (!tenant.empty()) {
      if (!mount->second.tenants) {
        // /metrics is the operator's.
        Response refusal = error_response(
            req, make_error(ErrorCode::kPermissionDenied, "tenant_key",
                            "this route is the operator's; a tenant's API key is refused here"));
        decorate(req, refusal);
        exchange->reply(std::move(refusal));
        return;
      }
      req.set(http::kTenantField, tenant);
    }
    auto decorated =
        std::make_shared<DecoratedExchange>(*this, Request(req.base(), ""), std::move(exchange));
    mount->second.handler->handle(std::move(req), std::move(decorated));
    return;
  }
  Call call{std::move(req), nullptr, std::move(target), {}};
  call.exchange =
      std::make_shared<DecoratedExchange>(*this, Request(call.req.base(), ""), std::move(exchange));
  if (!tenant.empty()) {
    if (auto refusal = tenant_gate(call, tenant)) {
      call.reply(std::move(*refusal));
      return;
    }
  }
  switch (router_.dispatch(call)) {
    case http::Router::Match::kFound:
      return;
    case http::Router::Match::kNoMethod:
      call.reply(http::method_not_allowed(call.req));
      return;
    case http::Router::Match::kNoPath:
      call.fail(make_error(ErrorCode::kNotFound, "not_found", "no route for " + call.target.path));
      return;
  }
}

http::Upgrade Api::upgrade(const Request& req) {
  const auto start = std::chrono::steady_clock::now();
  http::Upgrade up = decide_upgrade(req);
  if (options_.stats) {
    // The decision, timed like a request: 101 when accepted (the connection's life is not).
    http::Target target = http::Target::parse(req.target());
    std::string route = strip_base(target.path) ? router_.pattern_of(target.path) : "";
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    options_.stats->requests.observe({http::method_label(req), route.empty() ? "other" : route,
                                      std::to_string(up.refusal ? up.refusal->result_int() : 101)},
                                     took.count());
  }
  return up;
}

http::Upgrade Api::decide_upgrade(const Request& req) {
  http::Upgrade up;
  http::Target target = http::Target::parse(req.target());
  const bool under_base = strip_base(target.path);
  const auto parts = http::split_path(target.path);
  if (!under_base || parts.size() != 4 || parts[0] != "api" || parts[1] != "kernels" ||
      parts[3] != "channels") {
    up.refusal = error_response(req, make_error(ErrorCode::kNotFound, "not_found",
                                                "no WebSocket route for " + target.path));
    return up;
  }
  if (!origin_allowed(req)) {
    up.refusal = error_response(req, make_error(ErrorCode::kPermissionDenied, "origin",
                                                "origin not allowed (see --allow-origin)"));
    return up;
  }
  std::string tenant;
  if (auto refusal = authenticate(req, target, &tenant)) {
    up.refusal = std::move(refusal);
    return up;
  }
  if (!tenant.empty() && !tenant_owns(tenant, parts[2])) {
    up.refusal = error_response(req, make_error(ErrorCode::kNotFound, "no_such_kernel",
                                                "Kernel does not exist: " + parts[2]));
    return up;
  }
  auto k = registry_.find(parts[2]);
  if (!k) {
    up.refusal = error_response(req, k.error());
    return up;
  }
  std::string session_id;
  if (auto it = target.query.find("session_id"); it != target.query.end()) {
    session_id = it->second;
  }
  const bool v1 = offers_v1(req);
  up.handler = make_channel_bridge(
      std::move(k).value(), std::move(session_id), v1,
      [this, id = parts[2]]() { offload_([this, id]() { (void)registry_.resume(id); }); },
      [this, id = parts[2]]() { return registry_.usage(id); });
  up.subprotocol = v1 ? std::string(protocol::kV1Subprotocol) : "";
  return up;
}

void Api::add_jupyter_routes() {
  router_.add(Verb::get, "/api", [](Call& c) {
    c.reply(json_response(c.req, Status::ok,
                          json{{"version", kApiVersion}, {"gateway_version", kGatewayVersion}}));
  });
  // This API as OpenAPI 3 (gateway/api/openapi.yaml), where jupyter_server serves its own.
  router_.add(Verb::get, "/api/spec.yaml", [](Call& c) {
    c.reply(http::bytes_response(c.req, std::string(kOpenApiYaml), "text/x-yaml"));
  });

  // ---- kernelspecs ----
  router_.add(Verb::get, "/api/kernelspecs", [this](Call& c) {
    json specs = json::object();
    for (const auto& spec : registry_.kernelspecs()) {
      specs[spec.name] = spec_model(spec);
    }
    c.reply(
        json_response(c.req, Status::ok,
                      json{{"default", registry_.default_kernel_name()}, {"kernelspecs", specs}}));
  });
  router_.add(Verb::get, "/api/kernelspecs/{name}", [this](Call& c) {
    auto spec = registry_.kernelspec(c.param("name"));
    if (!spec) {
      return c.fail(spec.error());
    }
    c.reply(json_response(c.req, Status::ok, spec_model(*spec)));
  });
  router_.add({Verb::get, Verb::head}, "/kernelspecs/{name}/{file}", [this](Call& c) {
    auto spec = registry_.kernelspec(c.param("name"));
    const std::string& file = c.param("file");
    std::error_code ec;
    if (!spec || spec->resource_dir.empty() || file.find('/') != std::string::npos ||
        file.starts_with(".") || !fs::is_regular_file(spec->resource_dir + "/" + file, ec)) {
      return c.fail(make_error(ErrorCode::kNotFound, "not_found", "no such file"));
    }
    std::ifstream in(spec->resource_dir + "/" + file, std::ios::binary);
    if (!in) {
      return c.fail(make_error(ErrorCode::kNotFound, "not_found", "no such file"));
    }
    Response res{Status::ok, c.req.version()};
    res.set(http::Field::content_type, content_type_for(file));
    res.set(http::Field::cache_control, "max-age=2592000");
    res.body().assign(std::istreambuf_iterator<char>(in), {});
    res.keep_alive(c.req.keep_alive());
    res.prepare_payload();
    if (c.req.method() == Verb::head) {
      res.body().clear();
    }
    c.reply(std::move(res));
  });

  // ---- kernels ----
  router_.add(Verb::get, "/api/kernels", [this](Call& c) {
    if (!options_.list_kernels) {
      return c.fail(listing_forbidden("kernels"));
    }
    json list = json::array();
    for (const auto& m : registry_.list()) {
      list.push_back(m.to_json());
    }
    reply_list(c, "/api/kernels", std::move(list));
  });
  router_.add(Verb::post, "/api/kernels", [this](Call& c) {
    auto body = body_object(c.req);
    if (!body) {
      return c.fail(body.error());
    }
    if (body->contains("name") && !(*body)["name"].is_string()) {
      return c.fail(bad_request("'name' must be a string"));
    }
    if (body->contains("snapshot") && !(*body)["snapshot"].is_string()) {
      return c.fail(bad_request("'snapshot' must be a snapshot id"));
    }
    std::string name = body->value("name", "");
    json env = body->value("env", json());
    std::string snapshot = body->value("snapshot", "");
    offload(
        [this, req = c.req, name, env, snapshot]() {
          // cellgate's addition: {"snapshot": id} starts a copy of the snapshot's kernel.
          auto model = snapshot.empty() ? registry_.start(name, env)
                                        : registry_.start_from_snapshot(snapshot, name, env);
          if (!model) {
            return error_response(req, model.error());
          }
          Response res = json_response(req, Status::created, model->to_json());
          res.set(http::Field::location, base_ + "/api/kernels/" + model->id);
          return res;
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
  router_.add(Verb::get, "/api/kernels/{id}", [this](Call& c) {
    auto k = registry_.find(c.param("id"));
    if (!k) {
      return c.fail(k.error());
    }
    c.reply(json_response(c.req, Status::ok, k.value()->model().to_json()));
  });
  router_.add(Verb::delete_, "/api/kernels/{id}", [this](Call& c) {
    const std::string id = c.param("id");
    if (auto k = registry_.find(id); !k) {
      return c.fail(k.error());
    }
    offload(
        [this, req = c.req, id]() {
          auto r = registry_.shutdown(id);
          executor_.artifacts().forget(id);  // the content stays, by SHA-256
          return r ? json_response(req, Status::no_content, json())
                   : error_response(req, r.error());
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
  router_.add(Verb::post, "/api/kernels/{id}/interrupt", [this](Call& c) {
    offload(
        [this, req = c.req, id = c.param("id")]() {
          auto r = registry_.interrupt(id);
          return r ? json_response(req, Status::no_content, json())
                   : error_response(req, r.error());
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
  router_.add(Verb::post, "/api/kernels/{id}/restart", [this](Call& c) {
    offload(
        [this, req = c.req, id = c.param("id")]() {
          auto model = registry_.restart(id);
          return model ? json_response(req, Status::ok, model->to_json())
                       : error_response(req, model.error());
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
  // cellgate's addition (README, "Hibernate"): the kernel checkpointed to disk; its model stays,
  // idle with "hibernated": true, until the first touch resumes it.
  router_.add(Verb::post, "/api/kernels/{id}/hibernate", [this](Call& c) {
    offload(
        [this, req = c.req, id = c.param("id")]() {
          auto model = registry_.hibernate(id);
          return model ? json_response(req, Status::ok, model->to_json())
                       : error_response(req, model.error());
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
  // cellgate's additions (README, "Snapshots and fork"): a running kernel's state kept while it
  // runs on, started again as new kernels; a fork is a snapshot started `count` times at once.
  router_.add(Verb::post, "/api/kernels/{id}/snapshots", [this](Call& c) {
    offload(
        [this, req = c.req, id = c.param("id")]() {
          auto snap = registry_.snapshot(id);
          if (!snap) {
            return error_response(req, snap.error());
          }
          Response res = json_response(req, Status::created, snap->to_json());
          res.set(http::Field::location, base_ + "/api/snapshots/" + snap->id);
          return res;
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
  router_.add(Verb::get, "/api/snapshots", [this](Call& c) {
    json all = json::array();
    for (const auto& s : registry_.snapshots()) {
      all.push_back(s.to_json());
    }
    c.reply(json_response(c.req, Status::ok, all));
  });
  router_.add(Verb::delete_, "/api/snapshots/{id}", [this](Call& c) {
    auto r = registry_.delete_snapshot(c.param("id"));
    c.reply(r ? json_response(c.req, Status::no_content, json())
              : error_response(c.req, r.error()));
  });
  router_.add(Verb::post, "/api/kernels/{id}/fork", [this](Call& c) {
    json body = json::object();
    if (!c.req.body().empty()) {
      auto parsed = body_object(c.req);
      if (!parsed) {
        return c.fail(parsed.error());
      }
      body = *parsed;
    }
    if (body.contains("count") && !body["count"].is_number_integer()) {
      return c.fail(bad_request("'count' must be an integer from 1 to 16"));
    }
    const int count = body.value("count", 1);
    offload(
        [this, req = c.req, id = c.param("id"), count]() {
          auto copies = registry_.fork(id, count);
          if (!copies) {
            return error_response(req, copies.error());
          }
          json models = json::array();
          for (const auto& m : *copies) {
            models.push_back(m.to_json());
          }
          return json_response(req, Status::created, models);
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
  router_.add(Verb::get, "/api/kernels/{id}/channels",
              [](Call& c) { c.fail(bad_request("this route needs a WebSocket upgrade")); });

  // ---- sessions ----
  router_.add(Verb::get, "/api/sessions", [this](Call& c) {
    if (!options_.list_kernels) {
      return c.fail(listing_forbidden("sessions"));
    }
    std::vector<Session> all;
    {
      MutexLock lock(sessions_mu_);
      for (const auto& [id, s] : sessions_) {
        all.push_back(s);
      }
    }
    json list = json::array();
    for (const auto& s : all) {
      list.push_back(session_model(s));
    }
    reply_list(c, "/api/sessions", std::move(list));
  });
  router_.add(Verb::post, "/api/sessions", [this](Call& c) { sessions_post(c); });
  router_.add(Verb::get, "/api/sessions/{id}", [this](Call& c) {
    MutexLock lock(sessions_mu_);
    auto it = sessions_.find(c.param("id"));
    if (it == sessions_.end()) {
      return c.fail(
          protocol::unknown_id(c.param("id"), make_error(ErrorCode::kNotFound, "no_such_session",
                                                         "Session not found: " + c.param("id"))));
    }
    c.reply(json_response(c.req, Status::ok, session_model(it->second)));
  });
  router_.add(Verb::delete_, "/api/sessions/{id}", [this](Call& c) {
    Session s;
    {
      MutexLock lock(sessions_mu_);
      auto it = sessions_.find(c.param("id"));
      if (it == sessions_.end()) {
        return c.fail(
            protocol::unknown_id(c.param("id"), make_error(ErrorCode::kNotFound, "no_such_session",
                                                           "Session not found: " + c.param("id"))));
      }
      s = it->second;
      sessions_.erase(it);
    }
    offload(
        [this, req = c.req, s]() {
          auto r = registry_.shutdown(s.kernel_id);
          if (!r && r.error().code == ErrorCode::kNotFound) {
            return json_response(
                req, Status::gone,
                json{{"reason", "Gone"}, {"message", "the session's kernel was already deleted"}});
          }
          return json_response(req, Status::no_content, json());
        },
        [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
  });
  router_.add(Verb::patch, "/api/sessions/{id}", [this](Call& c) { sessions_patch(c); });
}

json Api::spec_model(const kernel::KernelSpec& spec) const {
  json resources = json::object();
  std::error_code ec;
  for (const char* logo : {"logo-32x32.png", "logo-64x64.png", "logo-svg.svg"}) {
    if (!spec.resource_dir.empty() && fs::exists(spec.resource_dir + "/" + logo, ec)) {
      std::string key = logo;
      key = key.substr(0, key.rfind('.'));
      resources[key] = base_ + "/kernelspecs/" + spec.name + "/" + logo;
    }
  }
  const bool jailed = options_.jailed;
  json metadata = spec.metadata.is_object() ? spec.metadata : json::object();
  if (jailed) {
    // JupyterLab shows its debugger for a kernelspec whose metadata.debugger is true. In the jail
    // debugpy works only with the loopback network (jail/README.md): say true exactly then.
    const auto cellgate = metadata.find("cellgate");
    const bool loopback = cellgate != metadata.end() && cellgate->is_object() &&
                          cellgate->value("debugger", json(false)) == json(true);
    metadata["debugger"] = loopback && options_.allow_debugger;
  }
  return json{{"name", spec.name},
              {"spec",
               {{"argv", spec.argv},
                {"display_name", spec.display_name + (jailed ? " (cellgate, jailed)" : "")},
                {"language", spec.language},
                {"interrupt_mode", spec.interrupt_mode},
                {"env", json::object()},
                {"metadata", metadata}}},
              {"resources", resources}};
}

json Api::session_model(const Session& s) const {
  json kernel_model;
  if (auto k = registry_.find(s.kernel_id)) {
    kernel_model = k.value()->model().to_json();
  } else {
    kernel_model = {{"id", s.kernel_id},
                    {"name", ""},
                    {"execution_state", "dead"},
                    {"connections", 0},
                    {"last_activity", protocol::iso8601_now()}};
  }
  json j = {
      {"id", s.id}, {"path", s.path}, {"name", s.name}, {"type", s.type}, {"kernel", kernel_model}};
  if (s.type == "notebook") {
    j["notebook"] = {{"path", s.path}, {"name", s.name}};
  }
  return j;
}

void Api::sessions_post(Call& c) {
  auto body = body_object(c.req);
  if (!body) {
    return c.fail(body.error());
  }
  const json& b = *body;
  if (!b.contains("path") || !b["path"].is_string() || !b.contains("type") ||
      !b["type"].is_string()) {
    return c.fail(bad_request("a session needs 'path' and 'type' strings"));
  }
  Session s;
  s.path = b["path"].get<std::string>();
  s.type = b["type"].get<std::string>();
  s.name = b.contains("name") && b["name"].is_string() ? b["name"].get<std::string>() : "";
  json kernel = b.value("kernel", json::object());
  if (!kernel.is_object()) {
    return c.fail(bad_request("'kernel' must be an object"));
  }
  offload(
      [this, req = c.req, s, kernel]() mutable {
        {
          // The same path returns the existing session.
          MutexLock lock(sessions_mu_);
          for (const auto& [id, existing] : sessions_) {
            if (existing.path == s.path && registry_.find(existing.kernel_id)) {
              return json_response(req, Status::created, session_model(existing));
            }
          }
        }
        if (kernel.contains("id") && kernel["id"].is_string()) {
          s.kernel_id = kernel["id"].get<std::string>();
          if (auto k = registry_.find(s.kernel_id); !k) {
            return error_response(req, k.error());
          }
        } else {
          std::string name = kernel.value("name", "");
          auto model = registry_.start(name, json());
          if (!model) {
            return error_response(req, model.error());
          }
          s.kernel_id = model->id;
        }
        s.id = protocol::new_node_id();
        {
          MutexLock lock(sessions_mu_);
          sessions_[s.id] = s;
        }
        Response res = json_response(req, Status::created, session_model(s));
        res.set(http::Field::location, base_ + "/api/sessions/" + s.id);
        return res;
      },
      [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
}

void Api::sessions_patch(Call& c) {
  Session s;
  {
    MutexLock lock(sessions_mu_);
    auto it = sessions_.find(c.param("id"));
    if (it == sessions_.end()) {
      return c.fail(
          protocol::unknown_id(c.param("id"), make_error(ErrorCode::kNotFound, "no_such_session",
                                                         "Session not found: " + c.param("id"))));
    }
    s = it->second;
  }
  auto body = body_object(c.req);
  if (!body) {
    return c.fail(body.error());
  }
  json b = *body;
  offload(
      [this, req = c.req, s, b]() mutable {
        for (const char* key : {"path", "name", "type"}) {
          if (b.contains(key) && b[key].is_string()) {
            std::string v = b[key].get<std::string>();
            if (std::string(key) == "path") {
              s.path = v;
            } else if (std::string(key) == "name") {
              s.name = v;
            } else {
              s.type = v;
            }
          }
        }
        if (b.contains("kernel") && b["kernel"].is_object()) {
          const json& k = b["kernel"];
          if (k.contains("id") && k["id"].is_string()) {
            std::string kid = k["id"].get<std::string>();
            if (!registry_.find(kid)) {
              return error_response(req, bad_request("no kernel with id " + kid));
            }
            s.kernel_id = kid;
          } else if (k.contains("name") && k["name"].is_string()) {
            auto model = registry_.start(k["name"].get<std::string>(), json());
            if (!model) {
              return error_response(req, model.error());
            }
            (void)registry_.shutdown(s.kernel_id);
            s.kernel_id = model->id;
          }
        }
        {
          MutexLock lock(sessions_mu_);
          sessions_[s.id] = s;
        }
        return json_response(req, Status::ok, session_model(s));
      },
      [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
}

}  // namespace cellgate::api
