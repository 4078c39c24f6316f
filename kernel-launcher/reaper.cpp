// cellgate-reaper: pid 1 of a zygote kernel's jail, exec'd by the zygote's child once the kernel
// is forked (a copy of the zygote as pid 1 would hold megabytes per kernel). Static, no heap:
//
//   cellgate-reaper KERNEL_PID      fd 3: report pipe (write "X<wait status>\n" when the kernel
//                                   ends)  fd 4: go pipe (EOF: the launcher is gone, so are we)
//
// The loop is exec mode's init's own, init::reap_kernel (src/init.hpp): it forwards SIGINT,
// SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the kernel, reaps every orphan, and exits
// when the kernel has ended, which ends everything left in the namespace. The signals arrive
// blocked (set by the zygote), so none sent before this exec is lost.
#include <signal.h>

#include <cstdlib>

#include "src/init.hpp"

namespace {

constexpr int kReportFd = 3;
constexpr int kGoFd = 4;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    return 127;
  }
  const pid_t kernel = static_cast<pid_t>(std::atoi(argv[1]));
  if (kernel <= 1) {
    return 127;
  }
  const sigset_t mask = cellgate::launcher::init::reaper_signals();
  ::pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  return cellgate::launcher::init::reap_kernel(kernel, kReportFd, kGoFd);
}
