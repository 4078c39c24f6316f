// cellgate: the Jupyter kernel gateway. The composition root: parses the command line and hands
// each subcommand its options.
#include <CLI/CLI.hpp>

#include "cellgate/cli/exec.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cellgate: jailed Jupyter kernels for JupyterLab, agents and notebook runs"};
  app.require_subcommand(1);

  cellgate::cli::ExecOptions exec;
  auto* exec_cmd = app.add_subcommand("exec", "run one cell in a fresh kernel and print its output");
  exec_cmd->add_option("code", exec.code, "the code to run ('-' or nothing: read stdin)");
  exec_cmd->add_option("-f,--file", exec.file, "read the code from this file");
  exec_cmd->add_option("-k,--kernel", exec.kernel, "kernelspec name")->capture_default_str();
  exec_cmd->add_option("-t,--timeout", exec.timeout_seconds,
                       "interrupt the cell after this many seconds (0: never)");
  exec_cmd->add_flag("--no-jail", exec.no_jail, "run the kernel unjailed (not for untrusted code)");
  exec_cmd->add_option("--jail-spec", exec.jail_spec, "jail spec JSON (limits, mounts, env)");
  exec_cmd->add_flag("-v,--verbose", exec.verbose, "log what the host supports");

  CLI11_PARSE(app, argc, argv);
  if (exec_cmd->parsed()) {
    return cellgate::cli::run_exec(exec);
  }
  return 2;
}
