// The images and PDFs a cell displays, decoded from its mime bundle: what `cellgate exec` saves
// as files (local and --url) and `cellgate run` saves per notebook (--artifacts).
//
//   for (const auto& file : cli::displayed_files(content["data"])) {
//     if (file.bytes) { write(dir + "/plot." + file.extension, *file.bytes); }
//   }
//
// Jupyter sends binary mimes base64-encoded and SVG as text, each as a string or a list of
// strings (nbformat's "multiline_string",
// https://nbformat.readthedocs.io/en/latest/format_description.html).
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cellgate::cli {

struct DisplayedFile {
  std::string mime;       // image/png, image/jpeg, image/gif, image/svg+xml, application/pdf
  std::string extension;  // png, jpg, gif, svg, pdf
  std::optional<std::string> bytes;  // decoded; nullopt when the base64 is not valid
};

// The bundle's images and PDFs in that order (png, jpeg, gif, svg, pdf); values that are not a
// string or a list of strings are left out.
std::vector<DisplayedFile> displayed_files(const nlohmann::json& data);

}  // namespace cellgate::cli
