// cellgate-kernel: starts one kernel and reports on a status fd. See launcher.hpp.
#include <CLI/CLI.hpp>

#include "cellgate/launcher/launcher.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cellgate-kernel: start one Jupyter kernel and report how it ends"};
  cellgate::launcher::LaunchOptions options;
  app.add_option("--status-fd", options.status_fd,
                 "write JSON status lines (started, exited) to this fd");
  app.add_option("--cwd", options.cwd, "the kernel's working directory");
  app.add_flag("--die-with-parent", options.die_with_parent,
               "kill the kernel when the launcher's parent dies");
  app.add_option("argv", options.argv, "the kernel's command line, after --")->required();
  CLI11_PARSE(app, argc, argv);
  return cellgate::launcher::run_exec_mode(options);
}
