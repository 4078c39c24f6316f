#include "cellgate/cli/artifacts.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "cellgate/util/text.hpp"

namespace cellgate::cli {

std::vector<DisplayedFile> displayed_files(const nlohmann::json& data) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 5> kMimes = {{
      {"image/png", "png"},
      {"image/jpeg", "jpg"},
      {"image/gif", "gif"},
      {"image/svg+xml", "svg"},
      {"application/pdf", "pdf"},
  }};
  std::vector<DisplayedFile> found;
  if (!data.is_object()) {
    return found;
  }
  for (const auto& [mime, extension] : kMimes) {
    auto value = data.find(std::string(mime));
    if (value == data.end()) {
      continue;
    }
    std::string text;
    if (value->is_string()) {
      text = value->get<std::string>();
    } else if (value->is_array() && std::all_of(value->begin(), value->end(), [](const auto& part) {
                 return part.is_string();
               })) {
      for (const auto& part : *value) {
        text += part.template get_ref<const std::string&>();
      }
    } else {
      continue;
    }
    DisplayedFile file{std::string(mime), std::string(extension), std::nullopt};
    if (mime == "image/svg+xml") {
      file.bytes = std::move(text);
    } else if (auto bytes = base64_decode(text, Base64Spaces::kAnyWhitespace)) {
      file.bytes = std::move(bytes).value();
    }
    found.push_back(std::move(file));
  }
  return found;
}

}  // namespace cellgate::cli
