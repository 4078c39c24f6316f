#include "cellgate/protocol/message.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <xeus/xguid.hpp>

namespace cellgate::protocol {

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const char* to_string(Channel channel) {
  switch (channel) {
    case Channel::kShell:
      return "shell";
    case Channel::kControl:
      return "control";
    case Channel::kStdin:
      return "stdin";
    case Channel::kIopub:
      return "iopub";
    case Channel::kHeartbeat:
      return "hb";
  }
  return "?";
}

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

std::string Message::msg_type() const {
  return string_field(header, "msg_type");
}
std::string Message::msg_id() const {
  return string_field(header, "msg_id");
}
std::string Message::parent_msg_id() const {
  return string_field(parent_header, "msg_id");
}

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

std::string iso8601_now() {
  return iso8601(std::chrono::system_clock::now());
}

std::string iso8601(std::chrono::system_clock::time_point now) {
  // Not xeus::iso8601_now(): xeus 2.4.1 does not zero-pad the fraction, so 576 us comes out as
  // ".576Z", which every reader takes for 576 ms.
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[96];  // roomy: -Wformat-truncation reasons about any int year
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(micros));
  return buf;
}

Session::Session(std::string username, std::string session_id)
    : username_(std::move(username)), session_id_(std::move(session_id)) {}

nlohmann::json Session::make_header(std::string_view msg_type) const {
  return nlohmann::json{{"msg_id", new_uuid()},   {"msg_type", msg_type},
                        {"session", session_id_}, {"username", username_},
                        {"date", iso8601_now()},  {"version", kProtocolVersion}};
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
