#include "cellgate/sys/dir_stream.hpp"

#include <cerrno>
#include <utility>

namespace cellgate::sys {

DirStream::~DirStream() {
  if (dir_ != nullptr) {
    ::closedir(dir_);
  }
}

DirStream::DirStream(DirStream&& other) noexcept : dir_(std::exchange(other.dir_, nullptr)) {}

DirStream& DirStream::operator=(DirStream&& other) noexcept {
  if (this != &other) {
    if (dir_ != nullptr) {
      ::closedir(dir_);
    }
    dir_ = std::exchange(other.dir_, nullptr);
  }
  return *this;
}

Result<DirStream> DirStream::open(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) {
    const int err = errno;
    return errno_error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInternal, "opendir",
                       "opendir('" + path + "')", err);
  }
  return DirStream(d);
}

std::optional<DirStream::Entry> DirStream::next() {
  if (dir_ == nullptr) {
    return std::nullopt;
  }
  // readdir(3) races only on one DIR* shared between threads (glibc's "race:dirstream"); a
  // DirStream has one owner, and readdir_r is deprecated.
  while (const dirent* e = ::readdir(dir_)) {  // NOLINT(concurrency-mt-unsafe)
    const std::string_view name = e->d_name;
    if (name == "." || name == "..") {
      continue;
    }
    return Entry{std::string(name), e->d_type};
  }
  return std::nullopt;
}

int DirStream::fd() const {
  return dir_ != nullptr ? ::dirfd(dir_) : -1;
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  auto dir = DirStream::open(path);
  if (!dir) {
    return out;
  }
  while (auto e = dir->next()) {
    out.push_back(std::move(e->name));
  }
  return out;
}

}  // namespace cellgate::sys
