#include "files.hpp"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cellgate/util/fs.hpp"

namespace cellgate::notebooks {

bool is_hidden(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name.front() == '.';
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return errno_error(ErrorCode::kInvalidArgument, "unreadable", "open('" + path + "')", errno);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return make_error(ErrorCode::kInvalidArgument, "unreadable", "cannot read " + path);
  }
  return text.str();
}

Result<void> write_file(const std::string& path, std::string_view text) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (std::error_code ec; !parent.empty()) {
    std::filesystem::create_directories(parent, ec);
  }
  if (auto written = atomic_write(path, text, 0644); !written) {
    return make_error(ErrorCode::kInternal, "write_failed",
                      "cannot write " + path + ": " + written.error().message);
  }
  return ok_result();
}

}  // namespace cellgate::notebooks
