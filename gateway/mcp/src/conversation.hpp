// Internal: one MCP session's state (server.hpp's Conversation), shared by server.cpp and
// tools.cpp.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cellgate/client/kernels.hpp"

namespace cellgate::mcp {

class Conversation {
 public:
  struct Named {
    std::string kernel_id;
    std::string kernelspec;
    std::string language;
  };

  std::mutex mu;                 // guards everything below but start_mu
  std::string protocol_version;  // "" until initialize
  bool initialized = false;      // notifications/initialized arrived
  bool closed = false;
  std::map<std::string, Named> sessions;  // by name
  std::map<std::string, std::shared_ptr<client::Cell>>
      in_flight;  // jsonrpc::id_key → its cancel hook

  // Held while a named session is started or closed, so two calls naming a new session at once
  // start one kernel, not two.
  std::mutex start_mu;
};

}  // namespace cellgate::mcp
