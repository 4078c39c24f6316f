// The skeleton of a jail's root: see skeleton.hpp.
#include "skeleton.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "cellgate/unique_fd.hpp"

namespace cellgate::checkpoint {
namespace {

constexpr int kMaxTreeDepth = 32;
constexpr off_t kMaxFileBytes = off_t{1} << 20;  // the root holds /etc/passwd and such

Error fail(const std::string& call) {
  return errno_error(ErrorCode::kInternal, "skeleton", call, errno);
}

Result<void> copy_file(int dir, const std::string& name, const struct stat& st, bool content,
                       const std::string& to) {
  UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out) {
    return fail("open('" + to + "', O_EXCL)");
  }
  if (content) {
    if (st.st_size > kMaxFileBytes) {
      return make_error(ErrorCode::kFailedPrecondition, "skeleton",
                        to + ": a file over 1 MiB on a jail's root");
    }
    UniqueFd in(::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!in) {
      return fail("openat('" + name + "')");
    }
    char buf[8192];
    for (ssize_t n; (n = ::read(in.get(), buf, sizeof buf)) != 0;) {
      if (n < 0 || ::write(out.get(), buf, static_cast<std::size_t>(n)) != n) {
        return fail("copy('" + to + "')");
      }
    }
  }
  if (::fchown(out.get(), st.st_uid, st.st_gid) != 0 || ::fchmod(out.get(), st.st_mode & 07777)) {
    return fail("fchown('" + to + "')");
  }
  return {};
}

Result<void> copy_dir(int dir, dev_t root_dev, const std::string& target, int depth) {
  if (depth > kMaxTreeDepth) {
    return make_error(ErrorCode::kFailedPrecondition, "skeleton", target + ": too deep");
  }
  DIR* stream = ::fdopendir(::dup(dir));
  if (stream == nullptr) {
    return fail("fdopendir('" + target + "')");
  }
  Result<void> result;
  // readdir races only on a DIR* shared between threads; this one is ours alone.
  for (dirent* e; result && (e = ::readdir(stream)) != nullptr;) {  // NOLINT(concurrency-mt-unsafe)
    const std::string name = e->d_name;
    if (name == "." || name == "..") {
      continue;
    }
    const std::string to = target + "/" + name;
    struct stat st {};
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      result = fail("fstatat('" + to + "')");
    } else if (S_ISLNK(st.st_mode)) {
      char link[PATH_MAX] = {};
      const ssize_t n = ::readlinkat(dir, name.c_str(), link, sizeof link - 1);
      if (n <= 0 || ::symlink(link, to.c_str()) != 0 ||
          ::lchown(to.c_str(), st.st_uid, st.st_gid) != 0) {
        result = fail("symlink('" + to + "')");
      }
    } else if (S_ISDIR(st.st_mode)) {
      if (::mkdir(to.c_str(), 0700) != 0 || ::chown(to.c_str(), st.st_uid, st.st_gid) != 0 ||
          ::chmod(to.c_str(), st.st_mode & 07777) != 0) {
        result = fail("mkdir('" + to + "')");
      } else if (st.st_dev == root_dev) {
        UniqueFd sub(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        result = sub ? copy_dir(sub.get(), root_dev, to, depth + 1) : fail("openat('" + to + "')");
      }
    } else if (S_ISREG(st.st_mode)) {
      result = copy_file(dir, name, st, st.st_dev == root_dev, to);
    } else if (st.st_dev != root_dev) {
      result = copy_file(dir, name, st, false, to);  // a device node bound over: a file to mount on
    } else {
      result = make_error(ErrorCode::kFailedPrecondition, "skeleton",
                          to + ": a special file on a jail's root");
    }
  }
  ::closedir(stream);
  return result;
}

}  // namespace

Result<void> copy_skeleton(const std::string& source, const std::string& target) {
  UniqueFd root(::open(source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  struct stat st {};
  if (!root || ::fstat(root.get(), &st) != 0) {
    return fail("open('" + source + "')");
  }
  if (::chmod(target.c_str(), st.st_mode & 07777) != 0) {
    return fail("chmod('" + target + "')");
  }
  return copy_dir(root.get(), st.st_dev, target, 0);
}

}  // namespace cellgate::checkpoint
