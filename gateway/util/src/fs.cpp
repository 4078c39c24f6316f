#include "cellgate/util/fs.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

#include "cellgate/unique_fd.hpp"

namespace cellgate {

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
    return errno_error(ErrorCode::kInternal, reason, "rename('" + tmp + "', '" + path + "')",
                       err);
  }
  // The rename itself is durable once the directory is (ext4 usually gets there anyway).
  if (durability == Durability::kFsync) {
    if (UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) {
      (void)::fsync(d.get());
    }
  }
  return {};
}

}  // namespace cellgate
