#include "cellgate/cli/drain.hpp"

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cellgate/cli/exit_codes.hpp"
#include "cellgate/http/client.hpp"
#include "cellgate/http/limits.hpp"

namespace cellgate::cli {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kRequestTimeout{30000};
constexpr milliseconds kPollEvery{500};

}  // namespace

CLI::App* add_drain_command(CLI::App& app, DrainOptions& options) {
  auto* cmd = app.add_subcommand(
      "drain", "stop a running gateway (a cluster node) from starting kernels; its kernels run on");
  cmd->add_option("--url", options.url, "the gateway (http[s]://host:port), not the router")
      ->envname("CELLGATE_URL")
      ->required();
  cmd->add_option("--token", options.token, "the gateway's token")->envname("CELLGATE_TOKEN");
  cmd->add_flag("--undo", options.undo, "start kernels there again");
  cmd->add_option("--wait", options.wait,
                  "wait up to this many seconds for the node's kernels to end (exit 124 if "
                  "some remain)")
      ->check(CLI::NonNegativeNumber);
  return cmd;
}

int run_drain(const DrainOptions& options) {
  auto url = http::client::parse_url(options.url);
  if (!url) {
    std::cerr << "cellgate drain: " << url.error().message << "\n";
    return kExitUsage;
  }
  http::client::Client client(*url, options.token, "cellgate-drain");
  auto answer = client.request("POST", "/api/node/drain", json{{"drain", !options.undo}}.dump(),
                               kRequestTimeout);
  if (!answer) {
    std::cerr << "cellgate drain: " << options.url << ": " << answer.error().message << "\n";
    return kExitUsage;
  }
  if (answer->status != 200) {
    std::cerr << "cellgate drain: HTTP " << answer->status << ": " << answer->error_message()
              << "\n";
    return kExitUsage;
  }
  json state = http::parse_json(answer->body);
  if (!state.is_object()) {
    std::cerr << "cellgate drain: the gateway's answer is not JSON\n";
    return kExitUsage;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + milliseconds(static_cast<long long>(options.wait * 1000));
  while (!options.undo && options.wait > 0 && state.value("kernels", 0) > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(kPollEvery);
    auto node = client.request("GET", "/api/node", "", kRequestTimeout);
    if (node && node->status == 200) {
      json now = http::parse_json(node->body);
      if (now.is_object()) {
        state = std::move(now);
      }
    }
  }
  const int kernels = state.value("kernels", 0);
  std::cout << (state.value("draining", false) ? "draining" : "not draining") << ", " << kernels
            << (kernels == 1 ? " kernel" : " kernels") << " running\n";
  return !options.undo && options.wait > 0 && kernels > 0 ? kExitTimeout : kExitOk;
}

}  // namespace cellgate::cli
