#include "jsonrpc.hpp"

#include "cellgate/protocol/message.hpp"

namespace cellgate::mcp::jsonrpc {

using nlohmann::json;

Kind classify(const json& m) {
  if (!m.is_object()) {
    return Kind::kInvalid;
  }
  auto version = m.find("jsonrpc");
  if (version == m.end() || *version != "2.0") {
    return Kind::kInvalid;
  }
  auto id = m.find("id");
  const bool id_ok = id != m.end() && (id->is_string() || id->is_number_integer());
  if (auto method = m.find("method"); method != m.end()) {
    if (!method->is_string()) {
      return Kind::kInvalid;
    }
    if (auto params = m.find("params"); params != m.end() && !params->is_object()) {
      return Kind::kInvalid;  // MCP's params are always an object
    }
    if (id == m.end()) {
      return Kind::kNotification;
    }
    return id_ok ? Kind::kRequest : Kind::kInvalid;
  }
  if (m.contains("result") || m.contains("error")) {
    return Kind::kResponse;
  }
  return Kind::kInvalid;
}

json result(const json& id, json result) {
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json error(const json& id, int code, const std::string& message) {
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
}

json notification(const std::string& method, json params) {
  return json{{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
}

std::string id_key(const json& id) {
  return protocol::dump_json(id);
}

}  // namespace cellgate::mcp::jsonrpc
