// cellgate: the Jupyter kernel gateway. The composition root: parses the command line (flags,
// config files, CELLGATE_* and KG_* environment variables: cellgate/cli/serve.hpp) and hands
// each subcommand its options.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <vector>

#include "cellgate/cli/drain.hpp"
#include "cellgate/cli/exec.hpp"
#include "cellgate/cli/keys.hpp"
#include "cellgate/cli/mcp.hpp"
#include "cellgate/cli/serve.hpp"
#include "cellgate/notebooks/run.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cellgate: jailed Jupyter kernels for JupyterLab, agents and notebook runs"};
  app.set_version_flag("--version", "cellgate " CELLGATE_VERSION);
  app.require_subcommand(1);

  cellgate::cli::ExecOptions exec;
  auto* exec_cmd = cellgate::cli::add_exec_command(app, exec);
  cellgate::notebooks::NotebookRunOptions run;
  auto* run_cmd = cellgate::notebooks::add_run_command(app, run);
  cellgate::cli::DrainOptions drain;
  auto* drain_cmd = cellgate::cli::add_drain_command(app, drain);
  cellgate::cli::KeysOptions keys;
  auto* keys_cmd = cellgate::cli::add_keys_command(app, keys);
  cellgate::cli::McpOptions mcp;
  auto* mcp_cmd = cellgate::cli::add_mcp_command(app, mcp);

  cellgate::cli::ServeCommandLine serve;
  auto* serve_cmd = cellgate::cli::add_serve_command(app, serve);
  const cellgate::cli::ServeEnvironment serve_env =
      cellgate::cli::prepare_serve_parse(*serve_cmd, argc, argv);

  std::vector<const char*> args;
  for (const auto& arg : serve_env.args) {
    args.push_back(arg.c_str());
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    // Every subcommand documents exit code 2 for usage errors (--help still exits 0).
    return code != 0 ? 2 : code;
  }
  // exec and run write a cell's output and a notebook run's results to stdout: their log goes
  // to stderr, so a pipe gets only what was asked for.
  if (exec_cmd->parsed()) {
    spdlog::set_default_logger(spdlog::stderr_logger_mt("cellgate"));
    return cellgate::cli::run_exec(exec);
  }
  if (run_cmd->parsed()) {
    spdlog::set_default_logger(spdlog::stderr_logger_mt("cellgate"));
    return cellgate::notebooks::run_notebooks(run);
  }
  if (drain_cmd->parsed()) {
    return cellgate::cli::run_drain(drain);
  }
  if (keys_cmd->parsed()) {
    return cellgate::cli::run_keys(keys);
  }
  if (mcp_cmd->parsed()) {
    return cellgate::cli::run_mcp(mcp);
  }
  if (serve_cmd->parsed()) {
    return cellgate::cli::run_serve_command(serve, *serve_cmd, argc, argv, serve_env);
  }
  return 2;
}
