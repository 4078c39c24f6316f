// cellgate-reaper: pid 1 of a zygote kernel's jail, exec'd by the zygote's child once the kernel
// is forked (a copy of the zygote as pid 1 would hold megabytes per kernel). Static, no heap:
//
//   cellgate-reaper KERNEL_PID      fd 3: report pipe (write "X<wait status>\n" when the kernel
//                                   ends)  fd 4: go pipe (EOF: the launcher is gone, so are we)
//
// It forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the kernel, reaps every
// orphan, and exits when the kernel has ended, which ends everything left in the namespace. The
// signals arrive blocked (set by the zygote), so none sent before this exec is lost.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

constexpr int kReportFd = 3;
constexpr int kGoFd = 4;

void report_exit(int wstatus) {
  char line[32];
  int n = std::snprintf(line, sizeof line, "X%d\n", wstatus);
  if (n > 0) {
    (void)::write(kReportFd, line, static_cast<std::size_t>(n));
  }
}

// Reaps everything ready; true once the kernel was among them.
bool reap(pid_t kernel) {
  for (;;) {
    int wstatus = 0;
    pid_t done = ::waitpid(-1, &wstatus, WNOHANG);
    if (done <= 0) {
      return false;
    }
    if (done == kernel) {
      report_exit(wstatus);
      return true;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    return 127;
  }
  const pid_t kernel = static_cast<pid_t>(std::atoi(argv[1]));
  if (kernel <= 1) {
    return 127;
  }
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  const int sfd = ::signalfd(-1, &mask, SFD_CLOEXEC);
  if (sfd < 0) {
    ::kill(kernel, SIGKILL);
    return 127;
  }
  if (reap(kernel)) {
    return 0;
  }
  for (;;) {
    pollfd fds[2] = {{sfd, POLLIN, 0}, {kGoFd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      continue;
    }
    if (fds[1].revents != 0) {
      char c;
      if (::read(kGoFd, &c, 1) <= 0) {
        return 137;  // the launcher is gone: leaving as pid 1 kills the kernel with us
      }
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      if (::read(sfd, &info, sizeof info) == sizeof info && info.ssi_signo != SIGCHLD) {
        ::kill(kernel, static_cast<int>(info.ssi_signo));
      }
      if (reap(kernel)) {
        return 0;
      }
    }
  }
}
