// The embedded backend: an engine in this process, as `cellgate serve` builds one. The remote
// one is remote_backend.cpp.
#include "cellgate/notebooks/backend.hpp"

#include <spdlog/spdlog.h>
#include <stdlib.h>  // mkdtemp

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "backend_internal.hpp"
#include "cellgate/engine/engine.hpp"
#include "cellgate/engine/host.hpp"
#include "cellgate/kernel/backend.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/store/files.hpp"
#include "events.hpp"

namespace cellgate::notebooks {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr std::size_t kNotebookOutputBytes = std::size_t{64} << 20;  // per stream and per output
constexpr auto kKernelInfoTimeout = 10s;

// ---- kernels started for a run ---------------------------------------------------------------

// Starts kernels as `inner` does, with IPython's history in memory, as nbclient does
// (NotebookClient.ipython_hist_file ':memory:', passed as an extra argument to kernels whose
// manager calls them ipykernel: the kernelspecs named python, python2 and python3): a run
// writes no history.sqlite and parallel runs do not contend for one.
class RunKernels final : public kernel::KernelBackend {
 public:
  explicit RunKernels(std::unique_ptr<kernel::KernelBackend> inner) : inner_(std::move(inner)) {}

  void start() override { inner_->start(); }
  void tick() override { inner_->tick(); }
  bool wait_fast(std::chrono::milliseconds timeout) override { return inner_->wait_fast(timeout); }
  Result<std::unique_ptr<kernel::KernelProcessHandle>> launch(
      kernel::LaunchRequest request) override {
    const std::string& name = request.spec.name;
    if (name == "python" || name == "python2" || name == "python3") {
      request.spec.argv.emplace_back("--HistoryManager.hist_file=:memory:");
    }
    return inner_->launch(std::move(request));
  }
  Result<std::unique_ptr<kernel::KernelConnection>> connect(
      const kernel::KernelProcessHandle& process, kernel::ClientOptions options) override {
    return inner_->connect(process, std::move(options));
  }

 private:
  std::unique_ptr<kernel::KernelBackend> inner_;
};

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

  Result<CellAnswer> execute(const std::string& code, double timeout_seconds) override {
    if (cancelled_->load()) {
      return aborted_error();
    }
    execute::ExecuteRequest request;
    request.code = code;
    request.timeout_seconds = timeout_seconds > 0 ? timeout_seconds : kNoTimeoutSeconds;
    execute::RunOptions run;
    run.client = "cellgate run";
    // The events, for outputs made as nbclient makes them (runner.cpp), kept within bounds
    // (events.hpp). They are added on the cell's strand; run_and_wait returns after the cell's
    // last event (its promise orders them).
    auto events = std::make_shared<CellEvents>();
    run.on_event = [events](const json& event) { events->add(event); };
    CELLGATE_ASSIGN_OR_RETURN(
        auto result, executor_.run_and_wait(id_, std::move(request), std::move(run), cancelled_));
    CellAnswer answer{std::move(result), std::nullopt};
    events->finish(answer);
    return answer;
  }

  Result<json> kernel_info() override {
    CELLGATE_ASSIGN_OR_RETURN(auto kernel, manager_.find(id_));
    auto connection = kernel->connection();
    if (!connection) {
      return make_error(ErrorCode::kUnavailable, "no_connection", "the kernel is not connected");
    }
    CELLGATE_ASSIGN_OR_RETURN(auto collected,
                              connection->request(protocol::Channel::kShell, "kernel_info_request",
                                                  json::object(), kKernelInfoTimeout,
                                                  /*wait_for_idle=*/false));
    if (!collected.reply || !collected.reply->content.is_object()) {
      return make_error(ErrorCode::kUnavailable, "no_reply",
                        "the kernel sent no kernel_info_reply");
    }
    return collected.reply->content;
  }

 private:
  kernels::KernelRegistry& manager_;
  execute::Executor& executor_;
  std::string id_;
  std::shared_ptr<std::atomic<bool>> cancelled_;
  std::size_t max_file_bytes_;
};

// An engine (engine/engine.hpp) in this process, as `cellgate serve` builds one, over kernels
// started with their history in memory (RunKernels).
class EmbeddedBackend final : public Backend {
 public:
  EmbeddedBackend(TempDir state, std::unique_ptr<engine::Engine> engine, bool zygote)
      : state_(std::move(state)), engine_(std::move(engine)), zygote_(zygote) {
    for (const auto& spec : engine_->registry().kernelspecs()) {
      names_.insert(spec.name);
    }
  }
  ~EmbeddedBackend() override { engine_.reset(); }  // engine.hpp's teardown

  Result<void> init() {
    engine_->start();  // threads start here, not in a constructor
    if (zygote_ && !engine_->backend().wait_fast(kZygoteWait)) {
      // Kernels start cold instead (slower, the same jail): the zygote's log says why.
      spdlog::warn("cellgate run: the zygote was not ready after {} s; kernels start cold",
                   kZygoteWait.count());
    }
    return ok_result();
  }

  const std::set<std::string>& kernelspecs() const override { return names_; }
  std::string default_kernel() const override { return engine_->registry().default_kernel_name(); }
  std::size_t max_file_bytes() const override { return kMaxFileBytes; }

  Result<std::unique_ptr<KernelSession>> start(const std::string& kernel) override {
    if (cancelled_->load()) {
      return aborted_error();
    }
    CELLGATE_ASSIGN_OR_RETURN(auto model, engine_->registry().start(kernel, json::object()));
    return std::unique_ptr<KernelSession>(new EmbeddedSession(
        engine_->registry(), engine_->executor(), model.id, cancelled_, kMaxFileBytes));
  }

  bool clamps_timeouts() const override { return false; }
  void cancel() override { cancelled_->store(true); }
  bool cancelled() const override { return cancelled_->load(); }

 private:
  static constexpr std::size_t kMaxFileBytes = 16u << 20;
  // A batch waits for the zygote's imports (~1.5 s here) rather than start its first kernels
  // cold beside them on the same cores.
  static constexpr std::chrono::seconds kZygoteWait{30};

  TempDir state_;  // declared first, so removed after the engine has shut every kernel down
  std::unique_ptr<engine::Engine> engine_;
  bool zygote_;
  std::set<std::string> names_;
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

Result<std::unique_ptr<Backend>> make_embedded_backend(const EmbeddedSettings& settings) {
  CELLGATE_ASSIGN_OR_RETURN(TempDir state, TempDir::make("cellgate-run"));
  engine::EngineOptions options;
  options.registry.state_dir = state.path();
  options.registry.max_kernels = std::max<std::size_t>(1, settings.kernels);
  options.registry.no_jail = settings.no_jail;
  engine::HostOptions host;  // the host's steps, before the engine and its threads
  host.jailed = !settings.no_jail;
  CELLGATE_ASSIGN_OR_RETURN(const auto prepared, engine::prepare_host(host));
  options.registry.jail.cgroup_parent = prepared.cgroup_parent;
  options.zygote = !settings.no_jail && settings.notebooks > 1;
  // No audit log for runs; outputs as large as a notebook may hold.
  options.limits.stream_bytes = kNotebookOutputBytes;
  options.limits.output_bytes = kNotebookOutputBytes;
  options.offload_threads = 8;
  options.cell_threads = 1;
  const bool zygote = options.zygote;
  auto backend = std::make_unique<RunKernels>(
      std::make_unique<kernel::ProcessBackend>(engine::launcher_options(options)));
  CELLGATE_ASSIGN_OR_RETURN(auto engine,
                            engine::Engine::create(std::move(options), std::move(backend)));
  auto embedded = std::make_unique<EmbeddedBackend>(std::move(state), std::move(engine), zygote);
  CELLGATE_TRY(embedded->init());
  return std::unique_ptr<Backend>(std::move(embedded));
}

}  // namespace cellgate::notebooks
