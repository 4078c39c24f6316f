// The gateway's network side: HTTP/1.1 and WebSocket on Boost.Beast (optionally TLS), serving
// the Api's routes and bridging /api/kernels/{id}/channels to the kernels.
//
//   Server server(options);
//   auto port = server.start();      // binds; port 0 picks a free one
//   server.run();                    // until stop() (from any thread or a signal)
//
// Thread-safety: start() and run() from one thread; stop() from any.
#pragma once

#include <memory>
#include <string>

#include "cellgate/result.hpp"
#include "cellgate/server/config.hpp"

namespace cellgate::server {

class KernelManager;

class Server {
 public:
  explicit Server(ServeOptions options);
  ~Server();
  Result<int> start();
  void run();
  void stop();
  const std::string& token() const;
  KernelManager& manager();
  int e2b_port() const;  // 0 unless --e2b-port

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `cellgate serve`: prints where it listens and the token, runs until SIGINT or SIGTERM, then
// shuts every kernel down.
int run_serve(ServeOptions options);

}  // namespace cellgate::server
