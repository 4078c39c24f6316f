// The Model Context Protocol server (https://modelcontextprotocol.io/specification/2025-11-25),
// transport-independent: JSON-RPC 2.0 messages in, responses and notifications out. The
// transports (stdio.hpp, http_endpoint.hpp) parse and frame; this decides.
//
//   mcp::Server server(kernels, offload, {});
//   auto conversation = server.open();                 // one MCP session
//   server.handle(conversation, message, {.reply = write_line, .notify = write_line});
//   server.close(*conversation);                       // its kernels are shut down
//
// Methods: initialize (version negotiation: the client's version when supported, else the
// latest), notifications/initialized, ping, tools/list, tools/call, notifications/cancelled
// (stops the request's cell). Anything else is -32601; malformed params are -32602. A tool that
// fails — a Python exception, a timeout, a bad argument — is a result with isError: true, not a
// JSON-RPC error (tools.cpp lists the tools).
//
// Named sessions belong to a conversation: "default" in one conversation is not "default" in
// another. Each is a kernel, started on first use and kept until close_session, the end of the
// conversation, or the gateway's culler (then the next call starts a fresh kernel and says so).
//
// Thread-safety: handle() never blocks (tools run on `offload` and the executor's strands) and
// may be called from any thread, for any conversation, at once; `reply` and `notify` may be
// called from any thread, one at a time per request. close() blocks.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/client/kernels.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::mcp {

struct ServerOptions {
  std::string name = "cellgate";
  std::string version = "0.1.0";
  std::size_t max_sessions = 16;  // named sessions (kernels) per conversation
  // A conversation of a tenant (Server::open's `tenant`): whether it may start a kernel now (its
  // limits: kernels, CPU budget, disk), and where a kernel it started is recorded as its own.
  // Its snapshot tools are refused (snapshots are the operator's on the Jupyter routes too).
  std::function<Result<void>(const std::string& tenant)> tenant_may_start;
  std::function<void(const std::string& tenant, const std::string& kernel_id)> tenant_owns;
};

// Where one message's answer goes.
struct Outbox {
  std::function<void(nlohmann::json)> reply;   // the response to a request (never for the rest)
  std::function<void(nlohmann::json)> notify;  // progress about it; null: the transport cannot
  // The request still runs and no progress was asked for: keep the connection alive (an SSE
  // comment); null: nothing to do.
  std::function<void()> keepalive;
};

// One MCP session's state: the negotiated version, its named sessions, its requests in flight.
class Conversation;

class Server {
 public:
  Server(client::Kernels& kernels, util::Offload offload, ServerOptions options = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // A conversation for `tenant` ("": the operator).
  std::shared_ptr<Conversation> open(const std::string& tenant = "");
  // One parsed JSON-RPC message (a batch is refused: MCP has none since 2025-06-18).
  void handle(const std::shared_ptr<Conversation>& conversation, const nlohmann::json& message,
              Outbox out);
  // Cancels the conversation's cells and shuts its kernels down; later calls in it fail.
  void close(Conversation& conversation);

  // Newest first; the first is what a client asking for an unknown version gets.
  static const std::vector<std::string>& supported_versions();
  static bool supports(std::string_view version);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cellgate::mcp
