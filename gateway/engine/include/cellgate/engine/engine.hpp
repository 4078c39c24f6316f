// Engine: the gateway's parts composed once — the kernel backend (the launcher and its zygote,
// or a privileged broker), the kernel registry, the artifact store, the audit log, the cell
// loop and the threads it runs on, the offload pool for blocking work, and the executor — built
// from one EngineOptions, owned in dependency order and torn down in one documented order.
// `cellgate serve` (server/), `cellgate mcp` (cli/), `cellgate run` (notebooks/) and the test
// fixtures (tests/support/…/api_parts.hpp) each build one and add their front end over
// registry() and executor(); a kernel option is added to EngineOptions (or the RegistryOptions
// in it) and reaches every one of them.
//
//   auto engine = engine::Engine::create(options);   // builds; starts no thread, no process
//   if (!engine) { … }                               // e.g. a bad audit redact pattern
//   api::Api api((*engine)->registry(), (*engine)->executor(), api_options, (*engine)->offload());
//   (*engine)->start();                              // threads, then the registry
//   …
//   (*engine)->stop();                               // kernels end, then the threads
//   // front ends go, then the engine
//
// Teardown, the same for every command (stop(), then the destructor):
//   1. registry.shutdown_all(): every kernel ends (pooled ones too) and the pool stops refilling;
//      cells on those kernels answer "dead" on their strands.
//   2. the offload pool is joined: queued blocking work (starts, restarts, shutdowns, file I/O)
//      finishes while the cell threads still deliver what it posts.
//   3. the cell loop's work guard is released, the loop stopped and its threads joined.
//   4. (destructor) the parts go in reverse dependency order: the executor (cells still on their
//      way are abandoned), the offload pool, the audit log, the artifact store, the registry (its
//      monitor and pool threads), the backend (the zygote), and the cell loop last (what is
//      still queued on it is destroyed after every part it might refer to).
// Front ends that hold references into the engine are destroyed between stop() and the
// destructor (or outlive it, when nothing of theirs runs after stop()).
//
// Thread-safety: create(), start() and stop() from one thread; the parts are as thread-safe as
// their own headers say. No thread starts before start() or start_threads().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cellgate/execute/executor.hpp"
#include "cellgate/kernel/backend.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/result.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/audit.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::engine {

struct EngineOptions {
  // Kernels: the state dir (required), limits, jail, pool, uids, culling, restarts.
  kernels::RegistryOptions registry;
  // Jailed python3 ipykernels fork from a zygote (a preloaded fork server) whose socket and log
  // are in the state dir; without a jail there is none. Only for the backend the engine makes.
  bool zygote = false;
  std::vector<std::string> zygote_preload;  // empty: ipykernel, IPython, numpy, pandas, matplotlib
  store::ArtifactCaps artifacts;            // per kernel, under <state_dir>/artifacts
  store::AuditLog::Options audit;           // path "": no audit log
  execute::ExecuteLimits limits;            // per cell
  // Threads, made by start(): the cells' state machines run on cell_threads; blocking work
  // (mostly waiting for a kernel to answer) on offload_threads.
  int cell_threads = 1;
  int offload_threads = 4;
};

// The launcher's options for `options` (the zygote's socket and log in the state dir): what
// the engine's own backend is built with, and what a privileged broker is given.
kernel::ProcessBackendOptions launcher_options(const EngineOptions& options);

class Engine {
 public:
  // Builds every part; starts no thread and no process. `backend`: where kernels start (a
  // privileged broker's, or a wrapper around a launcher); nullptr: kernel::ProcessBackend with
  // launcher_options(options). Fails when the audit log cannot be made (a bad redact pattern).
  static Result<std::unique_ptr<Engine>> create(
      EngineOptions options, std::unique_ptr<kernel::KernelBackend> backend = nullptr);
  ~Engine();  // stop(), then the parts in reverse dependency order
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The offload pool and the cell threads, then the registry (the backend's zygote, adoption
  // of a previous gateway's kernels, the death monitor, the pool's fillers).
  void start();
  // The threads only: the registry stays unstarted (route tests that never launch a kernel).
  // start() after it starts the registry.
  void start_threads();
  // Teardown steps 1-3 (see above). Idempotent; the parts stay until the destructor.
  void stop();

  kernel::KernelBackend& backend();
  kernels::KernelRegistry& registry();
  store::ArtifactStore& artifacts();
  store::AuditLog& audit();
  execute::Executor& executor();
  util::Loop& loop();
  // Posts to the offload pool (after start_threads(); work posted after stop() never runs).
  util::Offload offload();
  bool started() const;  // the threads run: between start_threads() and stop()
  const EngineOptions& options() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cellgate::engine
