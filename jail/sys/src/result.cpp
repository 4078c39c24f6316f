#include "cellgate/result.hpp"

#include <cstring>

#include "cellgate/sys/error_text.hpp"

namespace cellgate {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case ErrorCode::kPermissionDenied:
      return "permission_denied";
    case ErrorCode::kUnauthenticated:
      return "unauthenticated";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "internal";
}

Error errno_error(ErrorCode code, std::string reason, const std::string& call, int err) {
  const char* name = strerrorname_np(err);
  std::string message = call + ": " + (name != nullptr ? name : std::to_string(err)) + " (" +
                        sys::error_text(err) + ")";
  return Error{code, std::move(reason), std::move(message)};
}

}  // namespace cellgate
