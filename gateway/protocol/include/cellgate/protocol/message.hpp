// Jupyter messages (messaging spec 5.3) and the builders that make new ones.
//
// A Message is the parsed form: routing identities, header, parent_header, metadata, content
// and binary buffers. See https://jupyter-client.readthedocs.io/en/stable/messaging.html
//
//   Session session;                       // one per client: session id and username
//   Message req = session.make("execute_request", {{"code", "1+1"}, ...});
//   Message reply = session.make_reply(req, "execute_reply", {{"status", "ok"}});
//
// Thread-safety: Message is a value. Session is immutable after construction and may be used
// from several threads.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace cellgate::protocol {

inline constexpr std::string_view kProtocolVersion = "5.3";

// The sockets of a kernel (https://jupyter-client.readthedocs.io/en/stable/messaging.html).
enum class Channel { kShell, kControl, kStdin, kIopub, kHeartbeat };
// "shell", "control", "stdin", "iopub", "hb".
const char* to_string(Channel channel);

struct Message {
  std::vector<std::string> identities;  // ZeroMQ routing prefix (ROUTER side), may be empty
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json parent_header = nlohmann::json::object();
  nlohmann::json metadata = nlohmann::json::object();
  nlohmann::json content = nlohmann::json::object();
  std::vector<std::string> buffers;  // binary buffers, raw bytes

  // Header fields, or "" when absent or not a string.
  std::string msg_type() const;
  std::string msg_id() const;
  // The msg_id of the request this message answers, or "".
  std::string parent_msg_id() const;
};

// The four JSON frames and the binary buffers of a message, owned, unparsed (envelope.hpp).
struct Frames {
  std::string header;
  std::string parent_header;
  std::string metadata;
  std::string content;
  std::vector<std::string> buffers;
};

// JSON text that never throws: invalid UTF-8 in strings becomes U+FFFD.
std::string dump_json(const nlohmann::json& value);

// A new random UUID4 in canonical form (8-4-4-4-12 lowercase hex).
std::string new_uuid();

// A UTC time as ISO 8601 with microseconds and a "Z": 2026-11-21T21:47:11.729090Z.
std::string iso8601(std::chrono::system_clock::time_point t);
std::string iso8601_now();

// Builds messages for one client session (spec: "session" and "username" header fields).
class Session {
 public:
  explicit Session(std::string username = "cellgate", std::string session_id = new_uuid());

  const std::string& id() const { return session_id_; }
  const std::string& username() const { return username_; }

  nlohmann::json make_header(std::string_view msg_type) const;
  Message make(std::string_view msg_type, nlohmann::json content,
               nlohmann::json metadata = nlohmann::json::object()) const;
  // A reply or a message caused by `parent`: its header becomes parent_header and its routing
  // identities are kept, so a ROUTER sends it back to the same peer.
  Message make_reply(const Message& parent, std::string_view msg_type,
                     nlohmann::json content) const;

 private:
  std::string username_;
  std::string session_id_;
};

}  // namespace cellgate::protocol
