// The seed notebook (`--seed`, Kernel Gateway's seed_uri) as notebook-http and seeding need it:
// its kernelspec, its language, its code cells in order, and every cell's source (the Swagger
// spec reads all of them, as Kernel Gateway's does). nbformat 4, read as hostile input: at most
// kMaxNotebookBytes, JSON at most 256 levels deep, sources strings or lists of strings.
//
//   CELLGATE_ASSIGN_OR_RETURN(SeedNotebook nb, load_notebook("/srv/api.ipynb"));
//   nb.kernel_name   // metadata.kernelspec.name ("" when it names none)
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::notebook_http {

inline constexpr std::size_t kMaxNotebookBytes = 64u << 20;
inline constexpr std::size_t kMaxCells = 100000;

struct SeedNotebook {
  std::string path;         // as given
  std::string bytes;        // the file, served by /_api/source
  std::string kernel_name;  // metadata.kernelspec.name, or ""
  std::string language;     // metadata.language_info.name, or ""
  std::vector<std::string> code_cells;
  std::vector<std::string> all_cells;  // every cell's source, markdown too
};

// Errors (kInvalidArgument, "invalid_notebook"; kNotFound for a missing file) name the file and
// what is wrong with it.
Result<SeedNotebook> parse_notebook(std::string path, std::string bytes);
Result<SeedNotebook> load_notebook(const std::string& path);

// Kernel Gateway's API title: the file name up to its first '.' (when that is not its first
// character).
std::string notebook_title(std::string_view path);

}  // namespace cellgate::notebook_http
