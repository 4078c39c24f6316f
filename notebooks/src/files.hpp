// Internal: hidden names, reading a file whole, and writing one all or nothing (util's
// atomic_write), with its directory made first. Used for notebooks, artifacts and results files.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"

namespace cellgate::notebooks {

// A name starting with '.': skipped when a directory is listed or copied.
bool is_hidden(const std::filesystem::path& path);

// Errors have reason "unreadable" and name the file.
Result<std::string> read_file(const std::string& path);

// Makes the parent directories, then writes through a temp file renamed over `path` (mode 0644),
// so a reader, or a crash, never sees half a notebook. Errors name the file.
Result<void> write_file(const std::string& path, std::string_view text);

}  // namespace cellgate::notebooks
