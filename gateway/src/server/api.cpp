#include "cellgate/server/api.hpp"

#include <openssl/crypto.h>

#include <boost/asio/post.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cellgate/protocol/message.hpp"
#include "cellgate/server/artifacts.hpp"
#include "cellgate/server/execute.hpp"
#include "api_internal.hpp"

namespace cellgate::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using detail::bad_request;
using detail::body_object;
using detail::method_not_allowed;

constexpr const char* kApiVersion = "2.14.0";  // the jupyter_server REST level we follow
constexpr const char* kGatewayVersion = "0.1.0";

int hex_value(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

std::string percent_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() &&
        hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2])));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string current;
  for (char c : path) {
    if (c == '/') {
      if (!current.empty()) {
        parts.push_back(percent_decode(current, false));
      }
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) {
    parts.push_back(percent_decode(current, false));
  }
  return parts;
}

bool equal_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    return false;
  }
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
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

Target Target::parse(std::string_view target) {
  Target t;
  auto q = target.find('?');
  t.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) {
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
      auto amp = query.find('&');
      std::string_view item = query.substr(0, amp);
      auto eq = item.find('=');
      std::string key = percent_decode(item.substr(0, eq), true);
      std::string value = eq == std::string_view::npos ? "" : percent_decode(item.substr(eq + 1), true);
      if (!key.empty()) {
        t.query[key] = value;  // unknown parameters (cache-busters) are kept and ignored
      }
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    }
  }
  return t;
}

Api::Api(KernelManager& manager, const ServeOptions& options, std::string token)
    : manager_(manager), options_(options), token_(std::move(token)) {
  auto executor = Executor::create(manager_);
  if (!executor) {
    throw std::invalid_argument(executor.error().message);
  }
  executor_ = std::move(executor).value();
  base_ = options_.base_url;
  while (!base_.empty() && base_.back() == '/') {
    base_.pop_back();
  }
  if (!base_.empty() && base_.front() != '/') {
    base_ = "/" + base_;
  }
}

Api::~Api() { pool_.join(); }

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

Response Api::json_response(const Request& req, http::status status, const json& body) {
  Response res{status, req.version()};
  res.set(http::field::server, "cellgate");
  res.set(http::field::content_type, "application/json");
  res.keep_alive(req.keep_alive());
  if (status != http::status::no_content) {
    res.body() = body.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  res.prepare_payload();
  return res;
}

Response Api::error_response(const Request& req, const Error& error) {
  auto status = static_cast<http::status>(http_status(error.code));
  if (error.reason == "too_large") {
    status = http::status::payload_too_large;
  } else if (error.reason == "no_space") {
    status = http::status::insufficient_storage;
  }
  return json_response(req, status,
                       json{{"reason", std::string(http::obsolete_reason(status))},
                            {"message", error.message},
                            {"error", error.reason}});
}

bool Api::origin_allowed(const Request& req) const {
  auto it = req.find(http::field::origin);
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
  auto host = req.find(http::field::host);
  if (host == req.end()) {
    return true;
  }
  auto scheme_end = origin.find("://");
  std::string netloc = scheme_end == std::string::npos ? origin : origin.substr(scheme_end + 3);
  return netloc == std::string(host->value());
}

void Api::decorate(const Request& req, Response& res) const {
  auto it = req.find(http::field::origin);
  if (it == req.end() || options_.allow_origins.empty() || !origin_allowed(req)) {
    return;
  }
  res.set(http::field::access_control_allow_origin, it->value());
  res.set(http::field::vary, "Origin");
  res.set(http::field::access_control_allow_headers,
          "accept, content-type, authorization, x-xsrftoken");
  res.set(http::field::access_control_allow_methods, "GET, PUT, POST, PATCH, DELETE, OPTIONS");
}

std::optional<Response> Api::authenticate(const Request& req, const Target& target) const {
  if (token_.empty()) {
    return std::nullopt;
  }
  std::string given;
  bool offered = false;
  if (auto it = req.find(http::field::authorization); it != req.end()) {
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
  if (!equal_constant_time(given, token_)) {
    return error_response(req, make_error(ErrorCode::kPermissionDenied, "bad_token",
                                          "the token is not valid"));
  }
  return std::nullopt;
}

void Api::offload(std::function<Response()> work, Reply reply) {
  boost::asio::post(pool_, [work = std::move(work), reply = std::move(reply)]() mutable {
    reply(work());
  });
}

void Api::handle(Request req, std::shared_ptr<Exchange> exchange) {
  Target target = Target::parse(req.target());
  if (!strip_base(target.path)) {
    exchange->reply(error_response(req, make_error(ErrorCode::kNotFound, "not_found",
                                         "no route for " + target.path)));
    return;
  }
  if (!origin_allowed(req)) {
    exchange->reply(error_response(req, make_error(ErrorCode::kPermissionDenied, "origin",
                                         "origin not allowed (see --allow-origin)")));
    return;
  }
  if (req.method() == http::verb::options) {
    Response res = json_response(req, http::status::no_content, json());
    decorate(req, res);
    exchange->reply(std::move(res));
    return;
  }
  const auto parts = split_path(target.path);
  const bool open_route = parts.size() == 1 && parts[0] == "api" &&
                          req.method() == http::verb::get;
  if (!open_route) {
    if (auto refusal = authenticate(req, target)) {
      decorate(req, *refusal);
      exchange->reply(std::move(*refusal));
      return;
    }
  }
  auto decorated = [this, req_copy = Request(req.base(), ""), exchange](Response res) mutable {
    decorate(req_copy, res);
    exchange->reply(std::move(res));
  };
  route(std::move(req), target, std::move(decorated), std::move(exchange));
}

void Api::route(Request req, const Target& target, Reply reply,
                std::shared_ptr<Exchange> exchange) {
  const auto parts = split_path(target.path);
  if (parts.size() >= 1 && parts[0] == "api") {
    if (parts.size() == 1) {
      reply(json_response(req, http::status::ok,
                          json{{"version", kApiVersion}, {"gateway_version", kGatewayVersion}}));
      return;
    }
    if (parts[1] == "kernels") {
      kernels(std::move(req), parts, std::move(reply), std::move(exchange));
      return;
    }
    if (parts[1] == "execute" && parts.size() == 2) {
      execute_once(std::move(req), std::move(reply), std::move(exchange));
      return;
    }
    if (parts[1] == "artifacts") {
      artifact(req, parts, std::move(reply));
      return;
    }
    if (parts[1] == "sessions") {
      sessions(std::move(req), parts, std::move(reply));
      return;
    }
    if (parts[1] == "kernelspecs") {
      kernelspecs(req, parts, std::move(reply));
      return;
    }
  }
  if (parts.size() == 3 && parts[0] == "kernelspecs") {
    kernelspec_file(req, parts, std::move(reply));
    return;
  }
  reply(error_response(req, make_error(ErrorCode::kNotFound, "not_found",
                                       "no route for " + target.path)));
}

// ---- kernelspecs -----------------------------------------------------------------------------

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
  const bool jailed = !options_.no_jail;
  return json{{"name", spec.name},
              {"spec",
               {{"argv", spec.argv},
                {"display_name", spec.display_name + (jailed ? " (cellgate, jailed)" : "")},
                {"language", spec.language},
                {"interrupt_mode", spec.interrupt_mode},
                {"env", json::object()},
                {"metadata", spec.metadata}}},
              {"resources", resources}};
}

void Api::kernelspecs(const Request& req, const std::vector<std::string>& parts, Reply reply) {
  if (req.method() != http::verb::get) {
    reply(method_not_allowed(req));
    return;
  }
  if (parts.size() == 2) {
    json specs = json::object();
    for (const auto& spec : manager_.kernelspecs()) {
      specs[spec.name] = spec_model(spec);
    }
    reply(json_response(req, http::status::ok,
                        json{{"default", manager_.default_kernel_name()}, {"kernelspecs", specs}}));
    return;
  }
  if (parts.size() == 3) {
    auto spec = manager_.kernelspec(parts[2]);
    if (!spec) {
      reply(error_response(req, spec.error()));
      return;
    }
    reply(json_response(req, http::status::ok, spec_model(*spec)));
    return;
  }
  reply(error_response(req, make_error(ErrorCode::kNotFound, "not_found", "no such route")));
}

void Api::kernelspec_file(const Request& req, const std::vector<std::string>& parts,
                          Reply reply) {
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    reply(method_not_allowed(req));
    return;
  }
  auto spec = manager_.kernelspec(parts[1]);
  const std::string& file = parts[2];
  std::error_code ec;
  if (!spec || spec->resource_dir.empty() || file.find('/') != std::string::npos ||
      file.starts_with(".") ||
      !fs::is_regular_file(spec->resource_dir + "/" + file, ec)) {
    reply(error_response(req, make_error(ErrorCode::kNotFound, "not_found", "no such file")));
    return;
  }
  std::ifstream in(spec->resource_dir + "/" + file, std::ios::binary);
  if (!in) {
    reply(error_response(req, make_error(ErrorCode::kNotFound, "not_found", "no such file")));
    return;
  }
  Response res{http::status::ok, req.version()};
  res.set(http::field::content_type, content_type_for(file));
  res.set(http::field::cache_control, "max-age=2592000");
  res.body().assign(std::istreambuf_iterator<char>(in), {});
  res.keep_alive(req.keep_alive());
  res.prepare_payload();
  if (req.method() == http::verb::head) {
    res.body().clear();
  }
  reply(std::move(res));
}

// ---- kernels ---------------------------------------------------------------------------------

void Api::kernels(Request req, const std::vector<std::string>& parts, Reply reply,
                  std::shared_ptr<Exchange> exchange) {
  const auto method = req.method();
  auto not_allowed = [&] { reply(method_not_allowed(req)); };
  if (parts.size() == 2) {
    if (method == http::verb::get) {
      json list = json::array();
      for (const auto& m : manager_.list()) {
        list.push_back(m.to_json());
      }
      reply(json_response(req, http::status::ok, list));
      return;
    }
    if (method != http::verb::post) {
      not_allowed();
      return;
    }
    auto body = body_object(req);
    if (!body) {
      reply(error_response(req, body.error()));
      return;
    }
    if (body->contains("name") && !(*body)["name"].is_string()) {
      reply(error_response(req, bad_request("'name' must be a string")));
      return;
    }
    std::string name = body->value("name", "");
    json env = body->value("env", json());
    offload(
        [this, req = std::move(req), name, env]() {
          auto model = manager_.start(name, env);
          if (!model) {
            return error_response(req, model.error());
          }
          Response res = json_response(req, http::status::created, model->to_json());
          res.set(http::field::location, base_ + "/api/kernels/" + model->id);
          return res;
        },
        std::move(reply));
    return;
  }
  const std::string id = parts[2];
  if (parts.size() == 3) {
    if (method == http::verb::get) {
      auto k = manager_.find(id);
      if (!k) {
        reply(error_response(req, k.error()));
        return;
      }
      reply(json_response(req, http::status::ok, k.value()->model().to_json()));
      return;
    }
    if (method == http::verb::delete_) {
      if (auto k = manager_.find(id); !k) {
        reply(error_response(req, k.error()));
        return;
      }
      offload(
          [this, req = std::move(req), id]() {
            auto r = manager_.shutdown(id);
            executor_->artifacts().forget(id);  // the content stays, by SHA-256
            return r ? json_response(req, http::status::no_content, json())
                     : error_response(req, r.error());
          },
          std::move(reply));
      return;
    }
    not_allowed();
    return;
  }
  if (parts.size() == 4 && method == http::verb::post && parts[3] == "interrupt") {
    offload(
        [this, req = std::move(req), id]() {
          auto r = manager_.interrupt(id);
          return r ? json_response(req, http::status::no_content, json())
                   : error_response(req, r.error());
        },
        std::move(reply));
    return;
  }
  if (parts.size() == 4 && method == http::verb::post && parts[3] == "restart") {
    offload(
        [this, req = std::move(req), id]() {
          auto model = manager_.restart(id);
          return model ? json_response(req, http::status::ok, model->to_json())
                       : error_response(req, model.error());
        },
        std::move(reply));
    return;
  }
  if (parts.size() == 4 && method == http::verb::post && parts[3] == "execute") {
    execute(std::move(req), id, std::move(reply), std::move(exchange));
    return;
  }
  if (parts.size() == 4 && parts[3] == "artifacts") {
    if (method != http::verb::get) {
      not_allowed();
      return;
    }
    kernel_artifacts(req, id, std::move(reply));
    return;
  }
  if (parts.size() >= 4 && parts[3] == "files") {
    files(std::move(req), parts, std::move(reply));
    return;
  }
  if (parts.size() == 4 && parts[3] == "channels") {
    reply(error_response(req, bad_request("this route needs a WebSocket upgrade")));
    return;
  }
  reply(error_response(req, make_error(ErrorCode::kNotFound, "not_found", "no such route")));
}

Api::ChannelsCheck Api::check_channels(const Request& req) {
  ChannelsCheck check;
  Target target = Target::parse(req.target());
  const bool under_base = strip_base(target.path);
  const auto parts = split_path(target.path);
  if (!under_base || parts.size() != 4 || parts[0] != "api" || parts[1] != "kernels" || parts[3] != "channels") {
    check.refusal = error_response(req, make_error(ErrorCode::kNotFound, "not_found",
                                                   "no WebSocket route for " + target.path));
    return check;
  }
  if (!origin_allowed(req)) {
    check.refusal = error_response(req, make_error(ErrorCode::kPermissionDenied, "origin",
                                                   "origin not allowed (see --allow-origin)"));
    return check;
  }
  if (auto refusal = authenticate(req, target)) {
    check.refusal = std::move(refusal);
    return check;
  }
  auto k = manager_.find(parts[2]);
  if (!k) {
    check.refusal = error_response(req, k.error());
    return check;
  }
  check.kernel = std::move(k).value();
  if (auto it = target.query.find("session_id"); it != target.query.end()) {
    check.session_id = it->second;
  }
  return check;
}

// ---- sessions --------------------------------------------------------------------------------

json Api::session_model(const Session& s) const {
  json kernel_model;
  if (auto k = manager_.find(s.kernel_id)) {
    kernel_model = k.value()->model().to_json();
  } else {
    kernel_model = {{"id", s.kernel_id}, {"name", ""}, {"execution_state", "dead"},
                    {"connections", 0}, {"last_activity", protocol::iso8601_now()}};
  }
  json j = {{"id", s.id}, {"path", s.path}, {"name", s.name}, {"type", s.type},
            {"kernel", kernel_model}};
  if (s.type == "notebook") {
    j["notebook"] = {{"path", s.path}, {"name", s.name}};
  }
  return j;
}

void Api::sessions(Request req, const std::vector<std::string>& parts, Reply reply) {
  const auto method = req.method();
  if (parts.size() == 2 && method == http::verb::get) {
    json list = json::array();
    std::vector<Session> all;
    {
      std::lock_guard lock(sessions_mu_);
      for (const auto& [id, s] : sessions_) {
        all.push_back(s);
      }
    }
    for (const auto& s : all) {
      list.push_back(session_model(s));
    }
    reply(json_response(req, http::status::ok, list));
    return;
  }
  if (parts.size() == 2 && method == http::verb::post) {
    auto body = body_object(req);
    if (!body) {
      reply(error_response(req, body.error()));
      return;
    }
    const json& b = *body;
    if (!b.contains("path") || !b["path"].is_string() || !b.contains("type") ||
        !b["type"].is_string()) {
      reply(error_response(req, bad_request("a session needs 'path' and 'type' strings")));
      return;
    }
    Session s;
    s.path = b["path"].get<std::string>();
    s.type = b["type"].get<std::string>();
    s.name = b.contains("name") && b["name"].is_string() ? b["name"].get<std::string>() : "";
    json kernel = b.value("kernel", json::object());
    if (!kernel.is_object()) {
      reply(error_response(req, bad_request("'kernel' must be an object")));
      return;
    }
    offload(
        [this, req = std::move(req), s, kernel]() mutable {
          {
            // The same path returns the existing session.
            std::lock_guard lock(sessions_mu_);
            for (const auto& [id, existing] : sessions_) {
              if (existing.path == s.path && manager_.find(existing.kernel_id)) {
                return json_response(req, http::status::created, session_model(existing));
              }
            }
          }
          if (kernel.contains("id") && kernel["id"].is_string()) {
            s.kernel_id = kernel["id"].get<std::string>();
            if (auto k = manager_.find(s.kernel_id); !k) {
              return error_response(req, k.error());
            }
          } else {
            std::string name = kernel.value("name", "");
            auto model = manager_.start(name, json());
            if (!model) {
              return error_response(req, model.error());
            }
            s.kernel_id = model->id;
          }
          s.id = protocol::new_uuid();
          {
            std::lock_guard lock(sessions_mu_);
            sessions_[s.id] = s;
          }
          Response res = json_response(req, http::status::created, session_model(s));
          res.set(http::field::location, base_ + "/api/sessions/" + s.id);
          return res;
        },
        std::move(reply));
    return;
  }
  if (parts.size() == 2) {
    reply(method_not_allowed(req));
    return;
  }
  if (parts.size() != 3) {
    reply(error_response(req, make_error(ErrorCode::kNotFound, "not_found", "no such route")));
    return;
  }
  const std::string id = parts[2];
  Session s;
  {
    std::lock_guard lock(sessions_mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      reply(error_response(req, make_error(ErrorCode::kNotFound, "no_such_session",
                                           "Session not found: " + id)));
      return;
    }
    s = it->second;
  }
  if (method == http::verb::get) {
    reply(json_response(req, http::status::ok, session_model(s)));
    return;
  }
  if (method == http::verb::delete_) {
    {
      std::lock_guard lock(sessions_mu_);
      sessions_.erase(id);
    }
    offload(
        [this, req = std::move(req), s]() {
          auto r = manager_.shutdown(s.kernel_id);
          if (!r && r.error().code == ErrorCode::kNotFound) {
            return json_response(req, http::status::gone,
                                 json{{"reason", "Gone"},
                                      {"message", "the session's kernel was already deleted"}});
          }
          return json_response(req, http::status::no_content, json());
        },
        std::move(reply));
    return;
  }
  if (method == http::verb::patch) {
    auto body = body_object(req);
    if (!body) {
      reply(error_response(req, body.error()));
      return;
    }
    json b = *body;
    offload(
        [this, req = std::move(req), s, b]() mutable {
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
              if (!manager_.find(kid)) {
                return error_response(req, bad_request("no kernel with id " + kid));
              }
              s.kernel_id = kid;
            } else if (k.contains("name") && k["name"].is_string()) {
              auto model = manager_.start(k["name"].get<std::string>(), json());
              if (!model) {
                return error_response(req, model.error());
              }
              (void)manager_.shutdown(s.kernel_id);
              s.kernel_id = model->id;
            }
          }
          {
            std::lock_guard lock(sessions_mu_);
            sessions_[s.id] = s;
          }
          return json_response(req, http::status::ok, session_model(s));
        },
        std::move(reply));
    return;
  }
  reply(method_not_allowed(req));
}

}  // namespace cellgate::server
