#include "cellgate/http/message.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <boost/beast/http/status.hpp>

#include "cellgate/http/digest.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::http {

using nlohmann::json;

Status status_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return Status::bad_request;
    case ErrorCode::kUnauthenticated:
      return Status::unauthorized;
    case ErrorCode::kPermissionDenied:
      return Status::forbidden;
    case ErrorCode::kNotFound:
      return Status::not_found;
    case ErrorCode::kFailedPrecondition:
      return Status::conflict;
    case ErrorCode::kResourceExhausted:
      return Status::forbidden;  // jupyter's "Resource Limit" for max_kernels; clients expect 403
    case ErrorCode::kDeadlineExceeded:
      return Status::gateway_timeout;
    case ErrorCode::kUnavailable:
      return Status::service_unavailable;
    case ErrorCode::kInternal:
      return Status::internal_server_error;
  }
  return Status::internal_server_error;
}

Status status_for(const Error& error) {
  if (error.reason == "too_large") {
    return Status::payload_too_large;
  }
  if (error.reason == "no_space") {
    return Status::insufficient_storage;
  }
  if (error.reason == "node-restarted") {
    return Status::gone;  // an id of this node's earlier run (protocol/node_ids.hpp)
  }
  if (error.reason == "checkpoints_unavailable") {
    return Status::not_implemented;  // no CRIU, rootless, unjailed or behind a broker
  }
  return status_for(error.code);
}

Response json_response(const Request& req, Status status, const json& body) {
  Response res{status, req.version()};
  res.set(Field::server, "cellgate");
  res.set(Field::content_type, "application/json");
  res.keep_alive(req.keep_alive());
  if (status != Status::no_content) {
    res.body() = body.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  res.prepare_payload();
  return res;
}

Response error_response(const Request& req, const Error& error) {
  const Status status = status_for(error);
  // jupyter_server's body: "reason" is the status phrase. A 410 names why instead, as routers
  // and clients of a cluster tell a restarted node from a bad id by it.
  return json_response(
      req, status,
      json{{"reason", status == Status::gone ? error.reason
                                             : std::string(beast_http::obsolete_reason(status))},
           {"message", error.message},
           {"error", error.reason}});
}

Response bytes_response(const Request& req, std::string body, const std::string& content_type) {
  Response res{Status::ok, req.version()};
  res.set(Field::server, "cellgate");
  res.set(Field::content_type, content_type);
  res.set("X-Content-Type-Options", "nosniff");
  res.set("Content-Security-Policy", "sandbox; default-src 'none'");
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

Response text_response(const Request& req, Status status, const std::string& text) {
  Response res{status, req.version()};
  res.set(Field::server, "cellgate");
  res.set(Field::content_type, "text/plain; charset=utf-8");
  res.keep_alive(req.keep_alive());
  res.body() = text;
  res.prepare_payload();
  return res;
}

Response method_not_allowed(const Request& req) {
  return json_response(
      req, Status::method_not_allowed,
      json{{"reason", "Method Not Allowed"},
           {"message", std::string(req.method_string()) + " is not allowed on this route"}});
}

bool token_equals(std::string_view given, std::string_view token) {
  return given.size() == token.size() &&
         CRYPTO_memcmp(given.data(), token.data(), token.size()) == 0;
}

std::string sha256_base64_unpadded(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    return "";
  }
  std::string text = base64_encode(
      std::string_view(reinterpret_cast<const char*>(digest), static_cast<std::size_t>(size)));
  while (!text.empty() && text.back() == '=') {
    text.pop_back();
  }
  return text;
}

Error bad_request(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "bad_request", std::move(message));
}

Result<json> body_object(const Request& req) {
  if (req.body().empty()) {
    return json::object();
  }
  // Before the DOM: a body of nested '[' costs ~64 bytes of nodes per byte of text.
  if (auto shallow = check_json_depth(req.body()); !shallow) {
    return shallow.error();
  }
  json j = json::parse(req.body(), nullptr, false);
  if (j.is_discarded()) {
    return bad_request("the request body is not valid JSON");
  }
  if (!j.is_object()) {
    return bad_request("the request body must be a JSON object");
  }
  return j;
}

}  // namespace cellgate::http
