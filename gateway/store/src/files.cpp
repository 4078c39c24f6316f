#include "cellgate/store/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <utility>

#include "cellgate/protocol/message.hpp"

namespace cellgate::store::files {
namespace {

// Resolution stays beneath the dirfd (absolute symlinks and ".." above it fail with EXDEV), never
// goes through /proc magic links, and never crosses into another mount.
constexpr std::uint64_t kResolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

// openat2 fails with EAGAIN when a rename raced with resolving ".." (reached here only through
// an in-root symlink such as `up -> ..`); the man page says the caller may retry.
constexpr int kAgainRetries = 16;

constexpr std::string_view kTempPrefix = ".cellgate-tmp-";

int openat2_fd(int dir_fd, const std::string& path, int flags, std::uint64_t resolve) {
  open_how how{};
  how.flags = static_cast<std::uint64_t>(flags) | O_CLOEXEC;
  how.resolve = resolve;
  for (int attempt = 0;; ++attempt) {
    long fd = ::syscall(SYS_openat2, dir_fd, path.c_str(), &how, sizeof(how));
    if (fd >= 0) {
      return static_cast<int>(fd);
    }
    if (errno == EINTR || (errno == EAGAIN && attempt < kAgainRetries)) {
      continue;
    }
    return -1;
  }
}

std::string quote_rel(const std::string& rel) {
  return "'" + rel + "'";
}

// What a failed syscall on a work-dir path means to the files API. `rel` is the relative path:
// messages never show the host path.
Error path_error(int err, const std::string& call, const std::string& rel) {
  switch (err) {
    case ENOENT:
      return make_error(ErrorCode::kNotFound, "not_found", quote_rel(rel) + " does not exist");
    case ENOTDIR:
      return make_error(ErrorCode::kNotFound, "not_found",
                        quote_rel(rel) + " does not exist: a parent of it is not a directory");
    case EXDEV:
    case ELOOP:
      return make_error(ErrorCode::kPermissionDenied, "path_escape",
                        quote_rel(rel) +
                            " is a symlink, or goes through one that leads out of the " +
                            "work dir; such links are not followed");
    case ENXIO:  // open(2) of a socket, or of a device with no driver
    case ENODEV:
      return make_error(ErrorCode::kFailedPrecondition, "not_a_file",
                        quote_rel(rel) + " is a socket or device, not a regular file");
    case ENAMETOOLONG:
      return make_error(ErrorCode::kInvalidArgument, "bad_path",
                        quote_rel(rel) + " has a component longer than NAME_MAX");
    case EAGAIN:
      return make_error(ErrorCode::kUnavailable, "busy",
                        quote_rel(rel) + " could not be resolved while the kernel renames " +
                            "directories; try again");
    case ENOSPC:
    case EDQUOT:
      return make_error(ErrorCode::kResourceExhausted, "no_space",
                        "the work dir is full (writing " + quote_rel(rel) + ")");
    case EACCES:
    case EPERM:
      return errno_error(ErrorCode::kPermissionDenied, "permission_denied", call, err);
    default:
      return errno_error(ErrorCode::kInternal, "io_error", call, err);
  }
}

std::string open_call(const std::string& rel) {
  return "openat2(<work dir>, " + quote_rel(rel) + ")";
}

Error bad_path(const std::string& why) {
  return make_error(ErrorCode::kInvalidArgument, "bad_path", why);
}

Error too_large(const std::string& rel, std::size_t max_bytes) {
  return make_error(
      ErrorCode::kResourceExhausted, "too_large",
      quote_rel(rel) + " is larger than the limit of " + std::to_string(max_bytes) + " bytes");
}

FileType type_of(mode_t mode) {
  if (S_ISREG(mode)) {
    return FileType::kFile;
  }
  if (S_ISDIR(mode)) {
    return FileType::kDirectory;
  }
  if (S_ISLNK(mode)) {
    return FileType::kSymlink;
  }
  return FileType::kOther;
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) {
    return "a directory";
  }
  if (S_ISFIFO(mode)) {
    return "a FIFO";
  }
  if (S_ISSOCK(mode)) {
    return "a socket";
  }
  if (S_ISCHR(mode) || S_ISBLK(mode)) {
    return "a device";
  }
  if (S_ISLNK(mode)) {
    return "a symlink";
  }
  return "not a regular file";
}

std::int64_t nanos(const timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

// "a/b/c" → {"a/b", "c"}; "c" → {"", "c"}. `rel` is normalized.
std::pair<std::string, std::string> split_parent(const std::string& rel) {
  std::size_t slash = rel.rfind('/');
  if (slash == std::string::npos) {
    return {"", rel};
  }
  return {rel.substr(0, slash), rel.substr(slash + 1)};
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

// Calls on_entry(name, lstat) for each entry of the directory `dir_fd` (which stays open) but
// "." and "..", until it returns false. Entries that vanish while we look are skipped.
template <typename OnEntry>
Result<void> for_each_entry(int dir_fd, const std::string& rel, OnEntry&& on_entry) {
  UniqueFd own(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
  if (!own) {
    return errno_error(ErrorCode::kInternal, "io_error", "fcntl(F_DUPFD_CLOEXEC)", errno);
  }
  // The dup shares the file offset; rewind so that every walk of dir_fd starts at the top.
  ::lseek(own.get(), 0, SEEK_SET);
  DirPtr dir(::fdopendir(own.get()));
  if (!dir) {
    return errno_error(ErrorCode::kInternal, "io_error", "fdopendir(" + quote_rel(rel) + ")",
                       errno);
  }
  own.release();  // closedir closes it now
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(dir.get());
    if (entry == nullptr) {
      if (errno != 0) {
        return errno_error(ErrorCode::kInternal, "io_error", "readdir(" + quote_rel(rel) + ")",
                           errno);
      }
      return ok_result();
    }
    const std::string name = entry->d_name;
    if (name == "." || name == "..") {
      continue;
    }
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) {
        continue;
      }
      return path_error(errno, "fstatat(" + quote_rel(join(rel, name)) + ")", join(rel, name));
    }
    if (!on_entry(name, st)) {
      return ok_result();
    }
  }
}

// A `.cellgate-tmp-<random>` file in a work-dir directory, unlinked on scope exit unless
// commit() says it was renamed into place.
class TempFile {
 public:
  static Result<TempFile> create(int dir_fd, const std::string& rel) {
    for (int attempt = 0; attempt < 8; ++attempt) {
      unsigned char bytes[8];
      if (::getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
        return errno_error(ErrorCode::kInternal, "io_error", "getrandom", errno);
      }
      std::string name(kTempPrefix);
      for (unsigned char b : bytes) {
        char hex[3];
        std::snprintf(hex, sizeof(hex), "%02x", b);
        name += hex;
      }
      // O_EXCL with O_CREAT never follows a symlink and never opens what the kernel planted.
      int fd = ::openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                        0600);
      if (fd >= 0) {
        return TempFile(dir_fd, std::move(name), UniqueFd(fd));
      }
      if (errno != EEXIST) {
        return path_error(errno, "openat(" + quote_rel(rel) + " temp, O_CREAT|O_EXCL)", rel);
      }
    }
    return make_error(ErrorCode::kInternal, "io_error",
                      "could not pick a free temporary name next to " + quote_rel(rel));
  }

  TempFile(TempFile&& other) noexcept
      : dir_fd_(other.dir_fd_), name_(std::exchange(other.name_, {})), fd_(std::move(other.fd_)) {}
  TempFile& operator=(TempFile&&) = delete;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!name_.empty()) {
      ::unlinkat(dir_fd_, name_.c_str(), 0);
    }
  }

  int fd() const { return fd_.get(); }
  const std::string& name() const { return name_; }
  void commit() { name_.clear(); }

 private:
  TempFile(int dir_fd, std::string name, UniqueFd fd)
      : dir_fd_(dir_fd), name_(std::move(name)), fd_(std::move(fd)) {}

  int dir_fd_;  // borrowed; outlives this
  std::string name_;
  UniqueFd fd_;
};

Result<void> write_all(int fd, std::string_view data, const std::string& rel) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return path_error(errno, "write(" + quote_rel(rel) + ")", rel);
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return ok_result();
}

EntryState state_of(const struct stat& st) {
  return EntryState{type_of(st.st_mode), static_cast<std::uint64_t>(st.st_size), nanos(st.st_mtim),
                    nanos(st.st_ctim)};
}

// Records the entries of `dir_fd` (at `prefix`, `depth` components below the root) and walks
// into its subdirectories, never through a symlink.
Result<void> walk(int dir_fd, const std::string& prefix, int depth, std::size_t max_entries,
                  Snapshot& snap) {
  std::vector<std::string> subdirs;
  CELLGATE_TRY(for_each_entry(dir_fd, prefix, [&](const std::string& name, const struct stat& st) {
    if (snap.entries.size() >= max_entries) {
      snap.truncated = true;
      return false;
    }
    snap.entries.emplace(join(prefix, name), state_of(st));
    if (S_ISDIR(st.st_mode)) {
      subdirs.push_back(name);
    }
    return true;
  }));
  for (const std::string& name : subdirs) {
    if (snap.truncated && snap.entries.size() >= max_entries) {
      return ok_result();
    }
    if (depth + 1 >= kMaxSnapshotDepth) {
      snap.truncated = true;  // its entries would be deeper than kMaxSnapshotDepth
      continue;
    }
    UniqueFd sub(openat2_fd(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK,
                            kResolve | RESOLVE_NO_SYMLINKS));
    if (!sub) {
      continue;  // gone or swapped for something else since readdir: the kernel's race, skip
    }
    CELLGATE_TRY(walk(sub.get(), join(prefix, name), depth + 1, max_entries, snap));
  }
  return ok_result();
}

bool changed(const EntryState& a, const EntryState& b) {
  if (a.type != b.type) {
    return true;
  }
  if (a.type == FileType::kDirectory) {
    return false;  // its entries are reported themselves
  }
  return a.size != b.size || a.mtime_ns != b.mtime_ns || a.ctime_ns != b.ctime_ns;
}

}  // namespace

const char* to_string(FileType type) {
  switch (type) {
    case FileType::kFile:
      return "file";
    case FileType::kDirectory:
      return "directory";
    case FileType::kSymlink:
      return "symlink";
    case FileType::kOther:
      return "other";
  }
  return "other";
}

const char* to_string(ChangeKind kind) {
  switch (kind) {
    case ChangeKind::kCreated:
      return "created";
    case ChangeKind::kModified:
      return "modified";
    case ChangeKind::kDeleted:
      return "deleted";
  }
  return "modified";
}

Result<std::string> normalize(std::string_view url_path) {
  if (url_path.empty()) {
    return bad_path("the path is empty");
  }
  if (url_path.size() >= PATH_MAX) {
    return bad_path("the path is longer than " + std::to_string(PATH_MAX - 1) + " bytes");
  }
  if (url_path.find('\0') != std::string_view::npos) {
    return bad_path("the path contains a NUL byte");
  }
  if (url_path.front() == '/') {
    return bad_path("the path must be relative to the work dir, not absolute");
  }
  std::string out;
  out.reserve(url_path.size());
  while (!url_path.empty()) {
    std::size_t slash = url_path.find('/');
    std::string_view part = url_path.substr(0, slash);
    url_path.remove_prefix(slash == std::string_view::npos ? url_path.size() : slash + 1);
    if (part.empty() || part == ".") {
      continue;
    }
    if (part == "..") {
      return bad_path("the path may not contain '..'");
    }
    if (!out.empty()) {
      out += '/';
    }
    out += part;
  }
  if (out.empty()) {
    return bad_path("the path names no file");
  }
  return out;
}

std::vector<Change> diff(const Snapshot& before, const Snapshot& after) {
  std::vector<Change> changes;
  auto b = before.entries.begin();
  auto a = after.entries.begin();
  while (b != before.entries.end() || a != after.entries.end()) {
    if (a == after.entries.end() || (b != before.entries.end() && b->first < a->first)) {
      changes.push_back({ChangeKind::kDeleted, b->first, b->second.type, b->second.size});
      ++b;
    } else if (b == before.entries.end() || a->first < b->first) {
      changes.push_back({ChangeKind::kCreated, a->first, a->second.type, a->second.size});
      ++a;
    } else {
      if (changed(b->second, a->second)) {
        changes.push_back({ChangeKind::kModified, a->first, a->second.type, a->second.size});
      }
      ++a;
      ++b;
    }
  }
  return changes;
}

Result<WorkDir> WorkDir::open(const std::string& host_path, uid_t owner_uid, gid_t owner_gid) {
  UniqueFd root(::open(host_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) {
    return errno_error(ErrorCode::kFailedPrecondition, "no_work_dir",
                       "open('" + host_path + "', O_PATH|O_DIRECTORY)", errno);
  }
  // Fail here, once, rather than on every request if the host cannot confine paths.
  UniqueFd probe(openat2_fd(root.get(), ".", O_PATH | O_DIRECTORY, kResolve));
  if (!probe) {
    if (errno == ENOSYS || errno == EPERM) {
      return errno_error(ErrorCode::kFailedPrecondition, "no_openat2",
                         "openat2 (Linux 5.6+; a container's seccomp profile may block it), "
                         "needed to confine the files API to the work dir",
                         errno);
    }
    return errno_error(ErrorCode::kFailedPrecondition, "no_work_dir",
                       "openat2('" + host_path + "', RESOLVE_BENEATH)", errno);
  }
  return WorkDir(std::move(root), owner_uid, owner_gid);
}

Result<UniqueFd> WorkDir::open_beneath(const std::string& rel, int flags) const {
  UniqueFd fd(openat2_fd(root_.get(), rel.empty() ? std::string(".") : rel, flags, kResolve));
  if (!fd) {
    return path_error(errno, open_call(rel), rel);
  }
  return fd;
}

Result<std::string> WorkDir::read(std::string_view rel_path, std::size_t max_bytes) const {
  CELLGATE_ASSIGN_OR_RETURN(std::string rel, normalize(rel_path));
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. O_NOFOLLOW: a
  // symlink as the last component fails with ELOOP (path_escape) instead of being followed.
  CELLGATE_ASSIGN_OR_RETURN(UniqueFd fd,
                            open_beneath(rel, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return errno_error(ErrorCode::kInternal, "io_error", "fstat(" + quote_rel(rel) + ")", errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return make_error(ErrorCode::kFailedPrecondition, "not_a_file",
                      quote_rel(rel) + " is " + kind_of(st.st_mode) + ", not a regular file");
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    return too_large(rel, max_bytes);
  }
  // The kernel may keep appending: read at most max_bytes + 1, whatever fstat said.
  constexpr std::size_t kChunk = 1 << 16;
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  while (true) {
    const std::size_t remaining = max_bytes - out.size();
    const std::size_t want = remaining >= kChunk ? kChunk : remaining + 1;
    const std::size_t old = out.size();
    out.resize(old + want);
    ssize_t n = ::read(fd.get(), out.data() + old, want);
    if (n < 0) {
      if (errno == EINTR) {
        out.resize(old);
        continue;
      }
      return errno_error(ErrorCode::kInternal, "io_error", "read(" + quote_rel(rel) + ")", errno);
    }
    out.resize(old + static_cast<std::size_t>(n));
    if (out.size() > max_bytes) {
      return too_large(rel, max_bytes);
    }
    if (n == 0) {
      return out;
    }
  }
}

Result<UniqueFd> WorkDir::make_parents(const std::string& dir) const {
  CELLGATE_ASSIGN_OR_RETURN(UniqueFd cur, open_beneath("", O_PATH | O_DIRECTORY));
  for (std::size_t start = 0; start < dir.size();) {
    std::size_t end = dir.find('/', start);
    if (end == std::string::npos) {
      end = dir.size();
    }
    const std::string prefix = dir.substr(0, end);
    const std::string name = dir.substr(start, end - start);
    start = end + 1;
    // Each prefix is resolved from the root again, so symlinks in it are checked like anywhere.
    UniqueFd next(openat2_fd(root_.get(), prefix, O_PATH | O_DIRECTORY, kResolve));
    if (!next && errno == ENOENT) {
      if (::mkdirat(cur.get(), name.c_str(), 0755) == 0) {
        // Open what we just made without following anything (the kernel may have swapped it
        // already), then give it to the kernel's user.
        next.reset(openat2_fd(cur.get(), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW,
                              kResolve | RESOLVE_NO_SYMLINKS));
        if (!next) {
          return path_error(errno, open_call(prefix), prefix);
        }
        if (::fchown(next.get(), uid_, gid_) != 0 ||
            ::fchmod(next.get(), shared() ? 0777 : 0755) != 0) {
          return errno_error(ErrorCode::kInternal, "io_error",
                             "fchown/fchmod(" + quote_rel(prefix) + ")", errno);
        }
      } else if (errno == EEXIST) {
        next.reset(openat2_fd(root_.get(), prefix, O_PATH | O_DIRECTORY, kResolve));
      } else {
        return path_error(errno, "mkdirat(" + quote_rel(prefix) + ")", prefix);
      }
    }
    if (!next) {
      return path_error(errno, open_call(prefix), prefix);
    }
    cur = std::move(next);
  }
  return cur;
}

Result<FileInfo> WorkDir::write(std::string_view rel_path, std::string_view data,
                                std::size_t max_bytes, bool make_parents) const {
  CELLGATE_ASSIGN_OR_RETURN(std::string rel, normalize(rel_path));
  if (data.size() > max_bytes) {
    return too_large(rel, max_bytes);
  }
  auto [parent, leaf] = split_parent(rel);
  UniqueFd dir;
  if (make_parents && !parent.empty()) {
    CELLGATE_ASSIGN_OR_RETURN(dir, this->make_parents(parent));
  } else {
    CELLGATE_ASSIGN_OR_RETURN(dir, open_beneath(parent, O_PATH | O_DIRECTORY));
  }

  CELLGATE_ASSIGN_OR_RETURN(TempFile temp, TempFile::create(dir.get(), rel));
  CELLGATE_TRY(write_all(temp.fd(), data, rel));
  if (::fchown(temp.fd(), uid_, gid_) != 0) {
    return errno_error(ErrorCode::kInternal, "io_error", "fchown(" + quote_rel(rel) + " temp)",
                       errno);
  }
  if (::fchmod(temp.fd(), shared() ? 0666 : 0644) != 0) {
    return errno_error(ErrorCode::kInternal, "io_error", "fchmod(" + quote_rel(rel) + " temp)",
                       errno);
  }
  struct stat st {};
  if (::fstat(temp.fd(), &st) != 0) {
    return errno_error(ErrorCode::kInternal, "io_error", "fstat(" + quote_rel(rel) + " temp)",
                       errno);
  }
  // rename(2) replaces whatever non-directory has the name (a symlink itself, never its
  // target) and fails with EISDIR over a directory: the kernel checks, so nothing can race it.
  if (::renameat(dir.get(), temp.name().c_str(), dir.get(), leaf.c_str()) != 0) {
    if (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) {
      return make_error(ErrorCode::kFailedPrecondition, "not_a_file",
                        quote_rel(rel) + " is a directory; it is not replaced by a file");
    }
    return path_error(errno, "renameat(" + quote_rel(rel) + ")", rel);
  }
  temp.commit();
  return FileInfo{leaf, rel, FileType::kFile, static_cast<std::uint64_t>(st.st_size),
                  nanos(st.st_mtim)};
}

Result<void> WorkDir::remove(std::string_view rel_path) const {
  CELLGATE_ASSIGN_OR_RETURN(std::string rel, normalize(rel_path));
  auto [parent, leaf] = split_parent(rel);
  CELLGATE_ASSIGN_OR_RETURN(UniqueFd dir, open_beneath(parent, O_PATH | O_DIRECTORY));
  // unlinkat never follows the last component: a symlink goes, its target stays.
  if (::unlinkat(dir.get(), leaf.c_str(), 0) == 0) {
    return ok_result();
  }
  int err = errno;
  if (err == EISDIR) {
    if (::unlinkat(dir.get(), leaf.c_str(), AT_REMOVEDIR) == 0) {
      return ok_result();
    }
    err = errno;
    if (err == ENOTEMPTY || err == EEXIST) {
      return make_error(ErrorCode::kFailedPrecondition, "not_empty",
                        quote_rel(rel) + " is a directory that is not empty");
    }
  }
  return path_error(err, "unlinkat(" + quote_rel(rel) + ")", rel);
}

Result<Listing> WorkDir::list(std::string_view rel_dir, std::size_t max_entries) const {
  std::string rel;
  if (!rel_dir.empty()) {
    CELLGATE_ASSIGN_OR_RETURN(rel, normalize(rel_dir));
  }
  UniqueFd dir(openat2_fd(root_.get(), rel.empty() ? std::string(".") : rel,
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK, kResolve));
  if (!dir) {
    if (errno != ENOTDIR) {
      return path_error(errno, open_call(rel), rel);
    }
    // O_DIRECTORY | O_NOFOLLOW on a symlink gives ENOTDIR, not ELOOP. Look at what is there
    // (O_PATH | O_NOFOLLOW opens the link itself) only to choose the error; nothing is done
    // through this fd.
    UniqueFd what(openat2_fd(root_.get(), rel, O_PATH | O_NOFOLLOW, kResolve));
    struct stat st {};
    if (what && ::fstat(what.get(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return path_error(ELOOP, open_call(rel), rel);
    }
    return make_error(ErrorCode::kFailedPrecondition, "not_a_directory",
                      quote_rel(rel) + " (or a parent of it) is not a directory");
  }
  Listing listing;
  CELLGATE_TRY(for_each_entry(dir.get(), rel, [&](const std::string& name, const struct stat& st) {
    if (listing.entries.size() >= max_entries) {
      listing.truncated = true;
      return false;
    }
    listing.entries.push_back(FileInfo{name, join(rel, name), type_of(st.st_mode),
                                       static_cast<std::uint64_t>(st.st_size), nanos(st.st_mtim)});
    return true;
  }));
  std::sort(listing.entries.begin(), listing.entries.end(),
            [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
  return listing;
}

Result<Snapshot> WorkDir::snapshot(std::size_t max_entries) const {
  CELLGATE_ASSIGN_OR_RETURN(UniqueFd dir, open_beneath("", O_RDONLY | O_DIRECTORY | O_NONBLOCK));
  Snapshot snap;
  CELLGATE_TRY(walk(dir.get(), "", 0, max_entries, snap));
  return snap;
}

nlohmann::json to_json(const FileInfo& info) {
  const auto mtime = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(info.mtime_ns)));
  return nlohmann::json{{"name", info.name},
                        {"path", info.path},
                        {"type", to_string(info.type)},
                        {"size", info.size},
                        {"mtime", protocol::iso8601(mtime)}};
}

}  // namespace cellgate::store::files
