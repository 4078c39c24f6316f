// cellgate-reaper: pid 1 of a zygote kernel's jail, exec'd by the zygote's child once the kernel
// is forked (a copy of the zygote as pid 1 would hold megabytes per kernel). Static, no heap:
//
//   cellgate-reaper KERNEL_PID      fd 3: report pipe (write "X<wait status>\n" when the kernel
//                                   ends)  fd 4: go pipe (EOF: the launcher is gone, so are we)
//   cellgate-reaper KERNEL_PID -    exec mode's pid 1 (exec_mode.cpp): no go pipe; its
//                                   parent-death signal ends it with the launcher
//
// The loop is exec mode's init's own, init::reap_kernel (src/init.hpp): it forwards SIGINT,
// SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the kernel, reaps every orphan, and exits
// when the kernel has ended, which ends everything left in the namespace. The signals arrive
// blocked (set by the zygote), so none sent before this exec is lost.
#include <signal.h>
#include <sys/prctl.h>

#include <cstdlib>

#include "src/init.hpp"

namespace {

constexpr int kReportFd = 3;
constexpr int kGoFd = 4;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 3 && argv[2][0] == '-' && argv[2][1] == '\0')) {
    return 127;
  }
  // Root's pid 1 stays unreadable to the kernel, as exec mode's init was before its exec.
  ::prctl(PR_SET_DUMPABLE, 0);
  const pid_t kernel = static_cast<pid_t>(std::atoi(argv[1]));
  if (kernel <= 1) {
    return 127;
  }
  const sigset_t mask = cellgate::launcher::init::reaper_signals();
  ::pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  return cellgate::launcher::init::reap_kernel(kernel, kReportFd, argc == 3 ? -1 : kGoFd);
}
