// Small filesystem helpers shared by the gateway's rooms: private directories for the stores
// (artifacts, audit log), and the one atomic write (kernel state records, artifacts, …).
//
//   CELLGATE_TRY(make_private_dirs(dir, "artifact_io"));
//   CELLGATE_TRY(atomic_write(dir + "/kernel.json", text));     // 0600, all or nothing
//
// Thread-safety: functions without shared state. Two atomic_writes of one path at once each
// succeed; the file then holds one of the two texts, whole.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cerrno>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"
#include "cellgate/sys/file.hpp"

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

// The one atomic write (temp file, fsync, rename) lives in the sys floor (cellgate/sys/file.hpp).
using sys::atomic_write;
using sys::Durability;

}  // namespace cellgate
