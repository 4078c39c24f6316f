// `cellgate drain`: a running gateway (one node of a cluster, docs/scale-out.md) stops starting
// kernels, or starts them again, and says how many it still has; --wait blocks until none.
//
//   cellgate drain --url http://10.0.0.3:8888 --token T [--undo] [--wait SECONDS]
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace cellgate::cli {

struct DrainOptions {
  std::string url;
  std::string token;
  bool undo = false;  // start kernels again
  double wait = 0;    // seconds to wait for the node's kernels to end (0: do not wait)
};

CLI::App* add_drain_command(CLI::App& app, DrainOptions& options);
// Exit codes: 0 done (and, with --wait, no kernel left), 2 bad options or an unreachable
// gateway, 124 kernels still running when --wait ran out.
int run_drain(const DrainOptions& options);

}  // namespace cellgate::cli
