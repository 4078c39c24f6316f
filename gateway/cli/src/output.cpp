#include "output.hpp"

#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <fstream>
#include <iostream>

#include "cellgate/cli/artifacts.hpp"
#include "cellgate/store/artifacts.hpp"

namespace cellgate::cli::detail {

std::vector<std::string> ArtifactSaver::save(const nlohmann::json& data) {
  std::vector<std::string> lines;
  for (const auto& file : displayed_files(data)) {
    const std::string& mime = file.mime;
    if (!file.bytes) {
      lines.push_back("<" + mime + ": not valid base64, not saved>");
      continue;
    }
    if (!made_) {
      if (dir_.empty()) {
        const char* tmp = std::getenv("TMPDIR");
        std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                              "/cellgate-artifacts-XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr) {
          lines.push_back("<" + mime + ": cannot make a directory for artifacts>");
          continue;
        }
        dir_ = pattern;
      } else {
        std::error_code ec;
        std::filesystem::create_directories(dir_, ec);
      }
      made_ = true;
    }
    const std::string path =
        dir_ + "/" + store::sha256_hex(*file.bytes).substr(0, 16) + "." + file.extension;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(file.bytes->data(), static_cast<std::streamsize>(file.bytes->size()));
    lines.push_back(out ? "<" + mime + " saved to " + path + ">"
                        : "<" + mime + ": cannot write " + path + ">");
  }
  return lines;
}

void print_bundle(const nlohmann::json& data, ArtifactSaver& saver) {
  if (!data.is_object()) {
    return;
  }
  const auto saved = saver.save(data);
  for (const auto& line : saved) {
    std::cout << line << "\n";
  }
  if (auto text = data.find("text/plain"); text != data.end() && text->is_string()) {
    // A figure's text/plain is its repr ("<Figure size 640x480 with 1 Axes>"): the saved
    // path says more.
    if (saved.empty()) {
      std::cout << text->get<std::string>() << "\n";
    }
  } else if (saved.empty()) {
    for (auto& [mime, value] : data.items()) {
      std::size_t size = value.is_string() ? value.get_ref<const std::string&>().size() : 0;
      std::cout << "<" << mime << ", " << size << " bytes>\n";
    }
  }
  std::cout << std::flush;
}

}  // namespace cellgate::cli::detail
