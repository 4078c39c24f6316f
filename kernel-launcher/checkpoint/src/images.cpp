// The image store: see images.hpp.
#include "cellgate/checkpoint/images.hpp"

#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

namespace cellgate::checkpoint {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::uint64_t bytes_under(const std::string& dir) {
  std::uint64_t bytes = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) {
      bytes += it->file_size(ec);
    }
  }
  return bytes;
}

namespace {

Error no_image(const std::string& id) {
  return make_error(ErrorCode::kNotFound, "no_image", "no checkpoint image '" + id + "'");
}

}  // namespace

bool ImageStore::valid_id(const std::string& id) {
  if (id.size() != 32) {
    return false;
  }
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

Result<ImageStore> ImageStore::open(std::string root, std::uint64_t budget_bytes) {
  if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
    return errno_error(ErrorCode::kInternal, "image_store", "mkdir('" + root + "')", errno);
  }
  struct stat st {};
  if (::lstat(root.c_str(), &st) != 0) {
    return errno_error(ErrorCode::kInternal, "image_store", "lstat('" + root + "')", errno);
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return make_error(ErrorCode::kFailedPrecondition, "image_store",
                      root +
                          " must be a directory of this user's that only it can open (0700): "
                          "checkpoint images hold kernels' memory");
  }
  return ImageStore(std::move(root), budget_bytes);
}

Result<std::string> ImageStore::reserve(std::string_view prefix) const {
  if (prefix.size() > 16 || !valid_id(std::string(prefix) + std::string(32 - prefix.size(), '0'))) {
    return make_error(ErrorCode::kInvalidArgument, "image_store",
                      "an id prefix is up to 16 lowercase hex digits");
  }
  if (budget_ > 0) {
    if (const std::uint64_t used = used_bytes(); used >= budget_) {
      return make_error(ErrorCode::kResourceExhausted, "no_space",
                        "checkpoint images take " + std::to_string(used >> 20) +
                            " MiB, their budget is " + std::to_string(budget_ >> 20) +
                            " MiB: remove some (or raise the budget)");
    }
  }
  for (int attempt = 0; attempt < 8; ++attempt) {
    unsigned char bytes[16];
    if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
      return errno_error(ErrorCode::kInternal, "image_store", "getrandom()", errno);
    }
    std::string id;
    for (unsigned char b : bytes) {
      static constexpr char kHex[] = "0123456789abcdef";
      id += kHex[b >> 4];
      id += kHex[b & 15];
    }
    id.replace(0, prefix.size(), prefix);
    struct stat st {};
    if (::lstat(dir_of(id).c_str(), &st) != 0 && errno == ENOENT) {
      return id;
    }
  }
  return make_error(ErrorCode::kInternal, "image_store", "no free image id in 8 draws");
}

Result<std::string> ImageStore::find(const std::string& id) const {
  if (!valid_id(id)) {
    return no_image(id);
  }
  struct stat st {};
  if (::lstat(dir_of(id).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return no_image(id);
  }
  return dir_of(id);
}

Result<void> ImageStore::remove(const std::string& id) const {
  CELLGATE_ASSIGN_OR_RETURN(std::string dir, find(id));
  std::error_code ec;
  fs::remove_all(dir, ec);  // removes symlinks themselves, never what they point to
  if (ec) {
    return make_error(ErrorCode::kInternal, "image_store",
                      "remove('" + dir + "'): " + ec.message());
  }
  return {};
}

std::vector<std::string> ImageStore::list() const {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    if (valid_id(name) && e.is_directory(ec) && !e.is_symlink(ec)) {
      ids.push_back(name);
    }
  }
  return ids;
}

std::uint64_t ImageStore::used_bytes() const {
  return bytes_under(root_);
}

}  // namespace cellgate::checkpoint
