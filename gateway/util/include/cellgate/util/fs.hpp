// Internal: small filesystem helpers shared by the gateway's stores (artifacts, audit log).
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <string>

#include "cellgate/result.hpp"

namespace cellgate {

// mkdir -p, each directory it creates 0700; `reason` names the store in the error.
inline Result<void> make_private_dirs(const std::string& path, const char* reason) {
  for (std::size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') {
      continue;
    }
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return errno_error(ErrorCode::kInternal, reason, "mkdir('" + prefix + "', 0700)", errno);
    }
  }
  return {};
}

}  // namespace cellgate
