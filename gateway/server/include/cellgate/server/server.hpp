// `cellgate serve`: the composition root. Server builds an engine (engine/engine.hpp: the kernel
// backend, registry, artifact store, audit log, executor, the cell threads — every agent cell is
// a state machine on a strand there — and the offload pool for blocking work) and the front
// ends over it — the Jupyter/agent API, the E2B API, MCP at /mcp, /metrics — with their
// listeners and the network threads.
//
//   Server server(options);          // builds; starts no thread and no process
//   auto port = server.start();      // the zygote, the monitor, the pool, the listeners
//   server.run();                    // network threads, until stop() (any thread or a signal)
//
// Thread-safety: start() and run() from one thread; stop() from any.
#pragma once

#include <memory>
#include <string>

#include "cellgate/kernel/kernel.hpp"
#include "cellgate/result.hpp"
#include "cellgate/server/config.hpp"

namespace boost::asio {
class io_context;
}
namespace cellgate::kernels {
class KernelRegistry;
}

namespace cellgate::execute {
class Executor;
}
namespace cellgate::sandboxes {
class SandboxRegistry;
}
namespace cellgate::http {
class Handler;
}

namespace cellgate::server {

class Server {
 public:
  // `backend`: where kernels start (a privileged broker's BrokerBackend); nullptr: launchers
  // of our own (kernel::ProcessBackend).
  explicit Server(ServeOptions options, std::unique_ptr<kernel::KernelBackend> backend = nullptr);
  ~Server();
  Result<int> start();
  void run();
  void stop();
  const std::string& token() const;
  kernels::KernelRegistry& registry();
  const ServeOptions& options() const;
  int e2b_port() const;  // 0 unless --e2b-port
  // E2B's sandboxes (the control plane on the E2B port); envd looks sandboxes up here.
  sandboxes::SandboxRegistry& sandboxes();
  // The loop every network thread runs (run()): a timer on it stops firing when it stalls.
  boost::asio::io_context& network();

 private:
  // --api notebook-http (ServeOptions::api): its front end, and its start (the seeded pool first).
  void make_notebook_http(kernels::KernelRegistry& registry, execute::Executor& executor);
  Result<int> start_notebook_http();

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The log as `options` say: the journal when stderr or stdout is journald's stream, else the
// console; options.log_level (else SPDLOG_LEVEL, in spdlog's syntax, else info); and
// options.log_format ("json": one {"ts", "level", "msg"} object per line). Once, before
// run_serve and before any thread.
void set_up_logging(const ServeOptions& options);

// `cellgate serve`: prints where it listens and the token, runs until SIGINT or SIGTERM, then
// shuts every kernel down.
int run_serve(ServeOptions options);

}  // namespace cellgate::server
