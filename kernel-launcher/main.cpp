// cellgate-kernel: starts one Jupyter kernel inside the jail and reports on a status fd.
// See launcher.hpp and jail/README.md.
#include <CLI/CLI.hpp>

#include "cellgate/launcher/launcher.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cellgate-kernel: start one Jupyter kernel in a jail and report how it ends"};
  cellgate::launcher::LaunchOptions options;
  bool no_jail = false;
  bool probe_host = false;
  app.add_option("--spec", options.spec_path, "jail spec (JSON); default: the built-in limits");
  app.add_option("--status-fd", options.status_fd,
                 "write JSON status lines (started, exited) to this fd");
  app.add_option("--connection-file", options.connection_file,
                 "the kernel's connection file (rewritten to ipc endpoints in the jail)");
  app.add_option("--cwd", options.cwd, "working directory (unjailed kernels only)");
  app.add_flag("--die-with-parent", options.die_with_parent,
               "kill the kernel when the launcher's parent dies");
  app.add_flag("--no-jail", no_jail, "run the kernel unjailed (explicitly allowed only)");
  app.add_flag("--probe-host", probe_host, "print what this host supports and exit");
  app.add_option("argv", options.argv, "the kernel's command line, after --");
  CLI11_PARSE(app, argc, argv);
  if (probe_host) {
    return cellgate::launcher::run_probe_host();
  }
  if (no_jail) {
    return cellgate::launcher::run_exec_mode(options);
  }
  return cellgate::launcher::run_jailed_mode(options);
}
