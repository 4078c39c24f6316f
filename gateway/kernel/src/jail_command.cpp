// JailCommand (jail_command.hpp): spawns `cellgate-kernel --exec-into` and talks to it.
#include "cellgate/kernel/jail_command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <nlohmann/json.hpp>

#include "cellgate/sys/seqpacket.hpp"
#include "spawn.hpp"

namespace cellgate::kernel {
namespace {

constexpr int kCommandControlFd = 3;
constexpr sys::ChannelLimits kControlLimits{.max_bytes = 64 << 10, .max_fds = 1};

Result<std::pair<UniqueFd, UniqueFd>> command_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return errno_error(ErrorCode::kResourceExhausted, "exec", "pipe2()", errno);
  }
  return std::make_pair(UniqueFd(fds[0]), UniqueFd(fds[1]));
}

void reap_launcher(pid_t pid) {
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

Result<std::unique_ptr<JailCommand>> JailCommand::start(const JailTarget& target,
                                                        const CommandRequest& request) {
  if (request.argv.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "exec", "no command given");
  }
  std::unique_ptr<JailCommand> c(new JailCommand());
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return errno_error(ErrorCode::kResourceExhausted, "exec", "socketpair()", errno);
  }
  c->control_.reset(pair[0]);
  // Above the control fd: dup2 onto 3 must not be a no-op (which would keep FD_CLOEXEC).
  UniqueFd theirs(::fcntl(pair[1], F_DUPFD_CLOEXEC, 10));
  ::close(pair[1]);
  if (!theirs) {
    return errno_error(ErrorCode::kResourceExhausted, "exec", "fcntl(F_DUPFD_CLOEXEC)", errno);
  }

  std::vector<std::string> args = {
      target.launcher_path, "--exec-into",  std::to_string(target.init_pid),  "--spec",
      target.spec_file,     "--control-fd", std::to_string(kCommandControlFd)};
  for (const auto& dir : target.cgroup_dirs) {
    args.insert(args.end(), {"--cgroup", dir});
  }
  if (!request.cwd.empty()) {
    args.insert(args.end(), {"--cwd", request.cwd});
  }
  for (const auto& e : request.env) {
    args.insert(args.end(), {"--env", e});
  }
  if (request.pty) {
    args.insert(args.end(), {"--pty", std::to_string(request.pty->cols) + "x" +
                                          std::to_string(request.pty->rows)});
  }
  args.emplace_back("--");
  args.insert(args.end(), request.argv.begin(), request.argv.end());

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  UniqueFd in_read, out_write, err_write;
  if (request.pty) {
    for (int fd = 0; fd <= 2; ++fd) {
      posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", O_RDWR, 0);
    }
  } else {
    CELLGATE_ASSIGN_OR_RETURN(auto in, command_pipe());
    CELLGATE_ASSIGN_OR_RETURN(auto out, command_pipe());
    CELLGATE_ASSIGN_OR_RETURN(auto err, command_pipe());
    in_read = std::move(in.first);
    c->stdin_ = std::move(in.second);
    c->stdout_ = std::move(out.first);
    out_write = std::move(out.second);
    c->stderr_ = std::move(err.first);
    err_write = std::move(err.second);
    posix_spawn_file_actions_adddup2(&actions, in_read.get(), STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err_write.get(), STDERR_FILENO);
  }
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), kCommandControlFd);
  posix_spawn_file_actions_addclosefrom_np(&actions, kCommandControlFd + 1);
  const int rc = detail::spawn_clean(&c->launcher_, actions, args, target.launcher_env);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    c->launcher_ = -1;
    return errno_error(ErrorCode::kFailedPrecondition, "launcher_missing",
                       "posix_spawn('" + args[0] + "')", rc);
  }
  theirs.reset();
  in_read.reset();
  out_write.reset();
  err_write.reset();

  // The first report: started (with the pty's master) or why not.
  pollfd p{c->control_.get(), POLLIN, 0};
  const int ready = ::poll(&p, 1, static_cast<int>(request.start_timeout.count()));
  if (ready <= 0) {
    return make_error(ErrorCode::kDeadlineExceeded, "exec_timeout",
                      "the command did not start within " +
                          std::to_string(request.start_timeout.count()) + " ms");
  }
  CELLGATE_ASSIGN_OR_RETURN(auto first, sys::receive_packet(c->control_.get(), kControlLimits));
  if (!first) {
    return make_error(ErrorCode::kInternal, "exec_failed",
                      "the launcher ended without reporting (see the gateway's log)");
  }
  CELLGATE_ASSIGN_OR_RETURN(auto ev, launcher::StatusEvent::parse_line(first->data));
  if (ev.kind != launcher::StatusEvent::Kind::kStarted) {
    return make_error(ev.message.find("execve(") != std::string::npos ? ErrorCode::kNotFound
                                                                      : ErrorCode::kInternal,
                      "exec_failed", ev.message.empty() ? "the command did not start" : ev.message);
  }
  c->pid_ = ev.pid;
  if (request.pty) {
    if (first->fds.size() != 1) {
      return make_error(ErrorCode::kInternal, "exec_failed", "no terminal came back");
    }
    c->pty_ = std::move(first->fds.front());
  }
  return c;
}

JailCommand::~JailCommand() {
  control_.reset();  // the launcher kills the command if it runs, and ends
  stdin_.reset();
  pty_.reset();
  if (launcher_ > 0) {
    reap_launcher(launcher_);
  }
}

void JailCommand::close_output(int fd) {
  if (fd == stdout_.get()) {
    stdout_.reset();
  } else if (fd == stderr_.get()) {
    stderr_.reset();
  } else if (fd == pty_.get()) {
    pty_.reset();
  }
}

Result<void> JailCommand::signal(int sig) {
  if (exited_ || !control_) {
    return make_error(ErrorCode::kNotFound, "process_ended", "the process has ended");
  }
  return sys::send_packet(control_.get(), nlohmann::json{{"signal", sig}}.dump(), {},
                          kControlLimits);
}

Result<void> JailCommand::resize(PtySize size) {
  if (!pty_) {
    return make_error(ErrorCode::kFailedPrecondition, "no_pty", "the process has no terminal");
  }
  winsize ws{};
  ws.ws_col = static_cast<unsigned short>(size.cols);
  ws.ws_row = static_cast<unsigned short>(size.rows);
  if (::ioctl(pty_.get(), TIOCSWINSZ, &ws) != 0) {
    return errno_error(ErrorCode::kInternal, "pty", "ioctl(TIOCSWINSZ)", errno);
  }
  return {};
}

std::optional<launcher::StatusEvent> JailCommand::read_control() {
  if (exited_ || !control_) {
    return exited_;
  }
  auto msg = sys::receive_packet(control_.get(), kControlLimits, /*nonblocking=*/true);
  if (!msg) {
    if (msg.error().reason == "would_block") {
      return std::nullopt;
    }
    msg = std::optional<sys::Message>();  // garbage from our own launcher: treat as its end
  }
  if (*msg) {
    auto ev = launcher::StatusEvent::parse_line((*msg)->data);
    if (!ev || ev->kind != launcher::StatusEvent::Kind::kExited) {
      return std::nullopt;
    }
    exited_ = std::move(ev).value();
  } else {
    launcher::StatusEvent ev;
    ev.kind = launcher::StatusEvent::Kind::kExited;
    ev.reason = launcher::ExitReason::kSignaled;
    ev.signal = SIGKILL;
    exited_ = ev;
  }
  control_.reset();
  if (launcher_ > 0) {
    reap_launcher(launcher_);
    launcher_ = -1;
  }
  return exited_;
}

}  // namespace cellgate::kernel
