#include "kernelspecs.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;

kernel::KernelSpec builtin_python3() {
  kernel::KernelSpec spec;
  spec.name = "python3";
  spec.display_name = "Python 3";
  spec.language = "python";
  spec.argv = {"/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"};
  return spec;
}

}  // namespace

std::vector<kernel::KernelSpec> list_kernelspecs() {
  std::vector<kernel::KernelSpec> out;
  std::set<std::string> seen;
  for (const auto& dir : kernel::kernelspec_dirs()) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (seen.count(name) != 0 || !fs::is_regular_file(entry.path() / "kernel.json", ec)) {
        continue;
      }
      if (auto spec = kernel::KernelSpec::load(entry.path().string(), name)) {
        seen.insert(name);
        out.push_back(std::move(spec).value());
      }
    }
  }
  if (seen.count("python3") == 0) {
    out.push_back(builtin_python3());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

Result<kernel::KernelSpec> find_kernelspec(const std::string& name) {
  auto found = kernel::find_kernelspec(name);
  if (!found && name == "python3" && found.error().code == ErrorCode::kNotFound) {
    return builtin_python3();
  }
  return found;
}

bool is_ipykernel(const kernel::KernelSpec& spec) {
  for (std::size_t i = 0; i + 1 < spec.argv.size(); ++i) {
    if (spec.argv[i] == "-m" &&
        (spec.argv[i + 1] == "ipykernel_launcher" || spec.argv[i + 1] == "ipykernel")) {
      return true;
    }
  }
  return false;
}

}  // namespace cellgate::kernels
