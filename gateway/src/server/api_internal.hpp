// Internal: small HTTP helpers shared by the Api's route files (api.cpp, agent_routes.cpp,
// e2b_api.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/server/api.hpp"

namespace cellgate::server::detail {

inline Response method_not_allowed(const Request& req) {
  return Api::json_response(req, http::status::method_not_allowed,
                            nlohmann::json{{"reason", "Method Not Allowed"},
                                 {"message", std::string(req.method_string()) +
                                                 " is not allowed on this route"}});
}

inline Error bad_request(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "bad_request", std::move(message));
}

// Body as a JSON object; an empty body is {}.
inline Result<nlohmann::json> body_object(const Request& req) {
  if (req.body().empty()) {
    return nlohmann::json::object();
  }
  nlohmann::json j = nlohmann::json::parse(req.body(), nullptr, false);
  if (j.is_discarded()) {
    return bad_request("the request body is not valid JSON");
  }
  if (!j.is_object()) {
    return bad_request("the request body must be a JSON object");
  }
  return j;
}

}  // namespace cellgate::server::detail
