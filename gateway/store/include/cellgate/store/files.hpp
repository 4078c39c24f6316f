// The files API's filesystem half: read, write, remove and list files inside one kernel's work
// dir, and snapshot it to see what a cell changed. HTTP lives elsewhere (api.cpp).
//
//   CELLGATE_ASSIGN_OR_RETURN(files::WorkDir dir, files::WorkDir::open(host_path, uid, gid));
//   CELLGATE_ASSIGN_OR_RETURN(std::string rel, files::normalize(decoded_url_path));
//   CELLGATE_TRY(dir.write(rel, body, 64 << 20, /*make_parents=*/true));
//   auto before = dir.snapshot();  ... run the cell ...  auto after = dir.snapshot();
//   for (const files::Change& c : files::diff(*before, *after)) { ... }
//
// The work dir is writable by a hostile kernel while the gateway (root) works in it: it can plant
// symlinks, FIFOs and deep trees and rename things under our feet. So no path string is ever
// checked and then opened: every path is resolved from the root fd with openat2(2) and
// RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV, and every later step works on the fd
// that resolution returned (https://man7.org/linux/man-pages/man2/openat2.2.html). Rules:
//   - symlinks in the middle of a path are followed only while they stay beneath the root;
//   - the last component is never followed: read/list of a symlink fail with "path_escape",
//     remove removes the link, write replaces the link by a regular file (rename(2) replaces the
//     name, not what it points to), which is as safe as refusing and cannot race;
//   - write never opens the target: it fills a fresh `.cellgate-tmp-<random>` file (O_EXCL) in
//     the parent, chowns it to the kernel's uid/gid, mode 0644, and renames it over the target;
//   - the kernel must not reach outside the root (it is the jail's /home/kernel), so an fd
//     opened beneath the root stays beneath it even if the kernel renames directories later.
// Special files are never opened for writing; read opens with O_NONBLOCK (a FIFO does not block)
// and serves only regular files. The work-dir mount should be nodev (a jailed kernel cannot
// mknod devices anyway). Needs Linux >= 5.6 (openat2); WorkDir::open says so if missing.
//
// Errors (reason → code → HTTP through http_status() unless noted):
//   bad_path      kInvalidArgument    400  empty, absolute, "..", NUL, too long
//   not_found     kNotFound           404  missing, or a parent is not a directory
//   path_escape   kPermissionDenied   403  a symlink leads out of the root, or ends the path
//   not_a_file    kFailedPrecondition 409  read of a dir/FIFO/socket, write over a directory
//   not_a_directory kFailedPrecondition 409  list of something that is not a directory
//   not_empty     kFailedPrecondition 409  remove of a non-empty directory
//   too_large     kResourceExhausted  413  over max_bytes: the HTTP layer maps this reason to
//                                          413 (http_status() gives 403 for the code)
//   no_space      kResourceExhausted  507  the work-dir tmpfs is full (map like too_large)
//   busy          kUnavailable        503  openat2 kept returning EAGAIN (concurrent renames)
//   io_error      kInternal           500  anything else, with the syscall and errno
// Messages name relative paths only, never the host path.
//
// Times are nanoseconds since the Unix epoch (UTC); format them with protocol::iso8601.
//
// Thread-safety: a WorkDir is immutable after open(); its const methods may run concurrently
// from any threads (each call opens its own fds). Concurrent writes to one path: the last rename
// wins, and each reader sees one complete version. Calls block on disk I/O: use the blocking pool.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::store::files {

inline constexpr std::size_t kDefaultMaxListEntries = 10000;
inline constexpr std::size_t kDefaultMaxSnapshotEntries = 100000;
inline constexpr int kMaxSnapshotDepth = 32;  // directories deeper than this are not walked

enum class FileType { kFile, kDirectory, kSymlink, kOther };
const char* to_string(FileType type);  // "file", "directory", "symlink", "other"

struct FileInfo {
  std::string name;  // last component
  std::string path;  // normalized, relative to the work dir
  FileType type = FileType::kOther;
  std::uint64_t size = 0;  // a symlink's size is the length of its target
  std::int64_t mtime_ns = 0;
};

// The file model of the agent API and MCP: {"name", "path", "type", "size", "mtime" (ISO 8601)}.
nlohmann::json to_json(const FileInfo& info);

struct Listing {
  std::vector<FileInfo> entries;  // sorted by name
  bool truncated = false;         // there were more than max_entries; the rest are left out
};

// One path's state in a Snapshot. ctime is kept too: a kernel can set mtime back (utimensat),
// but not ctime, so a rewrite that keeps size and mtime is still seen.
struct EntryState {
  FileType type = FileType::kOther;
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
};

struct Snapshot {
  std::map<std::string, EntryState> entries;  // relative path → state; symlinks not followed
  // The walk stopped at max_entries or skipped directories deeper than kMaxSnapshotDepth. A
  // diff against a truncated snapshot can report unseen paths as created or deleted.
  bool truncated = false;
};

enum class ChangeKind { kCreated, kModified, kDeleted };
const char* to_string(ChangeKind kind);  // "created", "modified", "deleted"

struct Change {
  ChangeKind kind = ChangeKind::kCreated;
  std::string path;
  FileType type = FileType::kOther;  // after the change (before it, for kDeleted)
  std::uint64_t size = 0;            // likewise
};

// Validates a relative path from a URL (already percent-decoded) and returns it in canonical
// form: "." components and repeated or trailing slashes collapsed ("a//./b/" → "a/b"). Rejects
// with "bad_path": empty, absolute, NUL bytes, any ".." component, PATH_MAX bytes or more, and
// paths that collapse to nothing ("./"). Purely lexical; the WorkDir methods call it themselves.
Result<std::string> normalize(std::string_view url_path);

// Created and deleted paths, and paths whose type, size, mtime or ctime changed, sorted by path.
// Directories are reported when created or deleted, not when their contents change.
std::vector<Change> diff(const Snapshot& before, const Snapshot& after);

class WorkDir {
 public:
  // host_path is trusted (the gateway made it); files written get owner_uid/owner_gid.
  // kSharedOwner for both (an unprivileged gateway, which cannot chown): files and dirs stay
  // the gateway's, made 0666/0777 so that the kernel can change them; the work dir itself
  // (2770, the kernel's and the gateway group's) keeps everyone else out.
  static constexpr uid_t kSharedOwner = static_cast<uid_t>(-1);
  static Result<WorkDir> open(const std::string& host_path, uid_t owner_uid, gid_t owner_gid);

  // The whole content of a regular file; "too_large" if it has more than max_bytes.
  Result<std::string> read(std::string_view rel, std::size_t max_bytes) const;

  // Atomically creates or replaces a regular file (see the rules above). With make_parents,
  // missing directories are created one at a time (mode 0755, owned like files).
  Result<FileInfo> write(std::string_view rel, std::string_view data, std::size_t max_bytes,
                         bool make_parents) const;

  // Removes a file, symlink (not its target), other special file, or empty directory.
  Result<void> remove(std::string_view rel) const;

  // The entries of a directory ("" is the root), without following symlinks.
  Result<Listing> list(std::string_view rel_dir,
                       std::size_t max_entries = kDefaultMaxListEntries) const;

  // Every path beneath the root (the root itself excluded), at most max_entries of them.
  Result<Snapshot> snapshot(std::size_t max_entries = kDefaultMaxSnapshotEntries) const;

 private:
  WorkDir(UniqueFd root, uid_t uid, gid_t gid) : root_(std::move(root)), uid_(uid), gid_(gid) {}
  bool shared() const { return uid_ == kSharedOwner; }

  Result<UniqueFd> open_beneath(const std::string& rel, int flags) const;
  Result<UniqueFd> make_parents(const std::string& dir) const;

  UniqueFd root_;  // O_PATH | O_DIRECTORY
  uid_t uid_;
  gid_t gid_;
};

}  // namespace cellgate::store::files
