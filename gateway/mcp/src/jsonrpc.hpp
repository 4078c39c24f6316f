// Internal: JSON-RPC 2.0 message shapes as MCP uses them (https://www.jsonrpc.org/specification;
// MCP basic/index "Messages": ids are strings or integers, never null, in requests).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace cellgate::mcp::jsonrpc {

// Error codes: JSON-RPC's own, and the one MCP adds for a missing resource.
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;
inline constexpr int kServerError = -32000;  // a transport refusal (HTTP 4xx bodies)

enum class Kind { kRequest, kNotification, kResponse, kInvalid };

// What a parsed message is. A batch (an array) is kInvalid: MCP removed batching in 2025-06-18.
Kind classify(const nlohmann::json& message);

nlohmann::json result(const nlohmann::json& id, nlohmann::json result);
nlohmann::json error(const nlohmann::json& id, int code, const std::string& message);
nlohmann::json notification(const std::string& method, nlohmann::json params);

// The id of a request as a map key (its JSON text: 1 and "1" are different ids).
std::string id_key(const nlohmann::json& id);

}  // namespace cellgate::mcp::jsonrpc
