// The backends of a run, one implementation over the client seam (cellgate/client/kernels.hpp):
// an engine in this process, as `cellgate serve` builds one (make_local), or a running gateway
// (make_remote). A notebook's session is a kernel of the seam; a cell's events are kept by
// CellEvents (events.hpp) as they come.
#include "cellgate/notebooks/backend.hpp"

#include <spdlog/spdlog.h>
#include <stdlib.h>  // mkdtemp

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "cellgate/client/kernels.hpp"
#include "cellgate/engine/engine.hpp"
#include "cellgate/engine/host.hpp"
#include "cellgate/kernel/backend.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/mutex.hpp"
#include "events.hpp"

namespace cellgate::notebooks {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr std::size_t kNotebookOutputBytes = std::size_t{64} << 20;  // per stream and per output
constexpr std::size_t kMaxFileBytes = std::size_t{16} << 20;         // serve's default too
// "No limit" for a cell: a week (the Executor needs a deadline; a remote gateway clamps this to
// its --execute-max-timeout).
constexpr double kNoTimeoutSeconds = 7 * 24 * 3600;

// What start() and execute() answer once the run was cancelled.
Error aborted_error() {
  return make_error(ErrorCode::kFailedPrecondition, "aborted", "the run was interrupted");
}

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

// A batch waits for the zygote's imports (~1.5 s here) rather than start its first kernels cold
// beside them on the same cores.
constexpr std::chrono::seconds kZygoteWait{30};

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

// What a backend's kernels stand on, gone after them: the embedded engine and its state dir, or
// the threads that read a remote gateway's answers.
class Footing {
 public:
  virtual ~Footing() = default;
  // Waits for the work still queued (called before the kernels go).
  virtual void drain() {}
};

class Embedded final : public Footing {
 public:
  Embedded(TempDir state, std::unique_ptr<engine::Engine> engine)
      : state_(std::move(state)), engine_(std::move(engine)) {}
  ~Embedded() override { engine_.reset(); }  // engine.hpp's teardown, then the state dir
  engine::Engine& engine() { return *engine_; }

 private:
  TempDir state_;  // declared first, so removed after the engine has shut every kernel down
  std::unique_ptr<engine::Engine> engine_;
};

class Pool final : public Footing {
 public:
  explicit Pool(std::size_t threads) : pool_(threads) {}
  ~Pool() override { pool_.join(); }
  void drain() override { pool_.join(); }
  util::Offload offload() {
    return [this](std::function<void()> fn) { boost::asio::post(pool_, std::move(fn)); };
  }

 private:
  boost::asio::thread_pool pool_;
};

class ClientBackend;

class ClientSession final : public KernelSession {
 public:
  ClientSession(ClientBackend& backend, std::string id) : backend_(backend), id_(std::move(id)) {}
  ~ClientSession() override;  // shuts the kernel down

  Result<void> put_file(const std::string& rel, const std::string& bytes) override;
  Result<CellAnswer> execute(const std::string& code, double timeout_seconds) override;
  Result<json> kernel_info() override;

 private:
  ClientBackend& backend_;
  const std::string id_;
};

class ClientBackend final : public Backend {
 public:
  ClientBackend(std::unique_ptr<Footing> footing, std::unique_ptr<client::Kernels> kernels,
                client::KernelSpecs specs, bool clamps)
      : footing_(std::move(footing)),
        kernels_(std::move(kernels)),
        default_(std::move(specs.default_name)),
        clamps_(clamps) {
    for (auto& spec : specs.specs) {
      names_.insert(spec.name);
    }
  }
  ~ClientBackend() override {
    footing_->drain();  // interrupts still on their way use the kernels
    kernels_.reset();
  }

  const std::set<std::string>& kernelspecs() const override { return names_; }
  std::string default_kernel() const override { return default_; }
  std::size_t max_file_bytes() const override { return kMaxFileBytes; }
  bool clamps_timeouts() const override { return clamps_; }

  Result<std::unique_ptr<KernelSession>> start(const std::string& kernel) override {
    if (cancelled_.load()) {
      return aborted_error();
    }
    CELLGATE_ASSIGN_OR_RETURN(std::string id, kernels_->start(kernel));
    return std::unique_ptr<KernelSession>(std::make_unique<ClientSession>(*this, std::move(id)));
  }

  // Later calls answer "aborted"; running cells are cancelled (an embedded one answers
  // "aborted", a gateway's kernel is interrupted).
  void cancel() override {
    std::set<std::shared_ptr<client::Cell>> running;
    {
      MutexLock lock(mu_);
      cancelled_.store(true);
      running = running_;
    }
    for (const auto& cell : running) {
      cell->cancel();
    }
  }
  bool cancelled() const override { return cancelled_.load(); }

  client::Kernels& kernels() { return *kernels_; }

  // A cell began: cancel() reaches it from now on (at once when it came first).
  void track(const std::shared_ptr<client::Cell>& cell) {
    {
      MutexLock lock(mu_);
      if (!cancelled_.load()) {
        running_.insert(cell);
        return;
      }
    }
    cell->cancel();
  }
  void untrack(const std::shared_ptr<client::Cell>& cell) {
    MutexLock lock(mu_);
    running_.erase(cell);
  }

 private:
  std::unique_ptr<Footing> footing_;  // declared first, so it outlives the kernels
  std::unique_ptr<client::Kernels> kernels_;
  std::set<std::string> names_;
  const std::string default_;
  const bool clamps_;
  std::atomic<bool> cancelled_{false};
  Mutex mu_;
  std::set<std::shared_ptr<client::Cell>> running_ CELLGATE_GUARDED_BY(mu_);
};

ClientSession::~ClientSession() {
  // Failures are left to a gateway's culler; an embedded kernel goes with the engine anyway.
  (void)backend_.kernels().shutdown(id_);
}

Result<void> ClientSession::put_file(const std::string& rel, const std::string& bytes) {
  CELLGATE_TRY(backend_.kernels().write_file(id_, rel, bytes));
  return ok_result();
}

Result<CellAnswer> ClientSession::execute(const std::string& code, double timeout_seconds) {
  if (backend_.cancelled()) {
    return aborted_error();
  }
  execute::ExecuteRequest request;
  request.code = code;
  request.timeout_seconds = timeout_seconds > 0 ? timeout_seconds : kNoTimeoutSeconds;
  // The events, for outputs made as nbclient makes them (runner.cpp), kept within bounds
  // (events.hpp). They come one at a time, and all before the answer (run_and_wait).
  CellEvents events;
  std::shared_ptr<client::Cell> cell;
  client::WaitOptions wait;
  wait.on_event = [this, &events](const json& event) {
    if (event_watch()) {
      event_watch()(event);
    }
    events.add(event);
  };
  wait.started = [this, &cell](std::shared_ptr<client::Cell> c) {
    cell = c;
    backend_.track(c);
  };
  auto result = client::run_and_wait(backend_.kernels(), id_, std::move(request), wait);
  backend_.untrack(cell);
  if (!result) {
    return std::move(result).error();
  }
  CellAnswer answer{std::move(result).value(), std::nullopt};
  events.finish(answer);
  return answer;
}

Result<json> ClientSession::kernel_info() {
  return backend_.kernels().kernel_info(id_);
}

client::Options run_client_options() {
  client::Options options;
  options.client = "cellgate run";
  options.max_file_bytes = kMaxFileBytes;
  return options;
}

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
  auto footing = std::make_unique<Embedded>(std::move(state), std::move(engine));
  engine::Engine& e = footing->engine();
  e.start();  // threads start here, not in a constructor
  if (zygote && !e.backend().wait_fast(kZygoteWait)) {
    // Kernels start cold instead (slower, the same jail): the zygote's log says why.
    spdlog::warn("cellgate run: the zygote was not ready after {} s; kernels start cold",
                 kZygoteWait.count());
  }
  auto kernels = client::make_local(e.registry(), e.executor(), run_client_options());
  CELLGATE_ASSIGN_OR_RETURN(auto specs, kernels->kernelspecs());
  return std::unique_ptr<Backend>(std::make_unique<ClientBackend>(
      std::move(footing), std::move(kernels), std::move(specs), /*clamps=*/false));
}

Result<std::unique_ptr<Backend>> make_remote_backend(const std::string& url,
                                                     const std::string& token, std::size_t jobs) {
  CELLGATE_ASSIGN_OR_RETURN(auto parsed, http::client::parse_url(url));
  // A thread per notebook reads its cell's answer, and one more sends interrupts.
  auto pool = std::make_unique<Pool>(std::max<std::size_t>(1, jobs) + 1);
  CELLGATE_ASSIGN_OR_RETURN(
      auto kernels,
      client::make_remote(std::move(parsed), token, run_client_options(), pool->offload()));
  CELLGATE_ASSIGN_OR_RETURN(auto specs, kernels->kernelspecs());
  return std::unique_ptr<Backend>(std::make_unique<ClientBackend>(
      std::move(pool), std::move(kernels), std::move(specs), /*clamps=*/true));
}

}  // namespace cellgate::notebooks
