// Connect's JSON protocol (connect.hpp).
#include "cellgate/envd/connect.hpp"

#include <nlohmann/json.hpp>

namespace cellgate::envd {

ConnectError connect_error(const Error& error) {
  const char* code = "unknown";
  switch (error.code) {
    case ErrorCode::kInvalidArgument:
      code = "invalid_argument";
      break;
    case ErrorCode::kNotFound:
      code = "not_found";
      break;
    case ErrorCode::kPermissionDenied:
      code = "permission_denied";
      break;
    case ErrorCode::kUnauthenticated:
      code = "unauthenticated";
      break;
    case ErrorCode::kResourceExhausted:
      code = "resource_exhausted";
      break;
    case ErrorCode::kFailedPrecondition:
      code = "failed_precondition";
      break;
    case ErrorCode::kDeadlineExceeded:
      code = "deadline_exceeded";
      break;
    case ErrorCode::kUnavailable:
      code = "unavailable";
      break;
    case ErrorCode::kInternal:
      code = "internal";
      break;
  }
  if (error.reason == "already_exists") {
    code = "already_exists";
  }
  return {code, error.message};
}

int http_status(std::string_view code) {
  struct Row {
    std::string_view code;
    int status;
  };
  static constexpr Row kRows[] = {
      {"canceled", 499},           {"invalid_argument", 400},    {"deadline_exceeded", 504},
      {"not_found", 404},          {"already_exists", 409},      {"permission_denied", 403},
      {"resource_exhausted", 429}, {"failed_precondition", 400}, {"aborted", 409},
      {"out_of_range", 400},       {"unimplemented", 501},       {"internal", 500},
      {"unavailable", 503},        {"data_loss", 500},           {"unauthenticated", 401},
  };
  for (const auto& row : kRows) {
    if (row.code == code) {
      return row.status;
    }
  }
  return 500;
}

std::string error_json(const ConnectError& error) {
  return nlohmann::json{{"code", error.code}, {"message", error.message}}.dump();
}

std::string envelope(std::string_view json, unsigned char flags) {
  std::string out;
  out.reserve(json.size() + 5);
  out.push_back(static_cast<char>(flags));
  const auto n = static_cast<std::uint32_t>(json.size());
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((n >> shift) & 0xff));
  }
  out.append(json);
  return out;
}

std::string end_of_stream(const std::optional<ConnectError>& error) {
  nlohmann::json body = nlohmann::json::object();
  if (error) {
    body["error"] = {{"code", error->code}, {"message", error->message}};
  }
  return envelope(body.dump(), kEndStreamFlag);
}

Result<std::string> read_envelope(std::string_view body) {
  if (body.size() < 5) {
    return make_error(ErrorCode::kInvalidArgument, "bad_envelope",
                      "a streaming request's body must be one Connect envelope");
  }
  const auto flags = static_cast<unsigned char>(body[0]);
  std::uint32_t n = 0;
  for (int i = 1; i <= 4; ++i) {
    n = (n << 8) | static_cast<unsigned char>(body[static_cast<std::size_t>(i)]);
  }
  if (flags != 0 || n != body.size() - 5) {
    return make_error(ErrorCode::kInvalidArgument, "bad_envelope",
                      "a streaming request's body must be one uncompressed envelope whose length "
                      "is the rest of the body");
  }
  return std::string(body.substr(5));
}

}  // namespace cellgate::envd
