// MCP's Streamable HTTP transport (basic/transports "Streamable HTTP", 2025-11-25): one
// endpoint, mounted by the Api at <base_url>/mcp behind the gateway's token auth (so a missing
// or wrong token never reaches it).
//
//   mcp::HttpEndpoint endpoint(server, offload, {.allow_origins = options.allow_origins});
//   api.mount("/mcp", endpoint);
//
//   POST   one JSON-RPC message. initialize opens a conversation and answers with its
//          Mcp-Session-Id; every later request must carry it (400 without, 404 when unknown or
//          ended). Notifications and responses: 202. Requests: application/json — except
//          tools/call from a client that accepts text/event-stream, which gets an SSE stream
//          (progress notifications or keepalive comments while the cell runs, then the
//          response), so a long cell does not look like a dead connection.
//   GET    405: there is no server-initiated stream (this server sends no requests).
//   DELETE ends the conversation: its kernels are shut down (204).
// Checks: Origin — absent, one of allow_origins, or a loopback origin (localhost, 127.0.0.1,
// [::1]); else 403, as a page whose DNS name was rebound to 127.0.0.1 is same-origin to the rest
// of the API (the Api has already refused origins it does not allow at all) —
// MCP-Protocol-Version when present (400 if unsupported), Content-Type application/json (415),
// an Accept that allows JSON or SSE (406). Refusals carry a JSON-RPC error without an id.
//
// Conversations beyond max_conversations end the least recently used one (its kernels too); a
// tenant's beyond max_tenant_conversations end its own least recently used one.
// Tenants (http::kTenantField, set by the Api for a tenant's API key): a conversation is the
// tenant's that opened it; another tenant's (or the operator's) Mcp-Session-Id is 404, as an
// unknown one; its kernels are the tenant's (server.hpp: ServerOptions::tenant_may_start).
//
// Thread-safety: handle() from any network thread; blocking work goes to `offload`.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cellgate/http/handler.hpp"
#include "cellgate/mcp/server.hpp"
#include "cellgate/mutex.hpp"

namespace cellgate::mcp {

struct HttpEndpointOptions {
  std::vector<std::string> allow_origins;  // exact origins, or "*"; loopback origins always pass
  std::size_t max_conversations = 1024;
  std::size_t max_tenant_conversations = 64;  // of one tenant: past it, its own oldest ends
};

class HttpEndpoint : public http::Handler {
 public:
  HttpEndpoint(Server& server, util::Offload offload, HttpEndpointOptions options);
  ~HttpEndpoint() override;

  void handle(http::Request req, std::shared_ptr<http::Exchange> exchange) override;
  http::Upgrade upgrade(const http::Request& req) override;

  // Whether an Origin header's value may talk to the endpoint.
  bool origin_allowed(std::string_view origin) const;
  std::size_t conversations() const;

 private:
  struct Entry {
    std::shared_ptr<Conversation> conversation;
    std::chrono::steady_clock::time_point used;
  };
  void post(http::Request req, std::shared_ptr<http::Exchange> exchange);
  void remove(http::Request req, std::shared_ptr<http::Exchange> exchange);
  void add(const std::string& id, std::shared_ptr<Conversation> conversation);
  // The conversation `id` if `tenant` ("": the operator) opened it.
  std::shared_ptr<Conversation> find(const std::string& id, const std::string& tenant);
  void end_later(std::shared_ptr<Conversation> conversation);

  Server& server_;
  util::Offload offload_;
  const HttpEndpointOptions options_;
  mutable Mutex mu_;
  std::map<std::string, Entry> conversations_ CELLGATE_GUARDED_BY(mu_);  // by Mcp-Session-Id
};

}  // namespace cellgate::mcp
