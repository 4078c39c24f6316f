// What front.cpp and control_plane.cpp share: E2B's error answers.
#pragma once

#include <string>

#include "cellgate/http/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::sandboxes {

// E2B's {"code", "message"} with cellgate's "error" (the reason) and "reason" (the phrase).
http::Response e2b_error(const http::Request& req, http::Status status, const std::string& message,
                         const std::string& reason);
http::Response e2b_error(const http::Request& req, const Error& error);
// http::status_for, except that a limit reached is E2B's 429.
http::Status e2b_status(const Error& error);

}  // namespace cellgate::sandboxes
