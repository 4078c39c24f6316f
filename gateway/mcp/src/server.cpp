// The MCP lifecycle and dispatch (basic/lifecycle, basic/utilities/ping, cancellation, progress,
// server/tools of https://modelcontextprotocol.io/specification/2025-11-25).
#include "cellgate/mcp/server.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "cellgate/mutex.hpp"
#include "conversation.hpp"
#include "jsonrpc.hpp"
#include "tools.hpp"

namespace cellgate::mcp {
namespace {

using nlohmann::json;

constexpr const char* kInstructions =
    "Runs code in jailed Jupyter kernels (no network). Call run_code with the same session name "
    "to keep variables between calls; a session starts on first use. Files in the session's "
    "work dir (its cwd) are listed, read and written with list_files, read_file and write_file. "
    "Displayed matplotlib figures come back as PNG images.";

}  // namespace

struct Server::Impl {
  Impl(client::Kernels& k, util::Offload o, ServerOptions opts)
      : options(opts), tools(k, std::move(o), std::move(opts)) {}

  void request(const std::shared_ptr<Conversation>& c, const json& msg, Outbox& out);
  void notification(Conversation& c, const json& msg);
  void call_tool(const std::shared_ptr<Conversation>& c, const json& id, const json& params,
                 Outbox& out);

  ServerOptions options;
  Tools tools;
};

Server::Server(client::Kernels& kernels, util::Offload offload, ServerOptions options)
    : impl_(std::make_unique<Impl>(kernels, std::move(offload), std::move(options))) {}

Server::~Server() = default;

const std::vector<std::string>& Server::supported_versions() {
  // 2025-06-18 added structured tool output and titles; 2025-11-25 changed nothing a tools-only
  // server answers differently. Older clients ignore the fields they do not know.
  static const std::vector<std::string> versions = {"2025-11-25", "2025-06-18", "2025-03-26",
                                                    "2024-11-05"};
  return versions;
}

bool Server::supports(std::string_view version) {
  const auto& v = supported_versions();
  return std::find(v.begin(), v.end(), version) != v.end();
}

std::shared_ptr<Conversation> Server::open(const std::string& tenant) {
  return std::make_shared<Conversation>(tenant);
}

void Server::close(Conversation& conversation) {
  impl_->tools.close_all(conversation);
}

void Server::handle(const std::shared_ptr<Conversation>& conversation, const json& message,
                    Outbox out) {
  switch (jsonrpc::classify(message)) {
    case jsonrpc::Kind::kRequest:
      impl_->request(conversation, message, out);
      return;
    case jsonrpc::Kind::kNotification:
      impl_->notification(*conversation, message);
      return;
    case jsonrpc::Kind::kResponse:
      return;  // this server sends no requests, so there is nothing to match a response to
    case jsonrpc::Kind::kInvalid: {
      json id;
      if (message.is_object()) {
        if (auto it = message.find("id");
            it != message.end() && (it->is_string() || it->is_number_integer())) {
          id = *it;
        }
      }
      out.reply(jsonrpc::error(id, jsonrpc::kInvalidRequest,
                               message.is_array() ? "Invalid Request: batches are not supported"
                                                  : "Invalid Request: not a JSON-RPC 2.0 message"));
      return;
    }
  }
}

void Server::Impl::request(const std::shared_ptr<Conversation>& c, const json& msg, Outbox& out) {
  const json& id = msg["id"];
  const std::string method = msg["method"].get<std::string>();
  const json params = msg.value("params", json::object());
  if (method == "initialize") {
    auto v = params.find("protocolVersion");
    if (v == params.end() || !v->is_string()) {
      out.reply(jsonrpc::error(id, jsonrpc::kInvalidParams,
                               "initialize needs params.protocolVersion (a string)"));
      return;
    }
    // Version negotiation: the client's version when supported, else our latest (the client
    // then decides whether it can go on).
    const std::string asked = v->get<std::string>();
    const std::string chosen = supports(asked) ? asked : supported_versions().front();
    {
      MutexLock lock(c->mu);
      c->protocol_version = chosen;
    }
    std::string client = "?";
    if (auto info = params.find("clientInfo"); info != params.end() && info->is_object()) {
      client = info->value("name", std::string("?")) + " " + info->value("version", std::string());
    }
    spdlog::info("mcp: initialize from {} (asked {}, speaking {})", client, asked, chosen);
    out.reply(jsonrpc::result(
        id, json{{"protocolVersion", chosen},
                 {"capabilities", {{"tools", {{"listChanged", false}}}}},
                 {"serverInfo",
                  {{"name", options.name}, {"title", "cellgate"}, {"version", options.version}}},
                 {"instructions", kInstructions}}));
    return;
  }
  if (method == "ping") {
    out.reply(jsonrpc::result(id, json::object()));
    return;
  }
  if (method == "tools/list") {
    out.reply(jsonrpc::result(id, json{{"tools", tools.definitions()}}));
    return;
  }
  if (method == "tools/call") {
    call_tool(c, id, params, out);
    return;
  }
  out.reply(jsonrpc::error(id, jsonrpc::kMethodNotFound, "Method not found: " + method));
}

void Server::Impl::notification(Conversation& c, const json& msg) {
  const std::string method = msg["method"].get<std::string>();
  const json params = msg.value("params", json::object());
  if (method == "notifications/initialized") {
    MutexLock lock(c.mu);
    c.initialized = true;
    return;
  }
  if (method == "notifications/cancelled") {
    // basic/utilities/cancellation: stop the request if it still runs; unknown ids are ignored.
    auto rid = params.find("requestId");
    if (rid == params.end()) {
      return;
    }
    std::shared_ptr<client::Cell> cell;
    {
      MutexLock lock(c.mu);
      if (auto it = c.in_flight.find(jsonrpc::id_key(*rid)); it != c.in_flight.end()) {
        cell = it->second;
      }
    }
    if (cell) {
      spdlog::info("mcp: request {} cancelled by the client", jsonrpc::id_key(*rid));
      cell->cancel();
    }
  }
  // Other notifications (roots/list_changed, progress, …) need nothing from a tools server.
}

void Server::Impl::call_tool(const std::shared_ptr<Conversation>& c, const json& id,
                             const json& params, Outbox& out) {
  auto name = params.find("name");
  if (name == params.end() || !name->is_string()) {
    out.reply(jsonrpc::error(id, jsonrpc::kInvalidParams, "tools/call needs params.name"));
    return;
  }
  json arguments = json::object();
  if (auto a = params.find("arguments"); a != params.end() && !a->is_null()) {
    if (!a->is_object()) {
      out.reply(jsonrpc::error(id, jsonrpc::kInvalidParams,
                               "tools/call's params.arguments must be an object"));
      return;
    }
    arguments = *a;
  }
  if (!tools.has(*name)) {
    out.reply(
        jsonrpc::error(id, jsonrpc::kInvalidParams, "Unknown tool: " + name->get<std::string>()));
    return;
  }
  ToolCall call;
  call.conversation = c;
  // basic/utilities/progress: with a progressToken, each keepalive becomes a progress
  // notification, so clients that reset their request timeout on progress wait for long cells.
  json token;
  if (auto meta = params.find("_meta"); meta != params.end() && meta->is_object()) {
    if (auto t = meta->find("progressToken");
        t != meta->end() && (t->is_string() || t->is_number_integer())) {
      token = *t;
    }
  }
  if (token.is_null() || !out.notify) {
    call.keepalive = out.keepalive;
  } else {
    auto ticks = std::make_shared<std::atomic<int>>(0);
    const auto started = std::chrono::steady_clock::now();
    call.keepalive = [notify = out.notify, token, ticks, started] {
      const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::steady_clock::now() - started)
                            .count();
      notify(
          jsonrpc::notification("notifications/progress",
                                json{{"progressToken", token},
                                     {"progress", ++*ticks},
                                     {"message", "running for " + std::to_string(secs) + " s"}}));
    };
  }
  const std::string key = jsonrpc::id_key(id);
  {
    MutexLock lock(c->mu);
    c->in_flight[key] = nullptr;  // a placeholder until the tool hands back its cancel hook
  }
  call.done = [c, key, id, reply = out.reply](json result) {
    {
      MutexLock lock(c->mu);
      c->in_flight.erase(key);
    }
    reply(jsonrpc::result(id, std::move(result)));
  };
  auto cell = tools.call(name->get<std::string>(), arguments, std::move(call));
  MutexLock lock(c->mu);
  if (auto it = c->in_flight.find(key); it != c->in_flight.end() && !it->second) {
    it->second = std::move(cell);
  }
}

}  // namespace cellgate::mcp
