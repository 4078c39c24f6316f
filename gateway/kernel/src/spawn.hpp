// Internal: posix_spawn of a launcher with a clean signal state — an empty signal mask and every
// signal at its default, whatever the gateway's threads block or ignore — shared by a kernel's
// launcher (process.cpp) and a command's (jail_command.cpp).
//
// Thread-safety: a pure function.
#pragma once

#include <spawn.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace cellgate::kernel::detail {

// posix_spawn(pid, argv[0], actions, <clean signal attributes>, argv, env): its return code (0,
// or the errno value). `actions` stays the caller's to destroy.
inline int spawn_clean(pid_t* pid, const posix_spawn_file_actions_t& actions,
                       std::vector<std::string> argv, std::vector<std::string> env) {
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all_default;
  sigemptyset(&none);
  sigfillset(&all_default);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all_default);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> cargv;
  for (auto& a : argv) {
    cargv.push_back(a.data());
  }
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (auto& e : env) {
    cenv.push_back(e.data());
  }
  cenv.push_back(nullptr);
  const int rc = ::posix_spawn(pid, argv[0].c_str(), &actions, &attr, cargv.data(), cenv.data());
  posix_spawnattr_destroy(&attr);
  return rc;
}

}  // namespace cellgate::kernel::detail
