#include "cellgate/protocol/message.hpp"

#include <xeus/xguid.hpp>
#include <xeus/xmessage.hpp>

namespace cellgate::protocol {
namespace {

std::string string_field(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) {
    return {};
  }
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return {};
  }
  return it->get<std::string>();
}

}  // namespace

std::string Message::msg_type() const { return string_field(header, "msg_type"); }
std::string Message::msg_id() const { return string_field(header, "msg_id"); }
std::string Message::parent_msg_id() const { return string_field(parent_header, "msg_id"); }

std::string new_uuid() {
  // xeus::new_xguid() is libuuid's random (version 4) UUID as 32 hex digits; Jupyter clients
  // expect the canonical dashed form.
  std::string hex = xeus::new_xguid();
  if (hex.size() != 32) {
    return hex;
  }
  return hex.substr(0, 8) + '-' + hex.substr(8, 4) + '-' + hex.substr(12, 4) + '-' +
         hex.substr(16, 4) + '-' + hex.substr(20);
}

std::string iso8601_now() { return xeus::iso8601_now(); }

Session::Session(std::string username, std::string session_id)
    : username_(std::move(username)), session_id_(std::move(session_id)) {}

nlohmann::json Session::make_header(std::string_view msg_type) const {
  return nlohmann::json{{"msg_id", new_uuid()},
                        {"msg_type", msg_type},
                        {"session", session_id_},
                        {"username", username_},
                        {"date", iso8601_now()},
                        {"version", kProtocolVersion}};
}

Message Session::make(std::string_view msg_type, nlohmann::json content,
                      nlohmann::json metadata) const {
  Message msg;
  msg.header = make_header(msg_type);
  msg.content = std::move(content);
  msg.metadata = std::move(metadata);
  return msg;
}

Message Session::make_reply(const Message& parent, std::string_view msg_type,
                            nlohmann::json content) const {
  Message msg = make(msg_type, std::move(content));
  msg.parent_header = parent.header;
  msg.identities = parent.identities;
  return msg;
}

}  // namespace cellgate::protocol
