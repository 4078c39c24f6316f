// Internal: how `cellgate exec` prints what a cell displays, the same for a local kernel and a
// gateway's streamed events (exec.cpp, remote_exec.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/cli/exec.hpp"

namespace cellgate::cli::detail {

// Saves the images and PDFs of a mime bundle as DIR/<sha256 prefix>.<ext>; DIR is --artifacts,
// else a fresh directory under $TMPDIR made on the first save. Returns "<mime saved to PATH>"
// lines (or what went wrong) for the terminal.
class ArtifactSaver {
 public:
  explicit ArtifactSaver(std::string dir) : dir_(std::move(dir)) {}
  std::vector<std::string> save(const nlohmann::json& data);

 private:
  std::string dir_;
  bool made_ = false;
};

// Prints an execute_result's or display_data's bundle: the saved files, else its text/plain,
// else one "<mime, N bytes>" line per mime.
void print_bundle(const nlohmann::json& data, ArtifactSaver& saver);

// `cellgate exec --url`: remote_exec.cpp.
int run_remote_exec(const ExecOptions& options, const std::string& code);

}  // namespace cellgate::cli::detail
