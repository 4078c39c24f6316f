// Internal: one MCP session's state (server.hpp's Conversation), shared by server.cpp and
// tools.cpp.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "cellgate/client/kernels.hpp"
#include "cellgate/mutex.hpp"

namespace cellgate::mcp {

class Conversation {
 public:
  struct Named {
    std::string kernel_id;
    std::string kernelspec;
    std::string language;
  };

  explicit Conversation(std::string owner = "") : tenant(std::move(owner)) {}

  // The tenant whose API key opened it ("": the operator's): only that key reaches it, and the
  // kernels it starts are that tenant's.
  const std::string tenant;
  Mutex mu;
  std::string protocol_version CELLGATE_GUARDED_BY(mu);  // "" until initialize
  bool initialized CELLGATE_GUARDED_BY(mu) = false;      // notifications/initialized arrived
  bool closed CELLGATE_GUARDED_BY(mu) = false;
  std::map<std::string, Named> sessions CELLGATE_GUARDED_BY(mu);  // by name
  // jsonrpc::id_key → its cancel hook
  std::map<std::string, std::shared_ptr<client::Cell>> in_flight CELLGATE_GUARDED_BY(mu);

  // Held while a named session is started or closed, so two calls naming a new session at once
  // start one kernel, not two.
  Mutex start_mu;
};

}  // namespace cellgate::mcp
