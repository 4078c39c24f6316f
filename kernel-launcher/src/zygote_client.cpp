// Jailed zygote mode, the launcher's half: asks the zygote (zygote.hpp) for a jail and supervises
// it. The jail's pid 1 is the zygote's child, so the launcher watches it through its pidfd; its
// kernel's wait status arrives on the report pipe, as in exec mode (init.hpp).
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/unique_fd.hpp"
#include "host_jail.hpp"
#include "init.hpp"
#include "spool_service.hpp"
#include "zygote_wire.hpp"

namespace cellgate::launcher {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The kernel command lines the zygote can serve: /usr/bin/python3 (the interpreter it embeds)
// -m ipykernel_launcher|ipykernel [args]. Sets the args after the module name.
bool zygote_can_serve(const std::vector<std::string>& argv, const std::string& program,
                      std::vector<std::string>* kernel_args) {
  if (argv.size() < 3 || argv[1] != "-m" ||
      (argv[2] != "ipykernel_launcher" && argv[2] != "ipykernel")) {
    return false;
  }
  std::error_code ec1, ec2;
  const auto a = fs::canonical(program, ec1);
  const auto b = fs::canonical("/usr/bin/python3", ec2);
  if (ec1 || ec2 || a != b) {
    return false;
  }
  kernel_args->assign(argv.begin() + 3, argv.end());
  return true;
}

struct ZygoteKernel {
  pid_t pid = -1;
  UniqueFd pidfd;
  UniqueFd go_write;  // "G" once in the cgroup; kept open as the jail's lifeline
  UniqueFd rep_read;
};

// Asks the zygote for a jail. kUnavailable: no zygote answered (the caller may start the kernel
// cold); any other error: the zygote refused or failed.
Result<ZygoteKernel> request_zygote_kernel(const std::string& socket_path, const HostJail& j,
                                           const std::vector<std::string>& kernel_args) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  if (!sock || socket_path.size() >= sizeof addr.sun_path) {
    return make_error(ErrorCode::kUnavailable, "zygote", "bad zygote socket " + socket_path);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return errno_error(ErrorCode::kUnavailable, "zygote", "connect('" + socket_path + "')", errno);
  }
  timeval tv{10, 0};  // the zygote answers right after its clone
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

  json env_object = json::object();
  for (const auto& e : j.env()) {
    auto eq = e.find('=');
    env_object[e.substr(0, eq)] = eq == std::string::npos ? "" : e.substr(eq + 1);
  }
  const json request = {{"spec", spec_to_json(j.spec())},
                        {"uid", j.uid()},
                        {"gid", j.gid()},
                        {"staging", j.paths().staging},
                        {"conn_dir", j.paths().conn_dir},
                        {"work_dir", j.paths().work_dir},
                        {"args", kernel_args},
                        {"env", env_object}};
  UniqueFd mntns(::open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC));
  int go[2], rep[2];
  if (!mntns || ::pipe2(go, O_CLOEXEC) != 0) {
    return errno_error(ErrorCode::kInternal, "zygote", "open('/proc/self/ns/mnt') or pipe2()",
                       errno);
  }
  ZygoteKernel k;
  UniqueFd go_read(go[0]);
  k.go_write.reset(go[1]);
  if (::pipe2(rep, O_CLOEXEC) != 0) {
    return errno_error(ErrorCode::kInternal, "zygote", "pipe2()", errno);
  }
  k.rep_read.reset(rep[0]);
  UniqueFd rep_write(rep[1]);
  CELLGATE_TRY(zygote_wire::send_message(
      sock.get(), request.dump(),
      {mntns.get(), rep_write.get(), go_read.get(), STDOUT_FILENO, STDERR_FILENO}));
  auto reply = zygote_wire::recv_message(sock.get());
  if (!reply) {
    return reply.error();
  }
  const json answer = json::parse(reply->text, nullptr, false);
  if (!answer.is_object() || !answer.contains("pid") || reply->fds.size() != 1) {
    return make_error(ErrorCode::kUnavailable, "zygote",
                      "the zygote refused: " +
                          (answer.is_object() ? answer.value("error", reply->text) : reply->text));
  }
  k.pid = answer["pid"].get<pid_t>();
  k.pidfd = std::move(reply->fds[0]);
  return k;
}

int pidfd_kill(const UniqueFd& pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd.get(), sig, nullptr, 0));
}

// Supervises a zygote kernel through its pidfd until pid 1 of its jail is gone.
int supervise(ZygoteKernel k, HostJail& j) {
  // A jail that died early must not take the launcher with it when "G" meets a closed pipe (this
  // process execs nothing in zygote mode, so ignoring SIGPIPE reaches no kernel).
  (void)::signal(SIGPIPE, SIG_IGN);
  auto fail = [&](const std::string& message) {
    pidfd_kill(k.pidfd, SIGKILL);
    return j.fail(message);
  };
  if (auto added = j.add_to_cgroup(k.pid); !added) {
    return fail(added.error().message);
  }
  write_all(k.go_write.get(), "G");
  init::InitReport report(std::move(k.rep_read));
  if (auto ready = report.wait_ready("the zygote's jail ended before the kernel started"); !ready) {
    return fail(ready.error().message);
  }
  j.report_started(k.pid, /*from_zygote=*/true);

  sigset_t forwarded = j.wait_set();
  sigdelset(&forwarded, SIGCHLD);
  UniqueFd sfd(::signalfd(-1, &forwarded, SFD_CLOEXEC));
  auto spool = j.start_spool();
  const std::optional<long long> deadline = time_limit_deadline(j.spec());
  bool timed_out = false;
  std::vector<pollfd> fds;
  for (;;) {
    int timeout_ms = -1;
    if (deadline && !timed_out) {
      const long long left = ns_until(*deadline);
      if (left <= 0) {
        timed_out = true;
        pidfd_kill(k.pidfd, SIGKILL);
        continue;
      }
      timeout_ms = static_cast<int>(std::min<long long>(left / 1000000 + 1, 60000));
    }
    fds.assign({{k.pidfd.get(), POLLIN, 0}, {sfd.get(), POLLIN, 0}});
    if (spool) {
      spool->add_pollfds(fds);
      timeout_ms = spool->poll_timeout_ms(timeout_ms);
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      continue;
    }
    if (spool) {
      spool->on_poll(fds);
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo info{};
      if (::read(sfd.get(), &info, sizeof info) == sizeof info) {
        pidfd_kill(k.pidfd, static_cast<int>(info.ssi_signo));
      }
    }
    if (fds[0].revents != 0) {
      break;  // pid 1 of the jail is gone
    }
  }
  k.go_write.reset();
  // Without the reaper's report (it was killed: the time limit, or the launcher's own signal),
  // the jail ended by SIGKILL; the zygote, its parent, holds the real status.
  return j.finish(k.pid, report.kernel_status().value_or(SIGKILL), timed_out);
}

}  // namespace

std::optional<int> run_zygote_kernel(HostJail& j, const std::string& socket) {
  std::vector<std::string> kernel_args;
  if (!zygote_can_serve(j.argv(), resolve_program(j.argv()[0], j.spec()), &kernel_args)) {
    std::cerr << "cellgate-kernel: the zygote serves /usr/bin/python3 -m ipykernel_launcher "
                 "only; starting this kernel cold\n";
    return std::nullopt;
  }
  auto k = request_zygote_kernel(socket, j, kernel_args);
  if (k) {
    return supervise(std::move(k).value(), j);
  }
  if (k.error().code != ErrorCode::kUnavailable) {
    return j.fail(k.error().message);
  }
  std::cerr << "cellgate-kernel: warning: no zygote (" << k.error().message
            << "); starting this kernel cold\n";
  return std::nullopt;
}

}  // namespace cellgate::launcher
