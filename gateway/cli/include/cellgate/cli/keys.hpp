// `cellgate keys`: the API keys of tenants (tenants/keys.hpp), in the state dir a gateway serves
// from; a running gateway sees the change within a second, without a restart.
//
//   cellgate keys create alice --state-dir /var/lib/cellgate     # the new key, on the last line
//   cellgate keys list --state-dir /var/lib/cellgate              # id, tenant, created
//   cellgate keys revoke 3fa85f64a1b2 --state-dir …               # an id, a key, tenant:<name>
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace cellgate::cli {

struct KeysOptions {
  std::string action;     // create | list | revoke
  std::string what;       // create: the tenant; revoke: an id, a key or tenant:<name>
  std::string state_dir;  // "": $CELLGATE_STATE_DIR or ~/.local/state/cellgate (as serve)
  bool json = false;      // list: one JSON array
};

CLI::App* add_keys_command(CLI::App& app, KeysOptions& options);
// Exit codes: 0 done, 1 nothing matched (revoke), 2 bad options or an unreadable keys file.
int run_keys(const KeysOptions& options);

}  // namespace cellgate::cli
