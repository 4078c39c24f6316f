#include "cellgate/mcp/http_endpoint.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "cellgate/http/limits.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/protocol/node_ids.hpp"
#include "jsonrpc.hpp"

namespace cellgate::mcp {
namespace {

using http::Field;
using http::Request;
using http::Response;
using http::Status;
using http::Verb;
using nlohmann::json;

constexpr const char* kSessionHeader = "Mcp-Session-Id";
constexpr const char* kVersionHeader = "MCP-Protocol-Version";

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string header(const Request& req, std::string_view name) {
  auto it = req.find(name);
  return it == req.end() ? std::string() : std::string(it->value());
}

// A refusal: the status, and a JSON-RPC error without an id as the body (the transport spec
// allows one), so an MCP client has a message to show.
Response refuse(const Request& req, Status status, const std::string& message,
                int code = jsonrpc::kServerError) {
  return http::json_response(req, status, jsonrpc::error(nullptr, code, message));
}

// An answer as one JSON body.
Outbox reply_only(std::shared_ptr<http::Exchange> exchange, Request head, Status status) {
  Outbox out;
  out.reply = [exchange = std::move(exchange), head = std::move(head), status](json response) {
    exchange->reply(http::json_response(head, status, response));
  };
  return out;
}

// One request's SSE answer: writes from the tool (progress, keepalive) and its end are ordered
// and stop once the response is out.
class SseStream {
 public:
  explicit SseStream(std::shared_ptr<http::Exchange> exchange) : exchange_(std::move(exchange)) {}
  void event(const json& message, bool last) {
    MutexLock lock(mu_);
    if (ended_) {
      return;
    }
    exchange_->write("event: message\ndata: " + protocol::dump_json(message) + "\n\n");
    if (last) {
      ended_ = true;
      exchange_->end();
    }
  }
  void comment() {
    MutexLock lock(mu_);
    if (!ended_) {
      exchange_->write(": keepalive\n\n");
    }
  }

 private:
  Mutex mu_;
  std::shared_ptr<http::Exchange> exchange_;
  bool ended_ CELLGATE_GUARDED_BY(mu_) = false;
};

}  // namespace

HttpEndpoint::HttpEndpoint(Server& server, util::Offload offload, HttpEndpointOptions options)
    : server_(server), offload_(std::move(offload)), options_(std::move(options)) {}

HttpEndpoint::~HttpEndpoint() = default;  // kernels left are the registry's to shut down

bool HttpEndpoint::origin_allowed(std::string_view origin) const {
  for (const auto& allowed : options_.allow_origins) {
    if (allowed == "*" || allowed == origin) {
      return true;
    }
  }
  // A page on the user's own machine. Any other origin — including one whose DNS name was
  // rebound to 127.0.0.1, which is why "same host as the Host header" is not enough here — is
  // refused (transports: "Servers MUST validate the Origin header").
  const std::string o = ascii_lower(origin);
  const auto scheme = o.find("://");
  if (scheme == std::string::npos) {
    return false;
  }
  std::string host = o.substr(scheme + 3);
  if (!host.empty() && host.front() == '[') {
    host = host.substr(0, host.find(']') + 1);
  } else {
    host = host.substr(0, host.find(':'));
  }
  return host == "localhost" || host == "127.0.0.1" || host == "[::1]";
}

std::size_t HttpEndpoint::conversations() const {
  MutexLock lock(mu_);
  return conversations_.size();
}

http::Upgrade HttpEndpoint::upgrade(const Request& req) {
  http::Upgrade up;
  up.refusal = refuse(req, Status::method_not_allowed, "the MCP endpoint has no WebSocket");
  return up;
}

void HttpEndpoint::handle(Request req, std::shared_ptr<http::Exchange> exchange) {
  if (auto origin = req.find(Field::origin);
      origin != req.end() && !origin_allowed(origin->value())) {
    exchange->reply(refuse(req, Status::forbidden,
                           "Forbidden: origin " + std::string(origin->value()) +
                               " is not allowed (see --allow-origin)"));
    return;
  }
  const std::string version = header(req, kVersionHeader);
  if (!version.empty() && !Server::supports(version)) {
    exchange->reply(refuse(req, Status::bad_request,
                           "Bad Request: unsupported MCP-Protocol-Version " + version));
    return;
  }
  switch (req.method()) {
    case Verb::post:
      post(std::move(req), std::move(exchange));
      return;
    case Verb::delete_:
      remove(std::move(req), std::move(exchange));
      return;
    default: {
      // GET included: no server-initiated SSE stream (transports: 405 says so).
      Response res = refuse(req, Status::method_not_allowed,
                            "Method Not Allowed: POST a JSON-RPC message, or DELETE the session");
      res.set(Field::allow, "POST, DELETE");
      exchange->reply(std::move(res));
      return;
    }
  }
}

void HttpEndpoint::post(Request req, std::shared_ptr<http::Exchange> exchange) {
  const std::string type = ascii_lower(header(req, "content-type"));
  if (type.rfind("application/json", 0) != 0) {
    exchange->reply(refuse(req, Status::unsupported_media_type,
                           "Unsupported Media Type: Content-Type must be application/json"));
    return;
  }
  const std::string accept = ascii_lower(header(req, "accept"));
  const bool sse_ok = accept.find("text/event-stream") != std::string::npos;
  if (!accept.empty() && !sse_ok && accept.find("application/json") == std::string::npos &&
      accept.find("*/*") == std::string::npos) {
    exchange->reply(refuse(req, Status::not_acceptable,
                           "Not Acceptable: accept application/json and text/event-stream"));
    return;
  }
  json message = http::parse_json(req.body());
  if (message.is_discarded()) {
    exchange->reply(refuse(req, Status::bad_request, "Parse error: the body is not JSON",
                           jsonrpc::kParseError));
    return;
  }
  const auto kind = jsonrpc::classify(message);
  const Request head(req.base(), "");
  const std::string sid = header(req, kSessionHeader);
  const std::string tenant = header(req, http::kTenantField);  // the Api's, never a client's

  if (kind == jsonrpc::Kind::kRequest && message["method"] == "initialize") {
    // A new conversation; it is kept only if initialize succeeds.
    auto conversation = server_.open(tenant);
    Outbox out;
    out.reply = [this, exchange, head, conversation](json response) {
      Response res = http::json_response(head, Status::ok, response);
      if (response.contains("result")) {
        const std::string id = protocol::new_node_hex_id();  // routable: node_ids.hpp
        add(id, conversation);
        res.set(kSessionHeader, id);
      }
      exchange->reply(std::move(res));
    };
    server_.handle(conversation, message, std::move(out));
    return;
  }
  if (kind == jsonrpc::Kind::kInvalid) {
    server_.handle(server_.open(), message, reply_only(exchange, head, Status::bad_request));
    return;
  }
  if (sid.empty()) {
    exchange->reply(refuse(req, Status::bad_request,
                           "Bad Request: Mcp-Session-Id header is required (initialize first)"));
    return;
  }
  auto conversation = find(sid, tenant);
  if (!conversation) {
    exchange->reply(refuse(req, Status::not_found, "Session not found", -32001));
    return;
  }
  if (kind != jsonrpc::Kind::kRequest) {
    server_.handle(conversation, message, {});
    Response accepted{Status::accepted, head.version()};  // no body (transports, POST rule 4)
    accepted.set(Field::server, "cellgate");
    accepted.keep_alive(head.keep_alive());
    accepted.prepare_payload();
    exchange->reply(std::move(accepted));
    return;
  }
  if (!sse_ok || message["method"] != "tools/call") {
    server_.handle(conversation, message, reply_only(exchange, head, Status::ok));
    return;
  }
  // tools/call may run for minutes: stream it, so progress and keepalives flow until the
  // response, and a client's idle timeout does not cut it.
  Response stream_head{Status::ok, head.version()};
  stream_head.set(Field::server, "cellgate");
  stream_head.set(Field::content_type, "text/event-stream");
  stream_head.set(Field::cache_control, "no-cache");
  stream_head.set("X-Accel-Buffering", "no");
  stream_head.keep_alive(head.keep_alive());
  exchange->begin(std::move(stream_head));
  auto sse = std::make_shared<SseStream>(exchange);
  Outbox out;
  out.reply = [sse](json response) { sse->event(response, true); };
  out.notify = [sse](json notification) { sse->event(notification, false); };
  out.keepalive = [sse] { sse->comment(); };
  // A client that disconnects has not cancelled (transports: "Disconnection SHOULD NOT be
  // interpreted as the client cancelling its request"); notifications/cancelled does that.
  server_.handle(conversation, message, std::move(out));
}

void HttpEndpoint::remove(Request req, std::shared_ptr<http::Exchange> exchange) {
  const std::string sid = header(req, kSessionHeader);
  if (sid.empty()) {
    exchange->reply(
        refuse(req, Status::bad_request, "Bad Request: Mcp-Session-Id header is required"));
    return;
  }
  std::shared_ptr<Conversation> conversation;
  {
    MutexLock lock(mu_);
    if (auto it = conversations_.find(sid);
        it != conversations_.end() &&
        it->second.conversation->tenant == header(req, http::kTenantField)) {
      conversation = std::move(it->second.conversation);
      conversations_.erase(it);
    }
  }
  if (!conversation) {
    exchange->reply(refuse(req, Status::not_found, "Session not found", -32001));
    return;
  }
  offload_([this, conversation, exchange, head = Request(req.base(), "")] {
    server_.close(*conversation);
    exchange->reply(http::json_response(head, Status::no_content, json()));
  });
}

void HttpEndpoint::add(const std::string& id, std::shared_ptr<Conversation> conversation) {
  std::shared_ptr<Conversation> evicted;
  {
    MutexLock lock(mu_);
    // A tenant past its share ends its own least recently used conversation, never another's.
    const std::string& tenant = conversation->tenant;
    const bool own =
        !tenant.empty() && static_cast<std::size_t>(std::count_if(
                               conversations_.begin(), conversations_.end(), [&](const auto& e) {
                                 return e.second.conversation->tenant == tenant;
                               })) >= options_.max_tenant_conversations;
    if (own || conversations_.size() >= options_.max_conversations) {
      auto oldest = conversations_.end();
      for (auto it = conversations_.begin(); it != conversations_.end(); ++it) {
        if ((!own || it->second.conversation->tenant == tenant) &&
            (oldest == conversations_.end() || it->second.used < oldest->second.used)) {
          oldest = it;
        }
      }
      evicted = std::move(oldest->second.conversation);
      spdlog::info("mcp: more than {} sessions{}; ending the least recently used one",
                   own ? options_.max_tenant_conversations : options_.max_conversations,
                   own ? " of tenant " + tenant : "");
      conversations_.erase(oldest);
    }
    conversations_[id] = {std::move(conversation), std::chrono::steady_clock::now()};
  }
  if (evicted) {
    end_later(std::move(evicted));
  }
}

std::shared_ptr<Conversation> HttpEndpoint::find(const std::string& id, const std::string& tenant) {
  MutexLock lock(mu_);
  auto it = conversations_.find(id);
  if (it == conversations_.end() || it->second.conversation->tenant != tenant) {
    return nullptr;  // another tenant's is unknown here, as with E2B's and Jupyter's ids
  }
  it->second.used = std::chrono::steady_clock::now();
  return it->second.conversation;
}

void HttpEndpoint::end_later(std::shared_ptr<Conversation> conversation) {
  offload_([this, conversation = std::move(conversation)] { server_.close(*conversation); });
}

}  // namespace cellgate::mcp
