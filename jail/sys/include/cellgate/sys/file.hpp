// Whole-file reads and writes, with the errno named in the error (nsjail's PLOG style).
//
//   CELLGATE_ASSIGN_OR_RETURN(std::string text, sys::read_file("/proc/self/cgroup"));
//   CELLGATE_TRY(sys::write_file(dir + "/memory.max", "1073741824"));  // one write(2), no O_CREAT
//   CELLGATE_TRY(sys::atomic_write(path, json_text));                  // temp + fsync + rename
//
// Errors: kPermissionDenied for EACCES/EPERM/EROFS, kInternal otherwise (a missing file is
// read_optional's answer, not an error code); the reason is the caller's (`reason`).
//
// Thread-safety: functions without shared state.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"

namespace cellgate::sys {

inline constexpr std::size_t kDefaultMaxFileBytes = std::size_t{4} << 20;

// The code an errno maps to: EACCES/EPERM/EROFS → kPermissionDenied, else kInternal.
ErrorCode code_for_errno(int err);

// Up to `max_bytes` of the file (the rest is not read: a control file or a /proc file that
// grows without end cannot make us allocate without bound).
Result<std::string> read_file(const std::string& path, std::size_t max_bytes = kDefaultMaxFileBytes,
                              const char* reason = "io_error");
// The file's text, or nullopt when it does not exist; other errors are errors.
Result<std::optional<std::string>> read_optional(const std::string& path,
                                                 std::size_t max_bytes = kDefaultMaxFileBytes,
                                                 const char* reason = "io_error");
// The file's text without leading and trailing whitespace; "" when it cannot be read (for
// probes whose absence is an answer: /proc/sys knobs, uid_map).
std::string read_trimmed(const std::string& path);

// One write(2) of the whole value to an existing file (control files of cgroupfs and /proc are
// parsed per write; no O_CREAT, so a missing control file fails instead of appearing as a
// regular file). A short write is an error. Without `truncate` no O_TRUNC (procfs files such as
// uid_map are written as they are).
Result<void> write_file(const std::string& path, std::string_view value,
                        const char* reason = "io_error", bool truncate = true);

// Replaces `path` with `data`, all or nothing: a temp file beside it (created exclusively with
// `mode`, never following a symlink), written, fsync'd, renamed over `path`, and the directory
// fsync'd, so a crash leaves either the old file or the new one. Errors (kInternal, `reason`)
// name the failed call. With kNone nothing is fsync'd: a reader still never sees half a file,
// but a crash may lose the write (content-addressed artifacts, checked by size).
enum class Durability { kFsync, kNone };
Result<void> atomic_write(const std::string& path, std::string_view data, mode_t mode = 0600,
                          Durability durability = Durability::kFsync,
                          const char* reason = "io_error");

// readlink(2) of `path` ("/proc/self/exe").
Result<std::string> read_link(const std::string& path);

}  // namespace cellgate::sys
