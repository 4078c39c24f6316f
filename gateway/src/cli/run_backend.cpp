#include "run_backend.hpp"

#include <stdlib.h>  // mkdtemp

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>

#include "cellgate/server/artifacts.hpp"
#include "cellgate/server/execute.hpp"
#include "cellgate/server/files.hpp"
#include "cellgate/server/kernel_manager.hpp"
#include "http_client.hpp"

namespace cellgate::cli::runner {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

// "No limit" for a cell: a week (the Executor needs a deadline; a remote gateway clamps this to
// its --execute-max-timeout).
constexpr double kNoTimeoutSeconds = 7 * 24 * 3600;
constexpr std::size_t kNotebookOutputBytes = std::size_t{64} << 20;  // per stream and per output

Error aborted_error() {
  return make_error(ErrorCode::kFailedPrecondition, "aborted", "the run was interrupted");
}

// ---- embedded --------------------------------------------------------------------------------

// A private directory under $TMPDIR, removed with everything in it when destroyed.
class TempDir {
 public:
  static Result<TempDir> make(const std::string& prefix) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return errno_error(ErrorCode::kInternal, "temp_dir", "mkdtemp('" + pattern + "')", errno);
    }
    return TempDir(std::move(pattern));
  }
  TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TempDir& operator=(TempDir&&) = delete;
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
      if (ec) {
        std::cerr << "cellgate run: cannot remove " << path_ << ": " << ec.message() << "\n";
      }
    }
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

class EmbeddedSession final : public KernelSession {
 public:
  EmbeddedSession(server::KernelManager& manager, server::Executor& executor, std::string id,
                  std::shared_ptr<std::atomic<bool>> cancelled)
      : manager_(manager),
        executor_(executor),
        id_(std::move(id)),
        cancelled_(std::move(cancelled)) {}
  ~EmbeddedSession() override {
    (void)manager_.shutdown(id_);
    executor_.artifacts().forget(id_);
  }

  Result<void> put_file(const std::string& rel, const std::string& bytes) override {
    CELLGATE_ASSIGN_OR_RETURN(auto kernel, manager_.find(id_));
    CELLGATE_ASSIGN_OR_RETURN(
        auto dir, server::files::WorkDir::open(kernel->work_dir(), kernel->uid(), kernel->uid()));
    CELLGATE_TRY(dir.write(rel, bytes, manager_.options().max_file_bytes, /*make_parents=*/true));
    return ok_result();
  }

  Result<json> execute(const std::string& code, double timeout_seconds) override {
    if (cancelled_->load()) {
      return aborted_error();
    }
    server::ExecuteRequest request;
    request.code = code;
    request.timeout_seconds = timeout_seconds > 0 ? timeout_seconds : kNoTimeoutSeconds;
    server::RunOptions run;
    run.cancelled = cancelled_;
    run.client = "cellgate run";
    return executor_.run(id_, request, run);
  }

 private:
  server::KernelManager& manager_;
  server::Executor& executor_;
  std::string id_;
  std::shared_ptr<std::atomic<bool>> cancelled_;
};

class EmbeddedBackend final : public Backend {
 public:
  EmbeddedBackend(TempDir state, std::unique_ptr<server::KernelManager> manager)
      : state_(std::move(state)), manager_(std::move(manager)) {
    for (const auto& spec : manager_->kernelspecs()) {
      names_.insert(spec.name);
    }
  }
  Result<void> init() {
    CELLGATE_ASSIGN_OR_RETURN(executor_, server::Executor::create(*manager_));
    return ok_result();
  }

  const std::set<std::string>& kernelspecs() const override { return names_; }
  std::string default_kernel() const override { return manager_->default_kernel_name(); }
  std::size_t max_file_bytes() const override { return manager_->options().max_file_bytes; }

  Result<std::unique_ptr<KernelSession>> start(const std::string& kernel) override {
    if (cancelled_->load()) {
      return aborted_error();
    }
    CELLGATE_ASSIGN_OR_RETURN(auto model, manager_->start(kernel, json::object()));
    return std::unique_ptr<KernelSession>(
        new EmbeddedSession(*manager_, *executor_, model.id, cancelled_));
  }

  void cancel() override { cancelled_->store(true); }

 private:
  TempDir state_;  // declared first, so removed after the manager has shut every kernel down
  std::unique_ptr<server::KernelManager> manager_;
  std::unique_ptr<server::Executor> executor_;
  std::set<std::string> names_;
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

// ---- remote ----------------------------------------------------------------------------------

constexpr auto kRestTimeout = 30s;
constexpr auto kStartTimeout = 180s;  // a jailed kernel start is inside POST /api/kernels
constexpr auto kAnswerSlack = 120s;   // past a cell's timeout: the grace period and a restart
constexpr std::size_t kRemoteMaxFileBytes = std::size_t{16} << 20;  // serve's default

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

class RemoteBackend;

class RemoteSession final : public KernelSession {
 public:
  RemoteSession(RemoteBackend& backend, std::string id) : backend_(backend), id_(std::move(id)) {}
  ~RemoteSession() override;
  Result<void> put_file(const std::string& rel, const std::string& bytes) override;
  Result<json> execute(const std::string& code, double timeout_seconds) override;

 private:
  RemoteBackend& backend_;
  std::string id_;
};

class RemoteBackend final : public Backend {
 public:
  explicit RemoteBackend(http_client::Client client) : client_(std::move(client)) {}

  Result<void> init() {
    CELLGATE_ASSIGN_OR_RETURN(auto res,
                              client_.request("GET", "/api/kernelspecs", "", kRestTimeout));
    if (res.status != 200) {
      return http_error("GET /api/kernelspecs", res);
    }
    json specs = json::parse(res.body, nullptr, false);
    if (!specs.is_object() || !specs.contains("kernelspecs") || !specs["kernelspecs"].is_object()) {
      return make_error(ErrorCode::kUnavailable, "bad_answer",
                        "GET /api/kernelspecs: not a Jupyter gateway's answer");
    }
    for (const auto& [name, spec] : specs["kernelspecs"].items()) {
      names_.insert(name);
    }
    default_ = specs.value("default", "python3");
    return ok_result();
  }

  const std::set<std::string>& kernelspecs() const override { return names_; }
  std::string default_kernel() const override { return default_; }
  std::size_t max_file_bytes() const override { return kRemoteMaxFileBytes; }

  Result<std::unique_ptr<KernelSession>> start(const std::string& kernel) override {
    if (cancelled_.load()) {
      return aborted_error();
    }
    CELLGATE_ASSIGN_OR_RETURN(
        auto res,
        client_.request("POST", "/api/kernels", json{{"name", kernel}}.dump(), kStartTimeout));
    if (res.status != 201 && res.status != 200) {
      return http_error("POST /api/kernels", res);
    }
    json model = json::parse(res.body, nullptr, false);
    if (!model.is_object() || !model.contains("id") || !model["id"].is_string()) {
      return make_error(ErrorCode::kUnavailable, "bad_answer",
                        "POST /api/kernels: the answer has no kernel id");
    }
    const std::string id = model["id"].get<std::string>();
    {
      std::lock_guard lock(mu_);
      live_.insert(id);
    }
    return std::unique_ptr<KernelSession>(new RemoteSession(*this, id));
  }

  void cancel() override {
    cancelled_.store(true);
    std::set<std::string> ids;
    {
      std::lock_guard lock(mu_);
      ids = live_;
    }
    for (const auto& id : ids) {
      (void)client_.request("POST", "/api/kernels/" + id + "/interrupt", "", 5s);
    }
  }

 private:
  friend class RemoteSession;
  void forget(const std::string& id) {
    std::lock_guard lock(mu_);
    live_.erase(id);
  }

  const http_client::Client client_;
  std::set<std::string> names_;
  std::string default_ = "python3";
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::set<std::string> live_;  // kernels started and not yet deleted
};

RemoteSession::~RemoteSession() {
  (void)backend_.client_.request("DELETE", "/api/kernels/" + id_, "", kRestTimeout);
  backend_.forget(id_);
}

Result<void> RemoteSession::put_file(const std::string& rel, const std::string& bytes) {
  const std::string target = "/api/kernels/" + id_ + "/files/" + http_client::encode_path(rel);
  CELLGATE_ASSIGN_OR_RETURN(auto res, backend_.client_.request("PUT", target, bytes, kRestTimeout,
                                                               "application/octet-stream"));
  if (res.status != 201 && res.status != 200) {
    return http_error("PUT files/" + rel, res);
  }
  return ok_result();
}

Result<json> RemoteSession::execute(const std::string& code, double timeout_seconds) {
  if (backend_.cancelled_.load()) {
    return aborted_error();
  }
  const double timeout = timeout_seconds > 0 ? timeout_seconds : kNoTimeoutSeconds;
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::duration<double>(timeout)) +
                    kAnswerSlack;
  CELLGATE_ASSIGN_OR_RETURN(
      auto res, backend_.client_.request("POST", "/api/kernels/" + id_ + "/execute",
                                         json{{"code", code}, {"timeout", timeout}}.dump(), wait));
  if (res.status != 200) {
    return http_error("POST /api/kernels/{id}/execute", res);
  }
  json answer = json::parse(res.body, nullptr, false);
  if (!answer.is_object() || !answer.contains("status")) {
    return make_error(ErrorCode::kUnavailable, "bad_answer",
                      "POST /api/kernels/{id}/execute: the answer is not an execute answer");
  }
  return answer;
}

}  // namespace

Result<std::unique_ptr<Backend>> make_embedded_backend(const EmbeddedSettings& settings) {
  CELLGATE_ASSIGN_OR_RETURN(TempDir state, TempDir::make("cellgate-run"));
  server::ServeOptions options;
  options.state_dir = state.path();
  options.max_kernels = std::max<std::size_t>(1, settings.kernels);
  options.no_jail = settings.no_jail;
  options.audit_log = "off";
  options.execute_stream_bytes = kNotebookOutputBytes;
  options.execute_output_bytes = kNotebookOutputBytes;
  auto manager = std::make_unique<server::KernelManager>(std::move(options));
  auto backend = std::make_unique<EmbeddedBackend>(std::move(state), std::move(manager));
  CELLGATE_TRY(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

Result<std::unique_ptr<Backend>> make_remote_backend(const std::string& url,
                                                     const std::string& token) {
  CELLGATE_ASSIGN_OR_RETURN(auto parsed, http_client::parse_url(url));
  auto backend = std::make_unique<RemoteBackend>(
      http_client::Client(std::move(parsed), token, "cellgate-run"));
  CELLGATE_TRY(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace cellgate::cli::runner
