// This gateway as one node of a cluster (docs/scale-out.md): its tag and epoch, and the
// agent-check port a router (HAProxy) asks how much room it has.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cellgate/result.hpp"

namespace cellgate::server {

struct NodeIdentity {
  std::uint16_t tag = 0;
  std::uint16_t epoch = 0;
  bool kept = false;  // the epoch of the previous gateway on this state dir, in this boot
};

// The epoch is kept while the host's boot is the same and the tag unchanged (a gateway restarted
// or upgraded in place adopts its kernels, whose ids stay valid), else a new random one differing
// from the last: the ids of a node's earlier life then answer 410. Recorded in
// <state_dir>/node.json: {"tag", "epoch", "boot_id"}.
Result<NodeIdentity> take_node_identity(const std::string& state_dir, std::uint16_t tag);

// HAProxy's agent-check protocol on ip:port: each connection gets one line, then is closed:
// "ready NN%\n" (room for NN% more kernels) or "drain\n" (draining, or full: HAProxy would
// still send to a server at 0% weight).
class AgentCheck {
 public:
  // `line` is asked on the network thread for each connection: it must not block.
  static Result<std::unique_ptr<AgentCheck>> open(boost::asio::io_context& io,
                                                  const std::string& ip, int port,
                                                  std::function<std::string()> line);
  ~AgentCheck();
  int port() const;

 private:
  struct Impl;
  explicit AgentCheck(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// The agent line for a node: "drain" when draining or full, else "ready NN%".
std::string agent_line(bool draining, int room_percent);

}  // namespace cellgate::server
