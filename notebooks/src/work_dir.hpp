// Internal: the files a notebook finds in its kernel's work dir (its cwd), so that relative paths
// such as data/sales.csv work: the regular files in the notebook's directory and everything under
// its data/ folder, copied through KernelSession::put_file.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cellgate/notebooks/backend.hpp"

namespace cellgate::notebooks {

// What is copied at most.
inline constexpr std::size_t kCopyTotalBytes = std::size_t{64} << 20;
inline constexpr int kCopyDataDepth = 8;  // directories below data/

// Copies the regular files of `dir` and those under `dir`/data/ (sorted). Hidden files and
// symlinks are skipped (a symlink could hand a host file to the notebook's code); so are files
// over `max_file_bytes`, and everything past kCopyTotalBytes. Each skip is a warning.
void copy_beside(const std::string& dir, KernelSession& session, std::size_t max_file_bytes,
                 std::vector<std::string>& warnings);

}  // namespace cellgate::notebooks
