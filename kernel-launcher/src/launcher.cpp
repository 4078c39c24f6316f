#include "cellgate/launcher/launcher.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

#include "cellgate/launcher/status.hpp"
#include "cellgate/result.hpp"
#include "cellgate/sys/pipe.hpp"
#include "cellgate/unique_fd.hpp"
#include "report.hpp"

extern char** environ;

namespace cellgate::launcher {
namespace {

constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Tells the parent which step failed and why, then ends the child.
[[noreturn]] void child_fail(int err_fd, int stage) {
  int payload[2] = {stage, errno};
  [[maybe_unused]] ssize_t n = ::write(err_fd, payload, sizeof payload);
  ::_exit(127);
}

// Runs in the child between fork and exec: only async-signal-safe calls. On failure writes
// {stage, errno} to `err_fd` and exits 127.
[[noreturn]] void exec_child(const LaunchOptions& options, char* const* argv,
                             const sigset_t& original_mask, int err_fd) {
  auto fail = [err_fd](int stage) { child_fail(err_fd, stage); };
  if (options.die_with_parent && ::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    fail(0);
  }
  ::setpgid(0, 0);
  for (int sig : kForwardedSignals) {
    (void)::signal(sig, SIG_DFL);
  }
  (void)::signal(SIGCHLD, SIG_DFL);
  ::pthread_sigmask(SIG_SETMASK, &original_mask, nullptr);
  if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) {
    fail(1);
  }
  // Close every inherited descriptor above stderr except the error pipe (close-on-exec).
  if (err_fd > 3) {
    ::syscall(SYS_close_range, 3u, static_cast<unsigned>(err_fd - 1), 0u);
  }
  ::syscall(SYS_close_range, static_cast<unsigned>(err_fd + 1), ~0u, 0u);
  ::execvp(argv[0], argv);
  child_fail(err_fd, 2);
}

}  // namespace

int run_exec_mode(const LaunchOptions& options) {
  const int status_fd = options.status_fd;
  if (status_fd >= 0) {
    ::fcntl(status_fd, F_SETFD, FD_CLOEXEC);
  }
  StatusSink status(status_fd);
  StatusEvent failed;
  failed.kind = StatusEvent::Kind::kExited;
  failed.reason = ExitReason::kSetupError;
  if (!status.open_copy(options.status_file)) {
    failed.message =
        errno_error(ErrorCode::kInternal, "", "open('" + options.status_file + "')", errno).message;
    status.report(failed);
    return 127;
  }
  if (options.argv.empty()) {
    failed.message = "no kernel command given";
    status.report(failed);
    return 127;
  }
  if (options.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  }

  // Block the signals we forward and SIGCHLD; sigwaitinfo picks them up one at a time.
  sigset_t wait_set, original_mask;
  sigemptyset(&wait_set);
  for (int sig : kForwardedSignals) {
    sigaddset(&wait_set, sig);
  }
  sigaddset(&wait_set, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &wait_set, &original_mask);

  auto err_pipe = sys::make_pipe();
  if (!err_pipe) {
    failed.message = err_pipe.error().message;
    status.report(failed);
    return 127;
  }
  UniqueFd err_read = std::move(err_pipe->read);
  UniqueFd err_write = std::move(err_pipe->write);

  std::vector<char*> argv;
  for (const auto& a : options.argv) {
    argv.push_back(const_cast<char*>(a.c_str()));
  }
  argv.push_back(nullptr);

  pid_t child = ::fork();
  if (child < 0) {
    failed.message = errno_error(ErrorCode::kInternal, "", "fork()", errno).message;
    status.report(failed);
    return 127;
  }
  if (child == 0) {
    exec_child(options, argv.data(), original_mask, err_write.get());
  }
  err_write.reset();

  // The pipe closes on a successful exec; otherwise it carries {stage, errno}.
  int payload[2] = {0, 0};
  ssize_t got;
  do {
    got = ::read(err_read.get(), payload, sizeof payload);
  } while (got < 0 && errno == EINTR);
  if (got == static_cast<ssize_t>(sizeof payload)) {
    int wstatus = 0;
    ::waitpid(child, &wstatus, 0);
    static constexpr const char* kStages[] = {"prctl(PR_SET_PDEATHSIG)", "chdir", "execvp"};
    std::string call = kStages[payload[0] >= 0 && payload[0] < 3 ? payload[0] : 2];
    call += payload[0] == 1 ? "('" + options.cwd + "')" : "('" + options.argv[0] + "')";
    failed.message = errno_error(ErrorCode::kInternal, "", call, payload[1]).message;
    status.report(failed);
    return 127;
  }

  StatusEvent started;
  started.kind = StatusEvent::Kind::kStarted;
  started.pid = child;
  status.report(started);

  for (;;) {
    siginfo_t info{};
    int sig = ::sigwaitinfo(&wait_set, &info);
    if (sig < 0) {
      continue;  // EINTR
    }
    if (sig != SIGCHLD) {
      ::kill(child, sig);
      continue;
    }
    int wstatus = 0;
    pid_t done = ::waitpid(child, &wstatus, WNOHANG);
    if (done != child) {
      continue;
    }
    StatusEvent exited;
    exited.kind = StatusEvent::Kind::kExited;
    exited.pid = child;
    if (WIFSIGNALED(wstatus)) {
      exited.reason = ExitReason::kSignaled;
      exited.signal = WTERMSIG(wstatus);
      status.report(exited);
      return 128 + exited.signal;
    }
    exited.reason = ExitReason::kOk;
    exited.exit_code = WEXITSTATUS(wstatus);
    status.report(exited);
    return exited.exit_code;
  }
}

}  // namespace cellgate::launcher
