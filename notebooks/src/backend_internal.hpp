// Internal: what the embedded (backend.cpp) and remote (remote_backend.cpp) backends share.
#pragma once

#include "cellgate/result.hpp"

namespace cellgate::notebooks {

// "No limit" for a cell: a week (the Executor needs a deadline; a remote gateway clamps this to
// its --execute-max-timeout).
inline constexpr double kNoTimeoutSeconds = 7 * 24 * 3600;

// What start() and execute() answer once the run was cancelled.
inline Error aborted_error() {
  return make_error(ErrorCode::kFailedPrecondition, "aborted", "the run was interrupted");
}

}  // namespace cellgate::notebooks
