#include "cellgate/sys/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "cellgate/unique_fd.hpp"

namespace cellgate::sys {

ErrorCode code_for_errno(int err) {
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS:
      return ErrorCode::kPermissionDenied;
    default:
      return ErrorCode::kInternal;
  }
}

Result<std::string> read_file(const std::string& path, std::size_t max_bytes, const char* reason) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return errno_error(code_for_errno(err), reason, "open('" + path + "', O_RDONLY)", err);
  }
  std::string out;
  char buf[4096];
  while (out.size() < max_bytes) {
    const ssize_t n = ::read(fd.get(), buf, std::min(sizeof buf, max_bytes - out.size()));
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      const int err = errno;
      return errno_error(code_for_errno(err), reason, "read('" + path + "')", err);
    }
    if (n == 0) {
      break;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

Result<std::optional<std::string>> read_optional(const std::string& path, std::size_t max_bytes,
                                                 const char* reason) {
  auto text = read_file(path, max_bytes, reason);
  if (!text) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      return std::optional<std::string>();
    }
    return std::move(text).error();
  }
  return std::optional<std::string>(std::move(text).value());
}

std::string read_trimmed(const std::string& path) {
  auto text = read_file(path, 1 << 16);
  if (!text) {
    return "";
  }
  std::string& s = *text;
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) {
    return "";
  }
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

Result<void> write_file(const std::string& path, std::string_view value, const char* reason,
                        bool truncate) {
  const std::string call = "write('" + path + "', '" + std::string(value) + "')";
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | (truncate ? O_TRUNC : 0)));
  if (!fd) {
    const int err = errno;
    return errno_error(code_for_errno(err), reason, call, err);
  }
  ssize_t n = -1;
  do {
    n = ::write(fd.get(), value.data(), value.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int err = errno;
    return errno_error(code_for_errno(err), reason, call, err);
  }
  if (static_cast<std::size_t>(n) != value.size()) {
    return make_error(ErrorCode::kInternal, reason, call + ": short write");
  }
  return {};
}

Result<void> atomic_write(const std::string& path, std::string_view data, mode_t mode,
                          Durability durability, const char* reason) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  // mkostemp makes the name unique and the file O_EXCL (0600); the mode is set before any byte.
  std::string tmp = path + ".tmp.XXXXXX";
  UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (!fd) {
    return errno_error(ErrorCode::kInternal, reason, "mkostemp('" + tmp + "')", errno);
  }
  auto fail = [&](const std::string& call) {
    const int err = errno;
    fd.reset();
    ::unlink(tmp.c_str());
    return errno_error(ErrorCode::kInternal, reason, call, err);
  };
  if (::fchmod(fd.get(), mode) != 0) {
    return fail("fchmod('" + tmp + "')");
  }
  for (std::size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return fail("write('" + tmp + "')");
    }
    done += static_cast<std::size_t>(n);
  }
  if (durability == Durability::kFsync && ::fsync(fd.get()) != 0) {
    return fail("fsync('" + tmp + "')");
  }
  if (::close(fd.release()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return errno_error(ErrorCode::kInternal, reason, "close('" + tmp + "')", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return errno_error(ErrorCode::kInternal, reason, "rename('" + tmp + "', '" + path + "')", err);
  }
  // The rename itself is durable once the directory is (ext4 usually gets there anyway).
  if (durability == Durability::kFsync) {
    if (UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) {
      (void)::fsync(d.get());
    }
  }
  return {};
}

Result<std::string> read_link(const std::string& path) {
  char buf[4096];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) {
    return errno_error(code_for_errno(errno), "readlink", "readlink('" + path + "')", errno);
  }
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace cellgate::sys
