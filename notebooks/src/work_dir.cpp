#include "work_dir.hpp"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "files.hpp"

namespace cellgate::notebooks {
namespace {

namespace fs = std::filesystem;

// Puts files into the session while they fit under the total cap.
class Copier {
 public:
  Copier(KernelSession& session, std::size_t max_file_bytes, std::vector<std::string>& warnings)
      : session_(session), max_file_bytes_(max_file_bytes), warnings_(warnings) {}

  // False once the total cap is reached: nothing more is copied.
  bool copy(const fs::path& file, const std::string& rel) {
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    if (ec) {
      return true;
    }
    if (size > max_file_bytes_) {
      warnings_.push_back(rel + " (" + std::to_string(size) + " bytes) is over the " +
                          std::to_string(max_file_bytes_) + "-byte file limit: not copied");
      return true;
    }
    if (total_ + size > kCopyTotalBytes) {
      warnings_.push_back("the files beside the notebook are over " +
                          std::to_string(kCopyTotalBytes >> 20) + " MiB: copying stopped before " +
                          rel);
      return false;
    }
    auto bytes = read_file(file.string());
    if (!bytes) {
      warnings_.push_back(bytes.error().message + ": not copied");
      return true;
    }
    if (auto put = session_.put_file(rel, *bytes); !put) {
      warnings_.push_back("cannot copy " + rel +
                          " into the kernel's work dir: " + put.error().message);
      return true;
    }
    total_ += size;
    return true;
  }

 private:
  KernelSession& session_;
  const std::size_t max_file_bytes_;
  std::vector<std::string>& warnings_;
  std::size_t total_ = 0;
};

// The regular files directly in `dir`, not hidden, sorted.
std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::error_code type_ec;
    if (!is_hidden(entry.path()) &&
        entry.symlink_status(type_ec).type() == fs::file_type::regular) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The regular files under `data` (up to kCopyDataDepth down), not hidden, each with its path
// relative to the work dir ("data/..."), sorted.
std::vector<std::pair<fs::path, std::string>> files_under(const fs::path& data) {
  std::vector<std::pair<fs::path, std::string>> files;
  std::error_code ec;
  if (fs::symlink_status(data, ec).type() != fs::file_type::directory) {
    return files;
  }
  fs::recursive_directory_iterator it(data, fs::directory_options::none, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    const auto type = it->symlink_status(type_ec).type();
    if (is_hidden(it->path()) || it.depth() >= kCopyDataDepth) {
      if (type == fs::file_type::directory) {
        it.disable_recursion_pending();
      }
      continue;
    }
    if (type == fs::file_type::regular) {
      files.emplace_back(it->path(), "data/" + fs::relative(it->path(), data).string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

void copy_beside(const std::string& dir, KernelSession& session, std::size_t max_file_bytes,
                 std::vector<std::string>& warnings) {
  Copier copier(session, max_file_bytes, warnings);
  for (const auto& file : files_in(dir)) {
    if (!copier.copy(file, file.filename().string())) {
      return;
    }
  }
  for (const auto& [file, rel] : files_under(fs::path(dir) / "data")) {
    if (!copier.copy(file, rel)) {
      return;
    }
  }
}

}  // namespace cellgate::notebooks
