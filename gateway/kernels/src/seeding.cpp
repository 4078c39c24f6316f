// serve --seed in the jupyter-websocket mode (seeding.hpp).
#include "seeding.hpp"

#include <algorithm>
#include <cctype>

namespace cellgate::kernels {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The first line of a cell, shortened, to name it in an error.
std::string cell_title(const std::string& code) {
  std::string first = code.substr(0, code.find('\n'));
  constexpr std::size_t kMax = 60;
  return first.size() > kMax ? first.substr(0, kMax) + "…" : first;
}

}  // namespace

bool seeds(const SeedOptions& seed, const kernel::KernelSpec& spec) {
  return !seed.cells.empty() &&
         (seed.language.empty() || lower(seed.language) == lower(spec.language));
}

Result<void> seed_kernel(const SeedOptions& seed, kernel::KernelConnection& connection,
                         const std::string& kernel_id, std::chrono::milliseconds timeout) {
  for (std::size_t i = 0; i < seed.cells.size(); ++i) {
    const std::string& code = seed.cells[i];
    auto failed = [&](const std::string& why) {
      return make_error(ErrorCode::kFailedPrecondition, "seed_failed",
                        "seeding kernel " + kernel_id + " from " + seed.source + ": cell " +
                            std::to_string(i + 1) + " (" + cell_title(code) + ") " + why);
    };
    auto ran =
        connection.request(kernel::Channel::kShell, "execute_request",
                           kernel::execute_content(code, false, /*store_history=*/false), timeout);
    if (!ran) {
      return failed("did not finish: " + ran.error().message);
    }
    if (!ran->reply) {
      return failed("got no reply (the kernel died?)");
    }
    const auto& content = ran->reply->content;
    if (content.value("status", "") != "ok") {
      return failed("failed: " + content.value("ename", std::string("error")) + ": " +
                    content.value("evalue", std::string()).substr(0, 500));
    }
  }
  return {};
}

}  // namespace cellgate::kernels
