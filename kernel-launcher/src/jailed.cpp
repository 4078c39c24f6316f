// Jailed launches: the host side (HostJail, host_jail.hpp) built step by step, then the kernel
// from the zygote (zygote_client.cpp) or cold in exec mode (exec_mode.cpp). pid 1 of the jail
// is the same in both (init.hpp).
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <iostream>
#include <string>

#include "cellgate/jail/jail.hpp"
#include "cellgate/launcher/launcher.hpp"
#include "host_jail.hpp"
#include "report.hpp"

namespace cellgate::launcher {

int run_probe_host() {
  std::cout << jail::probe_host().describe() << "\n";
  return 0;
}

int run_jailed_mode(const LaunchOptions& options) {
  StatusSink status(options.status_fd);
  if (!open_status(options.status_fd, options.status_file, status)) {
    return 127;
  }
  auto fail = [&](const std::string& message) {
    status.report(setup_error(message));
    return 127;
  };
  if (options.argv.empty()) {
    return fail("no kernel command given");
  }
  if (options.die_with_parent) {
    // The jail follows: exec mode's init has its own death signal on us, a zygote jail's reaper
    // sees its go pipe close.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  }
  if (::geteuid() != 0) {
    return fail(
        "building the jail needs root (namespaces, cgroups, mounts): run this launcher "
        "as root, or through a gateway (cellgate serve, run, exec, mcp) started as this "
        "user, which enters a user namespace of its own first (rootless mode); or pass "
        "--no-jail to run the kernel unjailed, knowingly.");
  }
  auto jail = HostJail::build(options, status);
  if (!jail) {
    return fail(jail.error().message);
  }
  if (!options.zygote_socket.empty()) {
    if (auto code = run_zygote_kernel(**jail, options.zygote_socket)) {
      return *code;
    }
  }
  return run_exec_kernel(**jail);
}

}  // namespace cellgate::launcher
