// `cellgate exec`'s command line.
#include <CLI/CLI.hpp>

#include "cellgate/cli/exec.hpp"

namespace cellgate::cli {

CLI::App* add_exec_command(CLI::App& app, ExecOptions& exec) {
  auto* cmd = app.add_subcommand("exec", "run one cell in a fresh kernel and print its output");
  cmd->add_option("code", exec.code, "the code to run ('-' or nothing: read stdin)");
  cmd->add_option("-f,--file", exec.file, "read the code from this file");
  cmd->add_option("-k,--kernel", exec.kernel, "kernelspec name")->capture_default_str();
  cmd->add_option("-t,--timeout", exec.timeout_seconds,
                  "interrupt the cell after this many seconds (0: never)");
  cmd->add_flag("--no-jail", exec.no_jail, "run the kernel unjailed (not for untrusted code)");
  cmd->add_option("--jail-spec", exec.jail_spec, "jail spec JSON (limits, mounts, env)");
  cmd->add_flag("-v,--verbose", exec.verbose, "log what the host supports");
  cmd->add_option("--url", exec.url, "run on this running gateway (http[s]://host:port)")
      ->envname("CELLGATE_URL");
  cmd->add_option("--token", exec.token, "the gateway's token")->envname("CELLGATE_TOKEN");
  cmd->add_option("--kernel-id", exec.kernel_id,
                  "with --url: run in this kernel (state kept) instead of a fresh one");
  cmd->add_option("--fork", exec.fork,
                  "with --url: run in a new copy of this kernel (its state at that moment); "
                  "the copy's id goes to stderr and it stays up")
      ->excludes("--kernel-id");
  cmd->add_option("--from-snapshot", exec.snapshot,
                  "with --url: run in a new kernel started from this snapshot; it stays up")
      ->excludes("--kernel-id")
      ->excludes("--fork");
  cmd->add_option("--artifacts", exec.artifacts_dir,
                  "save displayed images and PDFs here (default: a new dir in $TMPDIR)");
  return cmd;
}

}  // namespace cellgate::cli
