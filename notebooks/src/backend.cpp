#include "cellgate/notebooks/backend.hpp"

#include <stdlib.h>  // mkdtemp

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <thread>

#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/audit.hpp"
#include "cellgate/execute/executor.hpp"
#include "cellgate/store/files.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/http/client.hpp"

namespace http_client = cellgate::http::client;

namespace cellgate::notebooks::runner {
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
  EmbeddedSession(kernels::KernelRegistry& manager, execute::Executor& executor, std::string id,
                  std::shared_ptr<std::atomic<bool>> cancelled, std::size_t max_file_bytes)
      : manager_(manager),
        executor_(executor),
        id_(std::move(id)),
        cancelled_(std::move(cancelled)),
        max_file_bytes_(max_file_bytes) {}
  ~EmbeddedSession() override {
    (void)manager_.shutdown(id_);
    executor_.artifacts().forget(id_);
  }

  Result<void> put_file(const std::string& rel, const std::string& bytes) override {
    CELLGATE_ASSIGN_OR_RETURN(auto kernel, manager_.find(id_));
    CELLGATE_ASSIGN_OR_RETURN(
        auto dir, store::files::WorkDir::open(kernel->work_dir(), kernel->uid(), kernel->uid()));
    CELLGATE_TRY(dir.write(rel, bytes, max_file_bytes_, /*make_parents=*/true));
    return ok_result();
  }

  Result<json> execute(const std::string& code, double timeout_seconds) override {
    if (cancelled_->load()) {
      return aborted_error();
    }
    execute::ExecuteRequest request;
    request.code = code;
    request.timeout_seconds = timeout_seconds > 0 ? timeout_seconds : kNoTimeoutSeconds;
    execute::RunOptions run;
    run.client = "cellgate run";
    return executor_.run_and_wait(id_, std::move(request), std::move(run), cancelled_);
  }

 private:
  kernels::KernelRegistry& manager_;
  execute::Executor& executor_;
  std::string id_;
  std::shared_ptr<std::atomic<bool>> cancelled_;
  std::size_t max_file_bytes_;
};

// The gateway's parts, composed in this process as `cellgate serve` composes them (server.cpp):
// a registry, an artifact store, an executor whose cells run on two threads, and a pool for
// blocking work.
class EmbeddedBackend final : public Backend {
 public:
  EmbeddedBackend(TempDir state, kernels::RegistryOptions options)
      : state_(std::move(state)),
        registry_(std::move(options)),
        artifacts_(state_.path() + "/artifacts", store::ArtifactCaps{}),
        loop_(cells_),
        cell_thread_([this] { cells_.run(); }) {
    for (const auto& spec : registry_.kernelspecs()) {
      names_.insert(spec.name);
    }
  }
  ~EmbeddedBackend() override {
    registry_.shutdown_all();
    executor_.reset();
    offload_pool_.join();
    work_.reset();
    cells_.stop();
    cell_thread_.join();
  }

  Result<void> init() {
    CELLGATE_ASSIGN_OR_RETURN(audit_, store::AuditLog::create({}));  // no audit log for runs
    execute::ExecuteLimits limits;
    limits.stream_bytes = kNotebookOutputBytes;
    limits.output_bytes = kNotebookOutputBytes;
    executor_ = std::make_unique<execute::Executor>(
        registry_, artifacts_, *audit_, limits, loop_, [this](std::function<void()> fn) {
          boost::asio::post(offload_pool_, std::move(fn));
        });
    registry_.start();
    return ok_result();
  }

  const std::set<std::string>& kernelspecs() const override { return names_; }
  std::string default_kernel() const override { return registry_.default_kernel_name(); }
  std::size_t max_file_bytes() const override { return kMaxFileBytes; }

  Result<std::unique_ptr<KernelSession>> start(const std::string& kernel) override {
    if (cancelled_->load()) {
      return aborted_error();
    }
    CELLGATE_ASSIGN_OR_RETURN(auto model, registry_.start(kernel, json::object()));
    return std::unique_ptr<KernelSession>(
        new EmbeddedSession(registry_, *executor_, model.id, cancelled_, kMaxFileBytes));
  }

  void cancel() override { cancelled_->store(true); }

 private:
  static constexpr std::size_t kMaxFileBytes = 16u << 20;

  TempDir state_;  // declared first, so removed after the registry has shut every kernel down
  kernels::KernelRegistry registry_;
  store::ArtifactStore artifacts_;
  std::unique_ptr<store::AuditLog> audit_;
  boost::asio::io_context cells_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      cells_.get_executor()};
  util::AsioLoop loop_;
  boost::asio::thread_pool offload_pool_{8};
  std::unique_ptr<execute::Executor> executor_;
  std::thread cell_thread_;
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
  kernels::RegistryOptions options;
  options.state_dir = state.path();
  options.max_kernels = std::max<std::size_t>(1, settings.kernels);
  options.no_jail = settings.no_jail;
  auto backend = std::make_unique<EmbeddedBackend>(std::move(state), std::move(options));
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

}  // namespace cellgate::notebooks::runner
