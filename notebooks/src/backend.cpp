// The embedded backend: the gateway's parts composed in this process, as `cellgate serve`
// composes them. The remote one is remote_backend.cpp.
#include "cellgate/notebooks/backend.hpp"

#include <stdlib.h>  // mkdtemp

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <spdlog/spdlog.h>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "backend_internal.hpp"
#include "events.hpp"
#include "cellgate/execute/executor.hpp"
#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/userns.hpp"
#include "cellgate/kernel/backend.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/audit.hpp"
#include "cellgate/store/files.hpp"

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
  explicit RunKernels(kernel::KernelBackend& inner) : inner_(inner) {}

  void start() override { inner_.start(); }
  void tick() override { inner_.tick(); }
  bool wait_fast(std::chrono::milliseconds timeout) override { return inner_.wait_fast(timeout); }
  Result<std::unique_ptr<kernel::KernelProcessHandle>> launch(
      kernel::LaunchRequest request) override {
    const std::string& name = request.spec.name;
    if (name == "python" || name == "python2" || name == "python3") {
      request.spec.argv.emplace_back("--HistoryManager.hist_file=:memory:");
    }
    return inner_.launch(std::move(request));
  }
  Result<std::unique_ptr<kernel::KernelConnection>> connect(
      const kernel::KernelProcessHandle& process, kernel::ClientOptions options) override {
    return inner_.connect(process, std::move(options));
  }

 private:
  kernel::KernelBackend& inner_;
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
      return make_error(ErrorCode::kUnavailable, "no_reply", "the kernel sent no kernel_info_reply");
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

// The gateway's parts, composed in this process as `cellgate serve` composes them (server.cpp):
// a registry, an artifact store, an executor whose cells run on two threads, and a pool for
// blocking work.
class EmbeddedBackend final : public Backend {
 public:
  EmbeddedBackend(TempDir state, kernels::RegistryOptions options, bool zygote)
      : state_(std::move(state)),
        zygote_(zygote),
        process_backend_(backend_options(state_.path(), zygote)),
        registry_(std::move(options), run_kernels_),
        artifacts_(state_.path() + "/artifacts", store::ArtifactCaps{}),
        loop_(cells_) {
    for (const auto& spec : registry_.kernelspecs()) {
      names_.insert(spec.name);
    }
  }
  ~EmbeddedBackend() override {
    registry_.shutdown_all();
    executor_.reset();
    if (offload_pool_) {
      offload_pool_->join();
    }
    work_.reset();
    cells_.stop();
    if (cell_thread_.joinable()) {
      cell_thread_.join();
    }
  }

  Result<void> init() {
    CELLGATE_ASSIGN_OR_RETURN(audit_, store::AuditLog::create({}));  // no audit log for runs
    execute::ExecuteLimits limits;
    limits.stream_bytes = kNotebookOutputBytes;
    limits.output_bytes = kNotebookOutputBytes;
    executor_ = std::make_unique<execute::Executor>(
        registry_, artifacts_, *audit_, limits, loop_, [this](std::function<void()> fn) {
          boost::asio::post(*offload_pool_, std::move(fn));
        });
    // Threads start here, not in the constructor.
    offload_pool_.emplace(8);
    cell_thread_ = std::thread([this] { cells_.run(); });
    registry_.start();
    if (zygote_ && !process_backend_.wait_fast(kZygoteWait)) {
      // Kernels start cold instead (slower, the same jail): the zygote's log says why.
      spdlog::warn("cellgate run: the zygote was not ready after {} s; kernels start cold",
                   kZygoteWait.count());
    }
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

  bool clamps_timeouts() const override { return false; }
  void cancel() override { cancelled_->store(true); }
  bool cancelled() const override { return cancelled_->load(); }

 private:
  static constexpr std::size_t kMaxFileBytes = 16u << 20;
  // A batch waits for the zygote's imports (~1.5 s here) rather than start its first kernels
  // cold beside them on the same cores.
  static constexpr std::chrono::seconds kZygoteWait{30};

  static kernel::ProcessBackendOptions backend_options(const std::string& state, bool zygote) {
    kernel::ProcessBackendOptions b;
    if (zygote) {
      kernel::ZygoteOptions z;
      z.socket_path = state + "/run/zygote.sock";
      z.log_file = state + "/zygote.log";
      b.zygote = std::move(z);
    }
    return b;
  }

  TempDir state_;  // declared first, so removed after the registry has shut every kernel down
  bool zygote_;
  kernel::ProcessBackend process_backend_;  // the launcher (and a zygote); outlives the registry
  RunKernels run_kernels_{process_backend_};
  kernels::KernelRegistry registry_;
  store::ArtifactStore artifacts_;
  std::unique_ptr<store::AuditLog> audit_;
  boost::asio::io_context cells_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      cells_.get_executor()};
  util::AsioLoop loop_;
  std::optional<boost::asio::thread_pool> offload_pool_;
  std::unique_ptr<execute::Executor> executor_;
  std::thread cell_thread_;
  std::set<std::string> names_;
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

Result<std::unique_ptr<Backend>> make_embedded_backend(const EmbeddedSettings& settings) {
  CELLGATE_ASSIGN_OR_RETURN(TempDir state, TempDir::make("cellgate-run"));
  kernels::RegistryOptions options;
  options.state_dir = state.path();
  options.max_kernels = std::max<std::size_t>(1, settings.kernels);
  options.no_jail = settings.no_jail;
  if (!settings.no_jail) {
    CELLGATE_ASSIGN_OR_RETURN(const auto placed, jail::place_kernel_cgroups({}));
    options.jail.cgroup_parent = placed.parent;
    CELLGATE_TRY(jail::enter_gateway_user_namespace());  // not root: rootless mode
  }
  const bool zygote = !settings.no_jail && settings.notebooks > 1;
  auto backend = std::make_unique<EmbeddedBackend>(std::move(state), std::move(options), zygote);
  CELLGATE_TRY(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace cellgate::notebooks
