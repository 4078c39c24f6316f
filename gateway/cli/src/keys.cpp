#include "cellgate/cli/keys.hpp"

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cellgate/tenants/keys.hpp"

namespace cellgate::cli {
namespace {

// serve's default (server.cpp): $CELLGATE_STATE_DIR, else ~/.local/state/cellgate.
std::string state_dir_of(const KeysOptions& o) {
  if (!o.state_dir.empty()) {
    return o.state_dir;
  }
  if (const char* d = std::getenv("CELLGATE_STATE_DIR"); d != nullptr && *d != '\0') {
    return d;
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : "/root") + "/.local/state/cellgate";
}

}  // namespace

CLI::App* add_keys_command(CLI::App& app, KeysOptions& o) {
  auto* cmd = app.add_subcommand(
      "keys", "API keys of tenants (E2B's e2b_… form): create TENANT | list | revoke ID|KEY");
  cmd->add_option("action", o.action, "create, list or revoke")
      ->required()
      ->check(CLI::IsMember({"create", "list", "revoke"}));
  cmd->add_option("what", o.what,
                  "create: the tenant (A-Z a-z 0-9 . _ -); revoke: a key id, a whole key, or "
                  "tenant:NAME for all of a tenant's keys");
  cmd->add_option("--state-dir", o.state_dir,
                  "the gateway's state dir (default $CELLGATE_STATE_DIR or "
                  "~/.local/state/cellgate, as serve)")
      ->envname("CELLGATE_STATE_DIR");
  cmd->add_flag("--json", o.json, "list: as one JSON array");
  return cmd;
}

int run_keys(const KeysOptions& o) {
  const std::string path = tenants::keys_path(state_dir_of(o));
  if (o.action == "create") {
    auto key = tenants::create_key(path, o.what);
    if (!key) {
      std::cerr << "cellgate keys: " << key.error().message << "\n";
      return 2;
    }
    std::cout << "cellgate keys: a new key of tenant " << o.what << " (shown once; " << path
              << " keeps only its hash):\n"
              << *key << std::endl;
    return 0;
  }
  if (o.action == "list") {
    auto keys = tenants::read_keys(path);
    if (!keys) {
      std::cerr << "cellgate keys: " << keys.error().message << "\n";
      return 2;
    }
    if (o.json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& k : *keys) {
        list.push_back({{"id", k.id}, {"tenant", k.tenant}, {"created", k.created}});
      }
      std::cout << list.dump(2) << std::endl;
      return 0;
    }
    for (const auto& k : *keys) {
      std::cout << k.id << "  " << k.tenant << "  " << k.created << "\n";
    }
    std::cout << std::flush;
    return 0;
  }
  auto gone = tenants::revoke_keys(path, o.what);
  if (!gone) {
    std::cerr << "cellgate keys: " << gone.error().message << "\n";
    return gone.error().code == ErrorCode::kNotFound ? 1 : 2;
  }
  std::cout << "cellgate keys: " << *gone << " key(s) revoked" << std::endl;
  return 0;
}

}  // namespace cellgate::cli
