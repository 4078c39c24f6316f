// `cellgate serve`'s command line: every option, where its value may come from, and
// `--print-config`, which says where each one came from.
//
//   ServeCommandLine serve;
//   CLI::App* cmd = add_serve_command(app, serve);
//   ServeEnvironment env = prepare_serve_parse(*cmd, argc, argv);   // before parse
//   app.parse(… env.args …);
//   if (cmd->parsed()) return run_serve_command(serve, *cmd, argc, argv, env);
//
// Where a value comes from, the first that has it:
//   1. the command line (--port 9000);
//   2. the environment: CELLGATE_<NAME> for every option (--max-kernels: CELLGATE_MAX_KERNELS;
//      flags take 1/0, true/false), or Kernel Gateway's KG_* name of the same option (KG_PORT,
//      KG_AUTH_TOKEN, …; docs/kernel-gateway.md), with a one-line notice per alias used;
//   3. config files (TOML, keys are the long option names: `port = 9000`): --config FILE (repeat;
//      a later file wins), else $XDG_CONFIG_HOME/cellgate/cellgate.toml (~/.config/…) over
//      /etc/cellgate/cellgate.toml, those that exist; an unknown key is an error;
//   4. the default.
// The environment over files, as a service manager's Environment= / EnvironmentFile= expects
// (scripts/systemd/cellgate.service). Sizes take units: --memory 2G (2 GiB), 512M, 64k.
//
// Thread-safety: process setup, called once from main before any thread starts (the KG_*
// aliases are copied into the process environment with setenv).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cellgate/server/config.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace cellgate::cli {

struct ServeCommandLine {
  server::ServeOptions options;
  bool no_zygote = false;
  bool no_chart_data = false;
  bool print_config = false;
};

// Adds the `serve` subcommand, bound to `serve`.
CLI::App* add_serve_command(CLI::App& app, ServeCommandLine& serve);

// What prepare_serve_parse did to the environment, for the log and --print-config.
struct ServeEnvironment {
  std::vector<std::string> notices;            // one line per KG_* alias used or ignored
  std::map<std::string, std::string> aliases;  // CELLGATE_<NAME> → the KG_* name it came from
  // What to parse: argv, with `--config FILE` for each default file that exists when `serve` has
  // no --config of its own.
  std::vector<std::string> args;
};

// Before parsing: copies each KG_* variable set into its CELLGATE_* name (unless that is set too:
// then the KG_* one is ignored, with a notice) and finds the default config files.
ServeEnvironment prepare_serve_parse(const CLI::App& serve_command, int argc,
                                     const char* const* argv);

// After a successful parse: applies the config files (exit 2 with the reason when one is missing,
// has an unknown key or a bad value), then --print-config prints the effective configuration (a
// TOML file the gateway would read back, each value commented with where it came from; the token
// hidden) and returns 0; otherwise logs the notices and runs the gateway (server::run_serve),
// returning its exit code.
int run_serve_command(ServeCommandLine& serve, CLI::App& serve_command, int argc,
                      const char* const* argv, const ServeEnvironment& environment);

}  // namespace cellgate::cli
