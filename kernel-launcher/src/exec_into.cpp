// `cellgate-kernel --exec-into PID`: one command run inside a running kernel's jail (launcher.hpp,
// run_exec_into; the steps are jail/enter.hpp's and jail::contain_exec()).
//
//   gateway ─posix_spawn→ helper (host, root): its stdio are the command's; fd 3 the control
//     socket. enter_jail(): not dumpable → pidfd of the jail's pid 1, checked → its cgroup
//     joined → setns(pidfd, mnt|pid|net|ipc|uts|cgroup[|user|time])
//     └─ fork → the command (a process of the jail's pid namespace): contain_exec() → execve
//   The helper, outside the jail's pid namespace (the jail cannot see it), reports the command's
//   jail pid once it exec'd, passes signals from the control socket through the command's pidfd,
//   reports its end, and kills it when the control socket closes (the gateway went away).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/jail/enter.hpp"
#include "cellgate/jail/jail.hpp"
#include "cellgate/launcher/launcher.hpp"
#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/sys/process.hpp"
#include "cellgate/sys/seqpacket.hpp"
#include "host_jail.hpp"
#include "report.hpp"

namespace cellgate::launcher {
namespace {

constexpr std::size_t kMaxEnvEntries = 256;
constexpr std::size_t kMaxEnvBytes = 256 << 10;

// "COLSxROWS" → a size, each 1…1000.
Result<jail::TerminalSize> parse_size(const std::string& text) {
  unsigned cols = 0, rows = 0;
  char x = 0, extra = 0;
  if (std::sscanf(text.c_str(), "%u%c%u%c", &cols, &x, &rows, &extra) != 3 || x != 'x' ||
      cols == 0 || rows == 0 || cols > 1000 || rows > 1000) {
    return make_error(ErrorCode::kInvalidArgument, "bad_pty", "--pty wants COLSxROWS, got " + text);
  }
  return jail::TerminalSize{static_cast<unsigned short>(cols), static_cast<unsigned short>(rows)};
}

// The kernel's environment with the caller's entries on top (a name given twice: the last wins).
Result<std::vector<std::string>> command_environment(const jail::JailSpec& spec,
                                                     const std::vector<std::string>& extra) {
  if (extra.size() > kMaxEnvEntries) {
    return make_error(ErrorCode::kInvalidArgument, "bad_env", "too many environment entries");
  }
  std::map<std::string, std::string> env;
  for (const auto& entry : kernel_environment(spec)) {
    const auto eq = entry.find('=');
    env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  std::size_t bytes = 0;
  for (const auto& entry : extra) {
    const auto eq = entry.find('=');
    bytes += entry.size();
    if (eq == 0 || eq == std::string::npos || entry.find('\0') != std::string::npos ||
        bytes > kMaxEnvBytes) {
      return make_error(ErrorCode::kInvalidArgument, "bad_env",
                        "an environment entry must be NAME=VALUE (a name, no NUL; 256 KiB in all)");
    }
    env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) {
    out.push_back(k + "=" + v);
  }
  return out;
}

// The command, forked inside the jail's pid namespace: its steps, then execve. Never returns.
// `err_fd` carries "P<pid>" (its pid in the jail) first, then "E<message>" if a step fails;
// its close-on-exec EOF says the exec happened.
[[noreturn]] void run_command(const jail::JailSpec& spec, uid_t uid, gid_t gid,
                              const LaunchOptions& o, const std::vector<std::string>& env,
                              const std::optional<jail::TerminalSize>& size, int err_fd,
                              int pty_fd) {
  ::close(o.control_fd);  // the gateway's socket: never in the jail
  write_all(err_fd, "P" + std::to_string(::getpid()) + "\n");
  auto fail = [&](const std::string& message) {
    write_all(err_fd, "E" + message);
    ::_exit(127);
  };
  jail::ExecSteps steps;
  steps.cwd = o.cwd;
  steps.terminal = size ? &*size : nullptr;
  steps.hand_over_master = [&](int master) -> Result<void> {
    const int fds[] = {master};
    return sys::send_packet(pty_fd, "pty", fds, {});
  };
  steps.settle_fds = [&] { return jail::close_inherited_fds(err_fd); };
  if (auto done = jail::contain_exec(spec, uid, gid, steps); !done) {
    fail(done.error().message);
  }
  // Looked up in the jail's tree, as the kernel's uid (access() checks the real uid).
  const std::string program = resolve_program(o.argv[0], spec);
  std::vector<char*> argv;
  for (const auto& a : o.argv) {
    argv.push_back(const_cast<char*>(a.c_str()));
  }
  argv.push_back(nullptr);
  std::vector<char*> envp;
  envp.reserve(env.size() + 1);
  for (const auto& e : env) {
    envp.push_back(const_cast<char*>(e.c_str()));
  }
  envp.push_back(nullptr);
  ::execve(program.c_str(), argv.data(), envp.data());
  fail(errno_error(ErrorCode::kNotFound, "", "execve('" + program + "')", errno).message);
  ::_exit(127);  // fail() does not return; the compiler cannot see through the lambda
}

StatusEvent exited_event(int status) {
  StatusEvent ev;
  ev.kind = StatusEvent::Kind::kExited;
  if (WIFSIGNALED(status)) {
    ev.signal = WTERMSIG(status);
    ev.reason = ev.signal == SIGSYS ? ExitReason::kViolation : ExitReason::kSignaled;
  } else {
    ev.exit_code = WEXITSTATUS(status);
  }
  return ev;
}

}  // namespace

int run_exec_into(const LaunchOptions& o) {
  (void)::signal(SIGPIPE, SIG_IGN);
  const int control = o.control_fd;
  auto report = [&](const StatusEvent& ev, std::span<const int> fds = {}) {
    (void)sys::send_packet(control, ev.to_line(), fds, {});
  };
  auto fail = [&](const std::string& message) {
    report(setup_error(message));
    return 127;
  };
  if (control < 3) {
    (void)std::fprintf(stderr, "cellgate-kernel: --exec-into needs --control-fd (3 or above)\n");
    return 127;
  }
  // Nothing of ours but stdio and the control socket goes further (CVE-2024-21626).
  if (auto closed = jail::close_inherited_fds(control); !closed) {
    return fail(closed.error().message);
  }
  if (o.argv.empty()) {
    return fail("no command given");
  }
  if (::geteuid() != 0) {
    return fail("entering a jail needs root (setns, the kernel's cgroup)");
  }
  auto spec = load_spec(o.spec_path);
  if (!spec) {
    return fail(spec.error().message);
  }
  const auto identity = spec_identity(*spec);
  if (!identity) {
    return fail("the kernel's jail spec names no uid: cannot run a command as the kernel's user");
  }
  auto env = command_environment(*spec, o.exec_env);
  if (!env) {
    return fail(env.error().message);
  }
  std::optional<jail::TerminalSize> size;
  if (!o.pty.empty()) {
    auto parsed = parse_size(o.pty);
    if (!parsed) {
      return fail(parsed.error().message);
    }
    size = *parsed;
  }
  const bool no_cgroup =
      spec->optional.count("memory") && spec->optional.count("pids") && spec->optional.count("cpu");
  auto entry = jail::enter_jail(o.exec_into, o.cgroup_dirs, no_cgroup);
  if (!entry) {
    return fail(entry.error().message);
  }
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0) {
    return fail(errno_error(ErrorCode::kInternal, "", "pipe2()", errno).message);
  }
  UniqueFd err_read(err[0]), err_write(err[1]);
  int pty_pair[2] = {-1, -1};
  if (size && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pty_pair) != 0) {
    return fail(errno_error(ErrorCode::kInternal, "", "socketpair()", errno).message);
  }
  UniqueFd pty_read(pty_pair[0]), pty_write(pty_pair[1]);

  const pid_t child = ::fork();
  if (child < 0) {
    return fail(errno_error(ErrorCode::kInternal, "", "fork()", errno).message);
  }
  if (child == 0) {
    err_read.reset();
    pty_read.reset();
    entry->init = sys::PidFd();  // closed: the jail's pid 1 is none of the command's business
    run_command(*spec, identity->first, identity->second, o, *env, size, err_write.get(),
                pty_write.get());
  }
  err_write.reset();
  pty_write.reset();
  // The command's stdio are its own now: holding them would keep its pipes open after it closed
  // them (no EOF, no EPIPE for the gateway). /dev/null is the jail's (we are in its mounts).
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd <= 2; ++fd) {
    if (null_fd < 0 || ::dup2(null_fd, fd) != fd) {
      ::close(fd);
    }
  }
  if (null_fd > 2) {
    ::close(null_fd);
  }
  auto reaped = sys::Child::adopt(child);
  if (!reaped) {
    ::kill(child, SIGKILL);
    return fail(reaped.error().message);
  }
  sys::Child command = std::move(reaped).value();

  // "P<pid>\n", then nothing (it exec'd) or "E<message>".
  const std::string said = read_until_eof(err_read.get()).substr(0, 64 << 10);
  err_read.reset();
  const auto nl = said.find('\n');
  const bool has_pid = said.size() > 1 && said[0] == 'P' && nl != std::string::npos;
  const std::string after = has_pid ? said.substr(nl + 1) : said;
  if (!has_pid || !after.empty()) {
    (void)command.wait();
    return fail(after.size() > 1 && after[0] == 'E' ? after.substr(1)
                                                    : "the command ended before it started");
  }
  StatusEvent started;
  started.kind = StatusEvent::Kind::kStarted;
  started.pid = std::atoi(said.c_str() + 1);
  if (size) {
    auto got = sys::receive_packet(pty_read.get(), {}, /*nonblocking=*/true);
    if (!got || !*got || (*got)->fds.size() != 1) {
      (void)command.pidfd().signal(SIGKILL);
      (void)command.wait();
      return fail("the command's terminal was not handed over");
    }
    const int fds[] = {(*got)->fds.front().get()};
    report(started, fds);
  } else {
    report(started);
  }
  pty_read.reset();

  // Supervise: signals asked for on the control socket go to the command, through its pidfd;
  // the socket's end (the gateway is gone) kills it.
  for (;;) {
    pollfd fds[2] = {{command.pidfd().get(), POLLIN, 0}, {control, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      continue;
    }
    if (fds[0].revents != 0) {
      break;
    }
    if (fds[1].revents != 0) {
      auto msg = sys::receive_packet(control, {.max_bytes = 4096, .max_fds = 0});
      if (msg && !*msg) {
        (void)command.pidfd().signal(SIGKILL);
        break;
      }
      if (!msg) {
        continue;  // too large, or carried descriptors: dropped (and closed)
      }
      const auto j = nlohmann::json::parse((*msg)->data, nullptr, false);
      if (j.is_object() && j.contains("signal") && j["signal"].is_number_integer()) {
        const int sig = j["signal"].get<int>();
        if (sig > 0 && sig < 65) {
          (void)command.pidfd().signal(sig);
        }
      }
    }
  }
  auto status = command.wait();
  report(exited_event(status ? *status : (SIGKILL)));
  return 0;
}

}  // namespace cellgate::launcher
