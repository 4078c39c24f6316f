// Kernel Gateway's notebook-http handlers (notebook_http/handlers.py, swagger/, 2.5.2) over the
// client seam. See service.hpp for the behaviour; the comments here say where Tornado decides it.
#include "cellgate/notebook_http/service.hpp"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <thread>

#include "cellgate/http/limits.hpp"
#include "cellgate/notebook_http/annotations.hpp"
#include "cellgate/notebook_http/request.hpp"
#include "cellgate/sys/file.hpp"
#include "pool.hpp"

namespace cellgate::notebook_http {
namespace {

using http::Field;
using http::Status;
using http::Verb;
using nlohmann::json;
using nlohmann::ordered_json;

// Tornado's default Content-Type, left on answers that set none (405 of a verb the notebook
// lacks, OPTIONS).
constexpr const char* kTornadoDefaultType = "text/html; charset=UTF-8";
constexpr const char* kNotFoundHtml =
    "<html><title>404: Not Found</title><body>404: Not Found</body></html>";

std::string_view sv(boost::beast::string_view s) {
  return {s.data(), s.size()};
}

http::Response plain(const http::Request& req, unsigned status, std::string body,
                     const std::string& content_type) {
  http::Response res;
  res.version(req.version());
  res.result(status);
  res.set(Field::server, "cellgate");
  if (!content_type.empty()) {
    res.set(Field::content_type, content_type);
  }
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  return res;
}

// Kernel Gateway's JSONErrorsMixin: {"reason": <phrase>, "message": ""}, in json.dumps' form.
http::Response json_error(const http::Request& req, Status status) {
  ordered_json body = {{"reason", std::string(http::beast_http::obsolete_reason(status))},
                       {"message", ""}};
  return plain(req, static_cast<unsigned>(status), python_json(body), "application/json");
}

std::string sha1_hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha1(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 0xF];
  }
  return out;
}

// Tornado's RequestHandler.finish for GET and HEAD: a 200 without an Etag gets the SHA-1 of its
// body; an If-None-Match naming the Etag (or *) turns it into a 304 without a body.
void add_etag(const http::Request& req, http::Response& res) {
  if (res.result() != Status::ok || (req.method() != Verb::get && req.method() != Verb::head)) {
    return;
  }
  if (res.find(Field::etag) == res.end()) {
    res.set(Field::etag, "\"" + sha1_hex(res.body()) + "\"");
  }
  auto inm = req.find(Field::if_none_match);
  if (inm == req.end()) {
    return;
  }
  std::string etag(sv(res[Field::etag]));
  if (etag.starts_with("W/")) {
    etag.erase(0, 2);
  }
  std::string_view list = sv(inm->value());
  bool match = false;
  while (!list.empty() && !match) {
    const std::size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') {
      item.remove_prefix(1);
    }
    while (!item.empty() && item.back() == ' ') {
      item.remove_suffix(1);
    }
    if (item.starts_with("W/")) {
      item.remove_prefix(2);
    }
    match = item == "*" || item == etag;
  }
  if (match) {
    res.result(Status::not_modified);
    res.body().clear();
    res.erase(Field::content_type);
    res.erase(Field::content_length);
  }
}

// The value Tornado's set_header writes, or nothing for one it refuses (a control character) or
// cannot convert (lists, objects).
std::optional<std::string> header_value(const json& v) {
  std::string s;
  if (v.is_string()) {
    s = v.get<std::string>();
  } else if (v.is_number_integer()) {
    s = v.dump();
  } else {
    return std::nullopt;
  }
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {
      return std::nullopt;
    }
  }
  return s;
}

bool token_char(char c) {
  return c > 0x20 && c < 0x7F &&
         std::string_view("()<>@,;:\\\"/[]?={}").find(c) == std::string_view::npos;
}

const char* mime_type_of(const std::string& path) {
  static const std::map<std::string, const char*> kTypes = {
      {".html", "text/html"},        {".htm", "text/html"},
      {".css", "text/css"},          {".js", "text/javascript"},
      {".json", "application/json"}, {".txt", "text/plain"},
      {".png", "image/png"},         {".jpg", "image/jpeg"},
      {".jpeg", "image/jpeg"},       {".gif", "image/gif"},
      {".svg", "image/svg+xml"},     {".ico", "image/vnd.microsoft.icon"},
      {".csv", "text/csv"},          {".xml", "text/xml"},
      {".pdf", "application/pdf"},   {".wasm", "application/wasm"},
      {".webp", "image/webp"},       {".md", "text/markdown"},
  };
  const std::string ext = std::filesystem::path(path).extension().string();
  auto it = kTypes.find(ext);
  return it != kTypes.end() ? it->second : "application/octet-stream";
}

}  // namespace

// What one cell came to, as Kernel Gateway's on_recv gathers it.
struct CellOutcome {
  bool failed = false;
  std::string text;  // the error text, or the stdout, or the result as JSON, or ""
  bool state_lost = false;
};

static CellOutcome outcome_of(Result<execute::CellResult> answer) {
  CellOutcome out;
  if (!answer) {
    out.failed = true;
    out.text = "Error " + answer.error().reason + ": " + answer.error().message + " \n";
    return out;
  }
  const execute::CellResult& r = *answer;
  out.state_lost = r.state_lost;
  if (r.error) {
    out.failed = true;
    out.text = "Error " + r.error->ename + ": " + r.error->evalue + " \n";
  } else if (!r.ok()) {
    // Kernel Gateway would wait for ever; here the executor's timeout ended the cell.
    out.failed = true;
    out.text = "Error " + r.status_name() + ": " + r.message + " \n";
  } else if (!r.stdout_text.empty()) {
    out.text = r.stdout_text;
  } else if (r.result && !r.result->empty()) {
    out.text = python_json(ordered_json(*r.result));
  }
  return out;
}

struct Service::Impl : std::enable_shared_from_this<Service::Impl> {
  SeedNotebook notebook;
  Options options;
  client::Kernels& kernels;
  util::Offload offload;
  NotebookApi api;
  std::string prefix;  // the base URL without its trailing '/'
  std::string swagger;
  KernelPool pool;
  std::atomic<int> pooled{0};

  Impl(SeedNotebook nb, Options o, client::Kernels& k, util::Offload off)
      : notebook(std::move(nb)), options(std::move(o)), kernels(k), offload(std::move(off)) {}

  bool authorized(const http::Request& req) const {
    if (options.token.empty() || req.method() == Verb::options) {
      return true;
    }
    const http::Target target = http::Target::parse(sv(req.target()));
    if (auto it = target.query.find("token"); it != target.query.end()) {
      return http::token_equals(it->second, options.token);
    }
    auto header = req.find(Field::authorization);
    if (header == req.end() || !sv(header->value()).starts_with("token ")) {
      return false;
    }
    return http::token_equals(sv(header->value()).substr(6), options.token);
  }

  void cors(const http::Request& req, http::Response& res) const {
    auto origin = req.find(Field::origin);
    for (const auto& allowed : options.allow_origins) {
      if (allowed == "*") {
        res.set(Field::access_control_allow_origin, "*");
        return;
      }
      if (origin != req.end() && sv(origin->value()) == allowed) {
        res.set(Field::access_control_allow_origin, allowed);
        return;
      }
    }
  }

  void reply(const http::Request& req, const std::shared_ptr<http::Exchange>& exchange,
             http::Response res) const {
    cors(req, res);
    add_etag(req, res);
    if (req.method() == Verb::head) {
      const std::size_t size = res.body().size();
      res.body().clear();
      res.content_length(size);
    } else if (res.result() == Status::no_content || res.result() == Status::not_modified) {
      res.body().clear();
      res.erase(Field::content_type);
    } else {
      res.prepare_payload();
    }
    exchange->reply(std::move(res));
  }

  Result<std::string> seed(const std::string& id) {
    for (std::size_t i = 0; i < api.seed_cells.size(); ++i) {
      execute::ExecuteRequest cell;
      cell.code = api.seed_cells[i];
      cell.timeout_seconds = options.cell_timeout;
      auto answer = client::run_and_wait(kernels, id, std::move(cell));
      CellOutcome out = outcome_of(std::move(answer));
      if (out.failed) {
        std::string first = api.seed_cells[i].substr(0, api.seed_cells[i].find('\n'));
        if (first.size() > 60) {
          first = first.substr(0, 60) + "…";
        }
        return Error{ErrorCode::kFailedPrecondition, "seed_failed",
                     "seeding kernel " + id + ": seed cell " + std::to_string(i + 1) + " (" +
                         first + ") failed: " + out.text.substr(0, out.text.size() - 2)};
      }
    }
    return id;
  }

  // Three cells, one after the other, in the kernel the request holds.
  struct Run : std::enable_shared_from_this<Run> {
    std::shared_ptr<Impl> impl;
    http::Request req;
    std::shared_ptr<http::Exchange> exchange;
    const Endpoint* endpoint;
    std::string verb;
    std::string kernel;
    std::string request_code;
    CellOutcome body;
    bool lost = false;

    void cell(std::string code, std::function<void(CellOutcome)> next) {
      execute::ExecuteRequest request;
      request.code = std::move(code);
      request.timeout_seconds = impl->options.cell_timeout;
      client::CellCallbacks callbacks;
      callbacks.done = [self = shared_from_this(),
                        next = std::move(next)](Result<execute::CellResult> answer) {
        CellOutcome out = outcome_of(std::move(answer));
        self->lost = self->lost || out.state_lost;
        next(std::move(out));
      };
      impl->kernels.execute(kernel, std::move(request), std::move(callbacks));
    }

    void start() {
      auto self = shared_from_this();
      cell(request_code, [self](CellOutcome out) {
        if (out.failed) {
          return self->finish(500, out.text, {});
        }
        self->cell(self->endpoint->sources.at(self->verb), [self](CellOutcome source) {
          if (source.failed) {
            return self->finish(500, source.text, {});
          }
          self->body = std::move(source);
          auto info = self->endpoint->response_sources.find(self->verb);
          if (info == self->endpoint->response_sources.end()) {
            return self->finish(200, self->body.text, {});
          }
          self->cell(info->second, [self](CellOutcome response) {
            if (response.failed) {
              return self->finish(500, response.text, {});
            }
            self->respond_with_info(response.text);
          });
        });
      });
    }

    void respond_with_info(const std::string& text) {
      const json info = http::parse_json(text, 64);
      if (info.is_discarded()) {
        // Kernel Gateway's json.loads raises outside its handler's error handling: the answer
        // goes out as it stood, a 200 with no body.
        spdlog::warn("notebook-http: {} {}: the ResponseInfo cell printed no JSON: {}", verb,
                     endpoint->path, text.substr(0, 200));
        return finish(200, "", {});
      }
      unsigned status = 200;
      std::vector<std::pair<std::string, std::string>> headers;
      if (info.is_object()) {
        if (auto h = info.find("headers"); h != info.end() && h->is_object()) {
          for (const auto& [name, value] : h->items()) {
            auto v = header_value(value);
            if (!v || name.empty() || !std::all_of(name.begin(), name.end(), token_char)) {
              spdlog::warn("notebook-http: {} {}: header {} left out (not a name and a value)",
                           verb, endpoint->path, name.substr(0, 100));
              continue;
            }
            headers.emplace_back(name, *v);
          }
        }
        if (auto s = info.find("status"); s != info.end() && s->is_number_integer()) {
          const auto code = s->get<std::int64_t>();
          if (code >= 100 && code <= 999) {
            status = static_cast<unsigned>(code);
          }
        }
      }
      finish(status, body.text, headers);
    }

    void finish(unsigned status, const std::string& text,
                const std::vector<std::pair<std::string, std::string>>& headers) {
      http::Response res = plain(req, status, text, "text/plain");
      for (const auto& [name, value] : headers) {
        res.set(name, value);
      }
      impl->reply(req, exchange, std::move(res));
      impl->give_back(kernel, lost);
    }
  };

  // A kernel back to the pool; one whose state was lost (restarted after a timeout) is seeded
  // again first, and leaves the pool when that fails.
  void give_back(const std::string& id, bool lost) {
    if (!lost) {
      // On the offload pool: the next waiting request starts there, not deeper in this stack.
      offload([self = shared_from_this(), id] { self->pool.release(id); });
      return;
    }
    spdlog::warn("notebook-http: kernel {} was restarted; seeding it again", id);
    offload([self = shared_from_this(), id] {
      if (auto seeded = self->seed(id); !seeded) {
        spdlog::error("notebook-http: {}; the kernel leaves the pool ({} left)",
                      seeded.error().message, --self->pooled);
        (void)self->kernels.shutdown(id);
        return;
      }
      self->pool.release(id);
    });
  }

  void serve_endpoint(http::Request req, std::shared_ptr<http::Exchange> exchange,
                      const Endpoint& endpoint,
                      std::vector<std::pair<std::string, std::string>> params) {
    const Verb method = req.method();
    if (method == Verb::options) {
      return reply(req, exchange, plain(req, 200, "", kTornadoDefaultType));
    }
    if (method != Verb::get && method != Verb::post && method != Verb::put &&
        method != Verb::delete_) {
      return reply(req, exchange, json_error(req, Status::method_not_allowed));
    }
    if (pooled.load() == 0) {
      return reply(req, exchange, json_error(req, Status::service_unavailable));
    }
    auto run = std::make_shared<Run>();
    run->impl = shared_from_this();
    run->endpoint = &endpoint;
    run->verb = std::string(sv(req.method_string()));
    run->exchange = std::move(exchange);
    auto bundle = request_bundle(req, params);
    run->req = std::move(req);
    pool.acquire([run, bundle = std::move(bundle)](std::string id) mutable {
      run->kernel = std::move(id);
      // Kernel Gateway takes the kernel before it looks at the verb.
      if (!run->endpoint->sources.contains(run->verb)) {
        return run->finish(405, "", {{"Content-Type", kTornadoDefaultType}});
      }
      if (!bundle) {
        return run->finish(400, bundle.error().message + "\n", {});
      }
      run->request_code = request_code(*bundle, run->impl->notebook.language);
      run->start();
    });
  }

  void serve_static(const http::Request& req, const std::shared_ptr<http::Exchange>& exchange,
                    std::string_view rest) {
    if (req.method() != Verb::get && req.method() != Verb::head) {
      return reply(req, exchange, json_error(req, Status::method_not_allowed));
    }
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path root = fs::canonical(options.static_path, ec);
    const std::string rel = http::percent_decode(rest, false);
    fs::path file = ec ? fs::path() : fs::weakly_canonical(root / rel, ec);
    const std::string r = root.string() + "/";
    if (ec || rel.find('\0') != std::string::npos || !file.string().starts_with(r) ||
        !fs::is_regular_file(file, ec)) {
      return reply(req, exchange, plain(req, 404, kNotFoundHtml, kTornadoDefaultType));
    }
    auto bytes = sys::read_file(file.string(), options.max_static_bytes + 1);
    if (!bytes || bytes->size() > options.max_static_bytes) {
      return reply(req, exchange, plain(req, 404, kNotFoundHtml, kTornadoDefaultType));
    }
    reply(req, exchange, plain(req, 200, std::move(*bytes), mime_type_of(file.string())));
  }

  void handle(http::Request req, std::shared_ptr<http::Exchange> exchange) {
    const std::string_view target = sv(req.target());
    std::string_view path = target.substr(0, target.find('?'));
    if (!path.starts_with(prefix) || (path.size() > prefix.size() && path[prefix.size()] != '/')) {
      return reply(req, exchange, json_error(req, Status::not_found));
    }
    path.remove_prefix(prefix.size());
    if (path.empty()) {
      return reply(req, exchange, json_error(req, Status::not_found));
    }
    const bool known_method = req.method() != Verb::unknown;
    if (options.allow_notebook_download && path == "/_api/source") {
      if (!authorized(req)) {
        return reply(req, exchange, json_error(req, Status::unauthorized));
      }
      if (req.method() != Verb::get && req.method() != Verb::head) {
        return reply(req, exchange, json_error(req, Status::method_not_allowed));
      }
      return reply(req, exchange, plain(req, 200, notebook.bytes, "application/octet-stream"));
    }
    if (!options.static_path.empty() && path.starts_with("/public/")) {
      return serve_static(req, exchange, path.substr(8));
    }
    for (const Endpoint& endpoint : api.endpoints) {
      auto params = match_path(endpoint, path);
      if (!params) {
        continue;
      }
      if (!known_method) {
        return reply(req, exchange, json_error(req, Status::method_not_allowed));
      }
      if (!authorized(req)) {
        return reply(req, exchange, json_error(req, Status::unauthorized));
      }
      return serve_endpoint(std::move(req), std::move(exchange), endpoint, std::move(*params));
    }
    if (path == "/_api/spec/swagger.json") {
      if (!authorized(req)) {
        return reply(req, exchange, json_error(req, Status::unauthorized));
      }
      if (req.method() == Verb::options) {
        return reply(req, exchange, plain(req, 200, "", kTornadoDefaultType));
      }
      if (req.method() != Verb::get) {
        return reply(req, exchange, json_error(req, Status::method_not_allowed));
      }
      return reply(req, exchange, plain(req, 200, swagger, "application/json"));
    }
    reply(req, exchange, json_error(req, Status::not_found));
  }
};

Result<std::unique_ptr<Service>> Service::create(SeedNotebook notebook, Options options,
                                                 client::Kernels& kernels, util::Offload offload) {
  const std::string prefix_comment = comment_prefix_for(notebook.language);
  CELLGATE_ASSIGN_OR_RETURN(NotebookApi api, parse_api(notebook.code_cells, prefix_comment));
  if (api.endpoints.empty()) {
    return Error{ErrorCode::kInvalidArgument, "no_endpoints",
                 notebook.path +
                     ": no endpoints were found: annotate code cells with a first line such as "
                     "'" +
                     prefix_comment + " GET /path' (Kernel Gateway's notebook-http mode)"};
  }
  if (options.prespawn < 1) {
    options.prespawn = 1;  // Kernel Gateway's pool has one kernel at least
  }
  if (options.kernel_name.empty()) {
    options.kernel_name = notebook.kernel_name;
  }
  auto impl =
      std::make_shared<Impl>(std::move(notebook), std::move(options), kernels, std::move(offload));
  impl->api = std::move(api);
  impl->swagger = swagger_json(impl->notebook, prefix_comment);
  impl->prefix = impl->options.base_url;
  while (!impl->prefix.empty() && impl->prefix.back() == '/') {
    impl->prefix.pop_back();
  }
  if (!impl->prefix.empty() && impl->prefix.front() != '/') {
    impl->prefix.insert(0, "/");
  }
  return std::unique_ptr<Service>(new Service(std::move(impl)));
}

Service::Service(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Service::~Service() = default;

const std::string& Service::kernel_name() const {
  return impl_->options.kernel_name;
}

Result<void> Service::prespawn() {
  Impl& impl = *impl_;
  const int n = impl.options.prespawn;
  std::vector<Result<std::string>> started(static_cast<std::size_t>(n),
                                           Result<std::string>(std::string()));
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&impl, &started, i] {
        auto id = impl.kernels.start(impl.options.kernel_name);
        started[static_cast<std::size_t>(i)] = id ? impl.seed(*id) : std::move(id);
        if (id && !started[static_cast<std::size_t>(i)]) {
          (void)impl.kernels.shutdown(*id);
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
  }
  std::optional<Error> failure;
  for (auto& s : started) {
    if (!s && !failure) {
      failure = s.error();
    }
  }
  if (failure) {
    for (auto& s : started) {
      if (s) {
        (void)impl.kernels.shutdown(*s);
      }
    }
    return *failure;
  }
  for (auto& s : started) {
    impl.pool.add(std::move(*s));
  }
  impl.pooled = n;
  spdlog::info("notebook-http: {} endpoint(s) of {} served by {} seeded {} kernel(s)",
               impl.api.endpoints.size(), impl.notebook.path, n, impl.options.kernel_name);
  for (const Endpoint& e : impl.api.endpoints) {
    std::string verbs;
    for (const auto& [verb, source] : e.sources) {
      verbs += (verbs.empty() ? "" : ", ") + verb;
    }
    spdlog::info("notebook-http: {}{} ({})", impl.prefix, e.path, verbs);
  }
  return ok_result();
}

void Service::handle(http::Request req, std::shared_ptr<http::Exchange> exchange) {
  impl_->handle(std::move(req), std::move(exchange));
}

http::Upgrade Service::upgrade(const http::Request& req) {
  http::Upgrade refused;
  refused.refusal = json_error(req, Status::not_found);
  return refused;
}

std::string swagger_json(const SeedNotebook& notebook, std::string_view comment_prefix) {
  ordered_json paths = ordered_json::object();
  for (const std::string& source : notebook.all_cells) {
    const Annotation a = annotation_of(source, comment_prefix);
    if (a.kind != Annotation::Kind::kEndpoint) {
      continue;
    }
    std::string verb = a.verb;
    for (char& c : verb) {
      c = static_cast<char>(c - 'A' + 'a');
    }
    paths[a.path][verb] = {{"responses", {{"200", {{"description", "Success"}}}}}};
  }
  ordered_json spec = {{"swagger", "2.0"},
                       {"paths", paths},
                       {"info", {{"version", "0.0.0"}, {"title", notebook_title(notebook.path)}}}};
  return python_json(spec);
}

}  // namespace cellgate::notebook_http
