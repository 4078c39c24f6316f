// cellgate-zygote: the zygote (fork server) on its own, with CPython linked in statically as in
// /usr/bin/python3 (a shared libpython costs every kernel's cells ~10 %). Started as
// `cellgate-kernel --zygote …`, which execs it with an empty environment. See zygote.hpp.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "cellgate/launcher/zygote.hpp"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"cellgate-zygote: the fork server python3 kernels are started from"};
  cellgate::launcher::ZygoteOptions options;
  app.add_option("--socket", options.socket_path, "the socket to serve on")->required();
  app.add_option("--status-fd", options.status_fd, "write JSON status lines (ready) to this fd");
  app.add_option("--preload", options.preload, "modules to import before the first fork")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  options.self_argv.assign(argv, argv + argc);
  return cellgate::launcher::run_zygote(options);
}

}  // namespace

int main(int argc, char** argv) {
  // As cellgate-kernel's main: an exception (std::bad_alloc) is a failed start, said on stderr.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "cellgate-zygote: " << e.what() << "\n";
    return 127;
  }
}
