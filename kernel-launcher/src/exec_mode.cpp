// Jailed exec mode: the launcher clones the jail's pid 1 itself and supervises it.
//
//   launcher (host, root) ── HostJail: cgroup, work dir, connection dir, staging root
//     └─ init (pid 1 of new mount/pid/net/ipc/uts namespaces), jail::contain_init(): its own
//        cgroup namespace, the root filesystem, the hostname; then init::start_kernel()
//          └─ kernel, jail::contain_kernel(): session, work dir, rlimits, credentials,
//             no_new_privs, fds, seccomp → execve
//        and becomes the reaper (init::reap_kernel, in the static cellgate-reaper bound at
//        kJailInitProgram, else in place): forwards signals, reports the kernel's wait status,
//        exits.
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cellgate/jail/jail.hpp"
#include "cellgate/sys/error_text.hpp"
#include "cellgate/unique_fd.hpp"
#include "host_jail.hpp"
#include "init.hpp"
#include "spool_service.hpp"

namespace cellgate::launcher {
namespace {

// The kernel process, forked by init: the last steps, then execve.
[[noreturn]] void exec_kernel(const HostJail& j, int err_fd) {
  for (int sig : init::kForwardedSignals) {
    (void)::signal(sig, SIG_DFL);
  }
  (void)::signal(SIGCHLD, SIG_DFL);
  ::pthread_sigmask(SIG_SETMASK, &j.original_mask(), nullptr);
  std::vector<char*> cargv;
  for (const auto& a : j.argv()) {
    cargv.push_back(const_cast<char*>(a.c_str()));
  }
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (const auto& e : j.env()) {
    cenv.push_back(const_cast<char*>(e.c_str()));
  }
  cenv.push_back(nullptr);
  const std::string program = resolve_program(j.argv()[0], j.spec());

  auto steps = jail::contain_kernel(j.spec(), j.uid(), j.gid(),
                                    [&] { return jail::close_inherited_fds(err_fd); });
  if (!steps) {
    init::fail(err_fd, steps.error().message);
  }
  ::execve(program.c_str(), cargv.data(), cenv.data());
  init::fail(err_fd,
             errno_error(ErrorCode::kInternal, "", "execve('" + program + "')", errno).message);
}

// pid 1 of the jail: builds the root, starts the kernel, then reaps (init.hpp).
[[noreturn]] void exec_init(const HostJail& j, int go_fd, int report_fd) {
  // If the launcher dies, so does the jail (the kernel with it: it is our pid namespace).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Root in here holds the launcher's environment in memory; keep /proc/1 closed to the kernel.
  ::prctl(PR_SET_DUMPABLE, 0);
  char go = 0;
  while (::read(go_fd, &go, 1) < 0 && errno == EINTR) {
  }
  if (go != 'G') {
    ::_exit(127);  // the launcher gave up (cgroup attach failed) and reported why
  }
  ::close(go_fd);
  auto root = jail::contain_init(j.spec(), j.paths(), j.uid(), j.gid());
  if (!root) {
    init::fail(report_fd, root.error().message);
  }
  const pid_t kernel = init::start_kernel(report_fd, [&](int setup_fd) {
    ::close(report_fd);
    exec_kernel(j, setup_fd);
  });
  if (!j.paths().init_program.empty()) {
    // The static reaper, bound in the jail (jail.hpp, kJailInitProgram): what pid 1 then runs
    // is inside the jail, so CRIU can checkpoint it, and it holds none of the launcher's memory.
    // Its report pipe on fd 3; the forwarded signals stay blocked across the exec, the
    // parent-death signal stays set. No go pipe: "-".
    // dup2 onto itself would keep close-on-exec: clear it instead.
    if (report_fd == 3 ? ::fcntl(3, F_SETFD, 0) == 0 : ::dup2(report_fd, 3) == 3) {
      ::syscall(SYS_close_range, 4u, ~0u, 0u);
      const std::string kernel_pid = std::to_string(kernel);
      char arg0[] = "cellgate-reaper";
      char no_go[] = "-";
      char* argv[] = {arg0, const_cast<char*>(kernel_pid.c_str()), no_go, nullptr};
      char* envp[] = {nullptr};
      ::execve(jail::kJailInitProgram, argv, envp);
    }
    const std::string message =
        "execve('" + std::string(jail::kJailInitProgram) + "'): " + sys::error_text(errno);
    ::kill(kernel, SIGKILL);
    init::fail(report_fd, message);
  }
  // No go pipe to watch: the parent-death signal above ends us with the launcher.
  ::_exit(init::reap_kernel(kernel, report_fd, -1));
}

// Without a signalfd (out of descriptors): no spool, signals taken by sigwaitinfo.
int supervise_by_sigwait(HostJail& j, pid_t init, init::InitReport& report) {
  const std::optional<long long> deadline = time_limit_deadline(j.spec());
  bool timed_out = false;
  int init_status = 0;
  for (;;) {
    siginfo_t info{};
    int sig;
    if (deadline && !timed_out) {
      const long long left = ns_until(*deadline);
      if (left <= 0) {
        timed_out = true;
        ::kill(init, SIGKILL);
        continue;
      }
      timespec wait{static_cast<time_t>(left / 1000000000LL),
                    static_cast<long>(left % 1000000000LL)};
      sig = ::sigtimedwait(&j.wait_set(), &info, &wait);
    } else {
      sig = ::sigwaitinfo(&j.wait_set(), &info);
    }
    if (sig < 0) {
      continue;  // EINTR or EAGAIN (the deadline; checked above)
    }
    if (sig != SIGCHLD) {
      ::kill(init, sig);
      continue;
    }
    if (::waitpid(init, &init_status, WNOHANG) == init) {
      break;
    }
  }
  return j.finish(init, report.kernel_status().value_or(init_status), timed_out);
}

}  // namespace

int supervise_init(HostJail& j, pid_t init, init::InitReport& report) {
  // Supervise: forward signals to init (which forwards them to the kernel), enforce the time
  // limit, spool the kernel's iopub and answer for it, and wait for init to end. The signals
  // are blocked since HostJail::build(); a signalfd reads them.
  UniqueFd sfd(::signalfd(-1, &j.wait_set(), SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sfd) {
    std::cerr << "cellgate-kernel: warning: signalfd(): " << sys::error_text(errno)
              << "; no iopub spool\n";
    return supervise_by_sigwait(j, init, report);
  }
  auto spool = j.start_spool();
  const std::optional<long long> deadline = time_limit_deadline(j.spec());
  bool timed_out = false;
  int init_status = 0;
  std::vector<pollfd> fds;
  for (;;) {
    int timeout_ms = -1;
    if (deadline && !timed_out) {
      const long long left = ns_until(*deadline);
      if (left <= 0) {
        timed_out = true;
        ::kill(init, SIGKILL);
        continue;
      }
      timeout_ms = static_cast<int>(std::min<long long>(left / 1000000 + 1, 60000));
    }
    fds.assign({{sfd.get(), POLLIN, 0}});
    if (spool) {
      spool->add_pollfds(fds);
      timeout_ms = spool->poll_timeout_ms(timeout_ms);
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      continue;  // EINTR
    }
    if (spool) {
      spool->on_poll(fds);
    }
    signalfd_siginfo info{};
    while (::read(sfd.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      if (info.ssi_signo != SIGCHLD) {
        ::kill(init, static_cast<int>(info.ssi_signo));
      }
    }
    if (::waitpid(init, &init_status, WNOHANG) == init) {
      break;
    }
  }
  return j.finish(init, report.kernel_status().value_or(init_status), timed_out);
}

int run_exec_kernel(HostJail& j) {
  int go[2], rep[2];
  if (::pipe2(go, O_CLOEXEC) != 0 || ::pipe2(rep, O_CLOEXEC) != 0) {
    return j.fail(errno_error(ErrorCode::kInternal, "", "pipe2()", errno).message);
  }
  UniqueFd go_read(go[0]), go_write(go[1]), rep_read(rep[0]), rep_write(rep[1]);

  auto child = jail::clone_jailed();
  if (!child) {
    return j.fail(child.error().message);
  }
  if (*child == 0) {
    go_write.reset();
    rep_read.reset();
    j.status().close_in_child();  // the gateway's pipe and a host file: none goes into the jail
    exec_init(j, go_read.get(), rep_write.get());
  }
  const pid_t init = *child;
  go_read.reset();
  rep_write.reset();

  if (auto added = j.add_to_cgroup(init); !added) {
    ::kill(init, SIGKILL);
    ::waitpid(init, nullptr, 0);
    return j.fail(added.error().message);
  }
  write_all(go_write.get(), "G");
  go_write.reset();

  init::InitReport report(std::move(rep_read));
  if (auto ready = report.wait_ready("the jail's init ended before the kernel started"); !ready) {
    int wstatus = 0;
    ::waitpid(init, &wstatus, 0);
    return j.fail(ready.error().message);
  }
  j.report_started(init);
  return supervise_init(j, init, report);
}

}  // namespace cellgate::launcher
