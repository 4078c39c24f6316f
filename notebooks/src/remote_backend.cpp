// The remote backend: kernels of a running `cellgate serve`, through its REST API and http's
// client. The embedded one is backend.cpp.
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "backend_internal.hpp"
#include "cellgate/http/client.hpp"
#include "cellgate/notebooks/backend.hpp"
#include "ndjson.hpp"

namespace cellgate::notebooks {
namespace {

namespace http_client = http::client;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr auto kRestTimeout = 30s;
constexpr auto kStartTimeout = 180s;  // a jailed kernel start is inside POST /api/kernels
constexpr auto kInterruptTimeout = 5s;
constexpr auto kAnswerSlack = 120s;  // past a cell's timeout: the grace period and a restart
constexpr std::size_t kRemoteMaxFileBytes = std::size_t{16} << 20;  // serve's default
// A REST answer (a kernel model, the kernelspecs) is a few KiB; this much is read at most.
constexpr std::size_t kRestAnswerBytes = std::size_t{16} << 20;

Error http_error(const std::string& what, const http_client::Response& res) {
  ErrorCode code = ErrorCode::kUnavailable;
  if (res.status == 401 || res.status == 403) {
    code = ErrorCode::kPermissionDenied;
  } else if (res.status == 404) {
    code = ErrorCode::kNotFound;
  } else if (res.status >= 400 && res.status < 500) {
    code = ErrorCode::kInvalidArgument;
  }
  return make_error(
      code, "http_" + std::to_string(res.status),
      what + ": the gateway answered " + std::to_string(res.status) + ": " + res.error_message());
}

// The gateway's REST calls a run makes, and the kernels it started and has not deleted yet (so
// that cancel() can interrupt them). Answers from the network are read defensively (ndjson.hpp).
class Gateway {
 public:
  explicit Gateway(http_client::Client client) : client_(std::move(client)) {}

  struct Specs {
    std::set<std::string> names;
    std::map<std::string, std::string> languages;  // name → spec.language
    std::string default_name;
  };
  // GET /api/kernelspecs: the names, their languages and the default.
  Result<Specs> kernelspecs() const {
    CELLGATE_ASSIGN_OR_RETURN(auto res, client_.request("GET", "/api/kernelspecs", "", kRestTimeout,
                                                        "application/json", kRestAnswerBytes));
    if (res.status != 200) {
      return http_error("GET /api/kernelspecs", res);
    }
    json specs = parse_bounded(res.body);
    if (!specs.is_object() || !specs.contains("kernelspecs") || !specs["kernelspecs"].is_object()) {
      return make_error(ErrorCode::kUnavailable, "bad_answer",
                        "GET /api/kernelspecs: not a Jupyter gateway's answer");
    }
    Specs out;
    for (const auto& [name, model] : specs["kernelspecs"].items()) {
      out.names.insert(name);
      const json spec = model.is_object() ? model.value("spec", json::object()) : json::object();
      const auto language = spec.is_object() ? spec.find("language") : spec.end();
      if (spec.is_object() && language != spec.end() && language->is_string()) {
        out.languages[name] = language->get<std::string>();
      }
    }
    const auto default_name = specs.find("default");
    out.default_name = default_name != specs.end() && default_name->is_string()
                           ? default_name->get<std::string>()
                           : "python3";
    return out;
  }

  // POST /api/kernels {name}: the new kernel's id.
  Result<std::string> start(const std::string& kernel) {
    if (cancelled_.load()) {
      return aborted_error();
    }
    CELLGATE_ASSIGN_OR_RETURN(auto res,
                              client_.request("POST", "/api/kernels", json{{"name", kernel}}.dump(),
                                              kStartTimeout, "application/json", kRestAnswerBytes));
    if (res.status != 201 && res.status != 200) {
      return http_error("POST /api/kernels", res);
    }
    json model = parse_bounded(res.body);
    if (!model.is_object() || !model.contains("id") || !model["id"].is_string()) {
      return make_error(ErrorCode::kUnavailable, "bad_answer",
                        "POST /api/kernels: the answer has no kernel id");
    }
    std::string id = model["id"].get<std::string>();
    std::lock_guard lock(mu_);
    live_.insert(id);
    return id;
  }

  // DELETE /api/kernels/{id}; failures are left to the gateway's culler.
  void shutdown(const std::string& id) {
    (void)client_.request("DELETE", "/api/kernels/" + id, "", kRestTimeout, "application/json",
                          kRestAnswerBytes);
    std::lock_guard lock(mu_);
    live_.erase(id);
  }

  // PUT /api/kernels/{id}/files/{path}
  Result<void> put_file(const std::string& id, const std::string& rel,
                        const std::string& bytes) const {
    const std::string target = "/api/kernels/" + id + "/files/" + http_client::encode_path(rel);
    CELLGATE_ASSIGN_OR_RETURN(
        auto res, client_.request("PUT", target, bytes, kRestTimeout, "application/octet-stream",
                                  kRestAnswerBytes));
    if (res.status != 201 && res.status != 200) {
      return http_error("PUT files/" + rel, res);
    }
    return ok_result();
  }

  // POST /api/kernels/{id}/execute {code, timeout}, streamed as NDJSON: the answer, with the
  // events that came before it as "events".
  Result<CellAnswer> execute(const std::string& id, const std::string& code,
                             double timeout_seconds) const {
    if (cancelled_.load()) {
      return aborted_error();
    }
    const double timeout = timeout_seconds > 0 ? timeout_seconds : kNoTimeoutSeconds;
    http_client::StreamLimits limits;
    limits.head = kRestTimeout;
    limits.total = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::duration<double>(timeout)) +
                   kAnswerSlack;
    NdjsonAnswer lines;
    CELLGATE_ASSIGN_OR_RETURN(
        auto res, client_.stream(
                      "POST", "/api/kernels/" + id + "/execute",
                      json{{"code", code}, {"timeout", timeout}}.dump(), "application/x-ndjson",
                      [&lines](std::string_view piece) { lines.feed(piece); }, limits));
    if (res.status != 200) {
      return http_error("POST /api/kernels/{id}/execute", res);
    }
    return lines.answer();
  }

  // Later calls answer "aborted"; running cells are interrupted (POST .../interrupt).
  void cancel() {
    cancelled_.store(true);
    std::set<std::string> ids;
    {
      std::lock_guard lock(mu_);
      ids = live_;
    }
    for (const auto& id : ids) {
      (void)client_.request("POST", "/api/kernels/" + id + "/interrupt", "", kInterruptTimeout,
                            "application/json", kRestAnswerBytes);
    }
  }
  bool cancelled() const { return cancelled_.load(); }

 private:
  const http_client::Client client_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::set<std::string> live_;  // kernels started and not yet deleted
};

class RemoteSession final : public KernelSession {
 public:
  RemoteSession(Gateway& gateway, std::string id, std::string language)
      : gateway_(gateway), id_(std::move(id)), language_(std::move(language)) {}
  ~RemoteSession() override { gateway_.shutdown(id_); }

  Result<void> put_file(const std::string& rel, const std::string& bytes) override {
    return gateway_.put_file(id_, rel, bytes);
  }
  Result<CellAnswer> execute(const std::string& code, double timeout_seconds) override {
    return gateway_.execute(id_, code, timeout_seconds);
  }
  // The REST API has no kernel_info: the kernelspec's language is what is known.
  Result<json> kernel_info() override {
    json info = json::object();
    if (!language_.empty()) {
      info["language_info"] = {{"name", language_}};
    }
    return info;
  }

 private:
  Gateway& gateway_;
  const std::string id_;
  const std::string language_;
};

class RemoteBackend final : public Backend {
 public:
  RemoteBackend(http_client::Client client, Gateway::Specs specs)
      : gateway_(std::move(client)),
        names_(std::move(specs.names)),
        languages_(std::move(specs.languages)),
        default_(std::move(specs.default_name)) {}

  const std::set<std::string>& kernelspecs() const override { return names_; }
  std::string default_kernel() const override { return default_; }
  std::size_t max_file_bytes() const override { return kRemoteMaxFileBytes; }
  bool clamps_timeouts() const override { return true; }

  Result<std::unique_ptr<KernelSession>> start(const std::string& kernel) override {
    CELLGATE_ASSIGN_OR_RETURN(std::string id, gateway_.start(kernel));
    auto language = languages_.find(kernel);
    return std::unique_ptr<KernelSession>(std::make_unique<RemoteSession>(
        gateway_, id, language != languages_.end() ? language->second : std::string()));
  }

  void cancel() override { gateway_.cancel(); }
  bool cancelled() const override { return gateway_.cancelled(); }

 private:
  Gateway gateway_;
  const std::set<std::string> names_;
  const std::map<std::string, std::string> languages_;
  const std::string default_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_remote_backend(const std::string& url,
                                                     const std::string& token) {
  CELLGATE_ASSIGN_OR_RETURN(auto parsed, http_client::parse_url(url));
  http_client::Client client(std::move(parsed), token, "cellgate-run");
  CELLGATE_ASSIGN_OR_RETURN(auto specs, Gateway(client).kernelspecs());
  return std::unique_ptr<Backend>(
      std::make_unique<RemoteBackend>(std::move(client), std::move(specs)));
}

}  // namespace cellgate::notebooks
