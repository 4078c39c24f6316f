#include "cellgate/engine/engine.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <optional>
#include <thread>

namespace cellgate::engine {

namespace net = boost::asio;

kernel::ProcessBackendOptions launcher_options(const EngineOptions& o) {
  kernel::ProcessBackendOptions b;
  if (o.zygote && !o.registry.no_jail) {
    kernel::ZygoteOptions z;
    z.socket_path = o.registry.state_dir + "/run/zygote.sock";
    z.log_file = o.registry.state_dir + "/zygote.log";
    z.preload = o.zygote_preload;
    b.zygote = std::move(z);
  }
  return b;
}

// Members in dependency order: each is built after, and destroyed before, what it uses.
struct Engine::Impl {
  explicit Impl(EngineOptions o) : options(std::move(o)) {}

  EngineOptions options;
  // The cell loop goes last: handlers still queued on it (abandoned cells) are destroyed after
  // every part they might refer to.
  net::io_context cells;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> cells_work;
  util::AsioLoop loop{cells};
  std::unique_ptr<kernel::KernelBackend> backend;  // outlives the registry
  std::unique_ptr<kernels::KernelRegistry> registry;
  std::unique_ptr<store::ArtifactStore> artifacts;
  std::unique_ptr<store::AuditLog> audit;
  std::optional<net::thread_pool> offload_pool;  // made in start_threads(): no thread before
  std::unique_ptr<execute::Executor> executor;
  std::vector<std::thread> cell_threads;
  bool registry_started = false;
  std::atomic<bool> stopped{false};  // read by started() from any thread

  util::Offload offload() {
    return [this](std::function<void()> fn) { net::post(*offload_pool, std::move(fn)); };
  }
};

Result<std::unique_ptr<Engine>> Engine::create(EngineOptions options,
                                               std::unique_ptr<kernel::KernelBackend> backend) {
  auto impl = std::make_unique<Impl>(std::move(options));
  const EngineOptions& o = impl->options;
  impl->backend =
      backend ? std::move(backend) : std::make_unique<kernel::ProcessBackend>(launcher_options(o));
  impl->registry = std::make_unique<kernels::KernelRegistry>(
      o.registry, *impl->backend, [loop = &impl->loop] { return loop->now(); });
  impl->artifacts =
      std::make_unique<store::ArtifactStore>(o.registry.state_dir + "/artifacts", o.artifacts);
  CELLGATE_ASSIGN_OR_RETURN(impl->audit, store::AuditLog::create(o.audit));
  impl->executor = std::make_unique<execute::Executor>(
      *impl->registry, *impl->artifacts, *impl->audit, o.limits, impl->loop, impl->offload());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  stop();
  // Step 4: the members, in reverse order of declaration (Impl), the executor first.
  impl_->executor.reset();
}

void Engine::start_threads() {
  if (impl_->offload_pool || impl_->stopped) {
    return;
  }
  const int offload_threads = std::max(1, impl_->options.offload_threads);
  impl_->offload_pool.emplace(static_cast<std::size_t>(offload_threads));
  impl_->cells_work.emplace(impl_->cells.get_executor());
  for (int i = 0; i < std::max(1, impl_->options.cell_threads); ++i) {
    impl_->cell_threads.emplace_back([impl = impl_.get()] { impl->cells.run(); });
  }
}

void Engine::start() {
  start_threads();
  if (!impl_->registry_started && !impl_->stopped) {
    impl_->registry_started = true;
    impl_->registry->start();
  }
}

void Engine::stop() {
  if (impl_->stopped) {
    return;
  }
  impl_->stopped = true;
  // 1. Kernels end; their cells answer "dead".
  impl_->registry->shutdown_all();
  // 2. Blocking work finishes, with the cell threads still running.
  if (impl_->offload_pool) {
    impl_->offload_pool->join();
  }
  // 3. The cell loop, then its threads.
  impl_->cells_work.reset();
  impl_->cells.stop();
  for (auto& t : impl_->cell_threads) {
    t.join();
  }
  impl_->cell_threads.clear();
}

kernel::KernelBackend& Engine::backend() {
  return *impl_->backend;
}
kernels::KernelRegistry& Engine::registry() {
  return *impl_->registry;
}
store::ArtifactStore& Engine::artifacts() {
  return *impl_->artifacts;
}
store::AuditLog& Engine::audit() {
  return *impl_->audit;
}
execute::Executor& Engine::executor() {
  return *impl_->executor;
}
util::Loop& Engine::loop() {
  return impl_->loop;
}
util::Offload Engine::offload() {
  return impl_->offload();
}
bool Engine::started() const {
  return impl_->offload_pool.has_value() && !impl_->stopped;
}
const EngineOptions& Engine::options() const {
  return impl_->options;
}

}  // namespace cellgate::engine
