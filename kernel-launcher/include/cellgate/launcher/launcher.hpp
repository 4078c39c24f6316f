// The kernel launcher's exec mode: start one kernel process, supervise it, and report on the
// status fd (see status.hpp) when it started and why it ended.
//
//   cellgate-kernel --status-fd 3 --cwd /run/k1/work -- /usr/bin/python3 -m ipykernel_launcher -f …
//
// The kernel gets the launcher's environment (the gateway spawns the launcher with exactly the
// kernel's environment), its own process group, and no inherited file descriptor above 2.
// SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher are forwarded to the kernel. The jail
// issue adds the jail steps between fork and exec.
//
// Thread-safety: the launcher is single-threaded; run_exec_mode() is called once from main().
#pragma once

#include <string>
#include <vector>

namespace cellgate::launcher {

struct LaunchOptions {
  std::vector<std::string> argv;  // the kernel's argv; argv[0] is a path or a name on PATH
  int status_fd = -1;             // -1: no status reports
  std::string cwd;                // "" : inherit
  bool die_with_parent = false;   // SIGKILL the kernel when the launcher's parent dies
};

// Runs the kernel to completion. Returns the launcher's exit code: the kernel's exit code,
// 128 + signal if it was killed, or 127 when it could not be started.
int run_exec_mode(const LaunchOptions& options);

}  // namespace cellgate::launcher
