// `cellgate drain`: a running gateway (one node of a cluster, docs/scale-out.md) stops starting
// kernels, or starts them again, and says how many it still has; --wait blocks until none.
// --move moves each of its kernels to another node (POST /api/kernels/{id}/move: checkpointed,
// uploaded and restored there under the same id) and points every --router (HAProxy's Runtime
// API: a unix socket path or host:port, level admin) at their new node through its override map.
//
//   cellgate drain --url http://10.0.0.3:8888 --token T [--undo] [--wait SECONDS]
//   cellgate drain --url http://10.0.0.3:8888 --token T --move [--to 0002] --router /run/h.sock
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cellgate::cli {

struct DrainOptions {
  std::string url;
  std::string token;
  bool undo = false;  // start kernels again
  double wait = 0;    // seconds to wait for the node's kernels to end (0: do not wait)
  bool move = false;  // move every kernel to another node
  std::string to;     // the node tag to move to ("": the peer with the most room, each time)
  std::vector<std::string> routers;  // HAProxy Runtime API sockets to point at the new nodes
};

CLI::App* add_drain_command(CLI::App& app, DrainOptions& options);
// Exit codes: 0 done (and, with --wait, no kernel left; with --move, every kernel moved and
// every router told), 1 some kernel did not move or some router was not told, 2 bad options or
// an unreachable gateway, 124 kernels still running when --wait ran out.
int run_drain(const DrainOptions& options);

}  // namespace cellgate::cli
