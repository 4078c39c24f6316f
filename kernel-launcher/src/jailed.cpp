// Jailed exec mode: the launcher builds the jail around the kernel and supervises it.
//
//   launcher (host, root) ── cgroup, work dir, connection dir, staging root
//     └─ init (pid 1 of new mount/pid/net/ipc/uts namespaces), jail::contain_init(): its own
//        cgroup namespace, the root filesystem, the hostname; then forks
//          └─ kernel, jail::contain_kernel(): session, work dir, rlimits, credentials,
//             no_new_privs, fds, seccomp → execve
//        and stays as the reaper: forwards signals, reports the kernel's wait status, exits.
//
// Messages from inside travel on one pipe as lines: "R" (the kernel exec'd), "E<text>" (a step
// failed), "X<wait status>" (the kernel ended).
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/spec.hpp"
#include "cellgate/jail/userns.hpp"
#include "cellgate/launcher/launcher.hpp"
#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/launcher/zygote.hpp"
#include "cellgate/unique_fd.hpp"
#include "report.hpp"
#include "zygote_wire.hpp"

namespace cellgate::launcher {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

[[noreturn]] void die_with(int fd, const std::string& message) {
  write_all(fd, "E" + message + "\n");
  ::_exit(127);
}

std::string basename_of(const std::string& path) {
  auto pos = path.rfind('/');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}
std::string dirname_of(const std::string& path) {
  auto pos = path.rfind('/');
  return pos == std::string::npos ? "." : (pos == 0 ? "/" : path.substr(0, pos));
}

// Writes `text` to a new file owned by uid:gid, mode 0600, never following a link the kernel
// may have planted in its (writable) connection dir.
Result<void> write_private_file(const std::string& path, const std::string& text, uid_t uid,
                                gid_t gid) {
  ::unlink(path.c_str());
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    return errno_error(ErrorCode::kInternal, "conn_dir", "open('" + path + "', O_EXCL)", errno);
  }
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return errno_error(ErrorCode::kInternal, "conn_dir", "write('" + path + "')", errno);
  }
  if (::fchown(fd.get(), uid, gid) != 0) {
    return errno_error(ErrorCode::kInternal, "conn_dir", "fchown('" + path + "')", errno);
  }
  return {};
}

struct Connection {
  std::string conn_dir;         // host directory bound at kJailConnDir
  std::string jail_file;        // kJailConnDir/kernel.json
  std::string host_file;        // the file the gateway should use (reported when it changed)
  bool rewritten_from_tcp = false;
};

// Reads the host connection file and writes the jail's copy: same key and port numbers,
// transport ipc, sockets in the connection dir.
Result<Connection> prepare_connection(const std::string& connection_file, const std::string& name,
                                      uid_t uid, gid_t gid, std::optional<gid_t> access_gid) {
  std::ifstream in(connection_file);
  if (!in) {
    return errno_error(ErrorCode::kInvalidArgument, "connection_file",
                       "open('" + connection_file + "')", errno);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ip")) {
    return make_error(ErrorCode::kInvalidArgument, "connection_file",
                      connection_file + " is not a connection file");
  }
  Connection c;
  std::string prefix;
  if (j.value("transport", "tcp") == "ipc") {
    // The directory of the ipc prefix is bound into the jail: it must be this kernel's own.
    const std::string ip = j.value("ip", "");
    if (ip.empty() || ip.front() != '/') {
      return make_error(ErrorCode::kInvalidArgument, "connection_file",
                        "an ipc connection file needs an absolute ip (socket path prefix)");
    }
    c.conn_dir = dirname_of(ip);
    prefix = basename_of(ip);
    c.host_file = connection_file;
  } else {
    // The jail has no network: the kernel listens on ipc sockets in a private directory beside
    // the given file, and the gateway is told where (tcp ports are not reachable).
    c.conn_dir = dirname_of(connection_file) + "/" + name + ".conn";
    if (::mkdir(c.conn_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return errno_error(ErrorCode::kInternal, "conn_dir", "mkdir('" + c.conn_dir + "')", errno);
    }
    prefix = "k";
    c.rewritten_from_tcp = true;
  }
  struct stat st {};
  if (::lstat(c.conn_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_mode & 002) != 0) {
    return make_error(ErrorCode::kFailedPrecondition, "conn_dir",
                      c.conn_dir + " must be a real directory that is not world-writable");
  }
  // With an access group (an unprivileged gateway's, then also the kernel's gid) the group may
  // enter, and the sockets the kernel makes here (umask 002) let it connect.
  if (::chown(c.conn_dir.c_str(), uid, gid) != 0 ||
      ::chmod(c.conn_dir.c_str(), access_gid ? 0710 : 0700) != 0) {
    return errno_error(ErrorCode::kInternal, "conn_dir", "chown('" + c.conn_dir + "')", errno);
  }
  if (c.rewritten_from_tcp) {
    json host = j;
    host["transport"] = "ipc";
    host["ip"] = c.conn_dir + "/" + prefix;
    c.host_file = c.conn_dir + "/host-connection.json";
    CELLGATE_TRY(write_private_file(c.host_file, host.dump(1), 0, 0));
  }
  json inside = j;
  inside["transport"] = "ipc";
  inside["ip"] = std::string(jail::kJailConnDir) + "/" + prefix;
  c.jail_file = std::string(jail::kJailConnDir) + "/kernel.json";
  CELLGATE_TRY(write_private_file(c.conn_dir + "/kernel.json", inside.dump(1), uid, gid));
  return c;
}

std::vector<std::string> kernel_env(const jail::JailSpec& spec) {
  auto env = spec.env;
  env.emplace("HOME", jail::kJailWorkDir);
  env.emplace("PYDEVD_DISABLE_FILE_VALIDATION", "1");
  // The kernel's CPU count where the affinity mask (the "cpu affinity" step) is not what a
  // library sizes its pool from: OpenMP, OpenBLAS and MKL read these at load, numexpr at import,
  // joblib's loky caps os.cpu_count() with LOKY_MAX_CPU_COUNT, and Python 3.13+ returns
  // PYTHON_CPU_COUNT from os.cpu_count() (3.11's reads the host's count; jail/README.md, "CPU").
  // emplace: a kernelspec's or a client's own value wins.
  const std::string cpus = std::to_string(jail::kernel_cpu_count(spec.cpus));
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                           "NUMEXPR_NUM_THREADS", "LOKY_MAX_CPU_COUNT", "PYTHON_CPU_COUNT"}) {
    env.emplace(name, cpus);
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : env) {
    out.push_back(k + "=" + v);
  }
  return out;
}

// argv[0] resolved against the spec's PATH (execve does not search).
std::string resolve(const std::string& program, const jail::JailSpec& spec) {
  if (program.find('/') != std::string::npos) {
    return program;
  }
  auto it = spec.env.find("PATH");
  std::stringstream path(it == spec.env.end() ? "/usr/bin:/bin" : it->second);
  for (std::string dir; std::getline(path, dir, ':');) {
    std::string candidate = dir + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return program;
}

// The kernel process, forked by init: the last steps, then execve.
[[noreturn]] void run_kernel(const jail::JailSpec& spec, uid_t uid, gid_t gid,
                             const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const sigset_t& original_mask,
                             int err_fd) {
  for (int sig : kForwarded) {
    ::signal(sig, SIG_DFL);
  }
  ::signal(SIGCHLD, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  std::vector<char*> cargv;
  for (const auto& a : argv) {
    cargv.push_back(const_cast<char*>(a.c_str()));
  }
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (const auto& e : env) {
    cenv.push_back(const_cast<char*>(e.c_str()));
  }
  cenv.push_back(nullptr);
  const std::string program = resolve(argv[0], spec);

  auto steps = jail::contain_kernel(spec, uid, gid,
                                    [&] { return jail::close_inherited_fds(err_fd); });
  if (!steps) {
    die_with(err_fd, steps.error().message);
  }
  ::execve(program.c_str(), cargv.data(), cenv.data());
  die_with(err_fd, errno_error(ErrorCode::kInternal, "", "execve('" + program + "')", errno).message);
}

// pid 1 of the jail: builds the root, starts the kernel, reaps, forwards signals, reports.
[[noreturn]] void run_init(const jail::JailSpec& spec, const jail::RootPaths& paths, uid_t uid,
                           gid_t gid, const std::vector<std::string>& argv,
                           const std::vector<std::string>& env, const sigset_t& wait_set,
                           const sigset_t& original_mask, int go_fd, int report_fd) {
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
  auto root = jail::contain_init(spec, paths, uid, gid);
  if (!root) {
    die_with(report_fd, root.error().message);
  }
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    die_with(report_fd, "pipe2(): " + std::string(std::strerror(errno)));
  }
  pid_t kernel = ::fork();
  if (kernel < 0) {
    die_with(report_fd, "fork(): " + std::string(std::strerror(errno)));
  }
  if (kernel == 0) {
    ::close(exec_pipe[0]);
    ::close(report_fd);
    run_kernel(spec, uid, gid, argv, env, original_mask, exec_pipe[1]);
  }
  ::close(exec_pipe[1]);
  const std::string failure = read_until_eof(exec_pipe[0]);
  ::close(exec_pipe[0]);
  if (!failure.empty()) {
    write_all(report_fd, failure);  // already "E<text>\n"
    ::_exit(127);
  }
  write_all(report_fd, "R\n");
  for (;;) {
    siginfo_t info{};
    int sig = ::sigwaitinfo(&wait_set, &info);
    if (sig < 0) {
      continue;
    }
    if (sig != SIGCHLD) {
      ::kill(kernel, sig);
      continue;
    }
    // Reap everything: orphans of the kernel are ours as pid 1.
    for (;;) {
      int wstatus = 0;
      pid_t done = ::waitpid(-1, &wstatus, WNOHANG);
      if (done <= 0) {
        break;
      }
      if (done == kernel) {
        write_all(report_fd, "X" + std::to_string(wstatus) + "\n");
        ::_exit(0);  // pid 1 leaving kills whatever is left in the namespace
      }
    }
  }
}

// Reads one line from the jail's report pipe (blocking). "" at EOF.
std::string read_line(int fd, std::string& buffer) {
  for (;;) {
    auto nl = buffer.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      return line;
    }
    char buf[512];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      std::string rest = std::move(buffer);
      buffer.clear();
      return rest;
    }
    buffer.append(buf, static_cast<std::size_t>(n));
  }
}

// {"event":"started"}: the jail's pid 1, the connection file when it was rewritten, the cgroup.
void report_started(int status_fd, pid_t pid, const Connection* conn, const jail::Cgroup* cgroup) {
  StatusEvent started;
  started.kind = StatusEvent::Kind::kStarted;
  started.pid = pid;
  if (conn && conn->rewritten_from_tcp) {
    started.connection_file = conn->host_file;
  }
  if (cgroup) {
    started.cgroup_paths = cgroup->paths();
    started.cgroup_version = cgroup->version() == jail::CgroupVersion::kV1 ? "v1" : "v2";
  }
  report(status_fd, started);
}

// Reports how the kernel ended (its wait status, the cgroup's figures) and removes the cgroup.
// Returns the launcher's exit code.
int finish(int status_fd, const jail::JailSpec& spec, std::unique_ptr<jail::Cgroup> cgroup,
           pid_t init, int status, bool timed_out) {
  StatusEvent exited;
  exited.kind = StatusEvent::Kind::kExited;
  exited.pid = init;
  jail::CgroupStats stats;
  if (cgroup) {
    if (auto s = cgroup->stats(); s) {
      stats = *s;
    }
  }
  exited.memory_peak_bytes = stats.memory_peak_bytes;
  exited.oom_kills = stats.oom_kills;
  int exit_code = 0;
  if (WIFSIGNALED(status)) {
    exited.signal = WTERMSIG(status);
    exit_code = 128 + exited.signal;
    if (timed_out) {
      exited.reason = ExitReason::kTimeout;
      exited.message = "the kernel ran past its time limit of " +
                       std::to_string(spec.time_limit_seconds) + " s";
    } else if (exited.signal == SIGKILL && stats.oom_kills > 0) {
      exited.reason = ExitReason::kOom;
      exited.message = "killed by the memory limit of " + std::to_string(spec.memory_bytes) +
                       " bytes";
    } else if (exited.signal == SIGSYS) {
      exited.reason = ExitReason::kViolation;
      exited.message = "killed by the seccomp policy";
    } else {
      exited.reason = ExitReason::kSignaled;
    }
  } else {
    exited.reason = timed_out ? ExitReason::kTimeout : ExitReason::kOk;
    exited.exit_code = WEXITSTATUS(status);
    exit_code = exited.exit_code;
  }
  cgroup.reset();  // kills anything left and removes the cgroup
  report(status_fd, exited);
  return exit_code;
}

// The deadline of the spec's time limit, from now.
std::optional<timespec> time_limit_deadline(const jail::JailSpec& spec) {
  if (spec.time_limit_seconds <= 0) {
    return std::nullopt;
  }
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const auto add_ns = static_cast<long long>(spec.time_limit_seconds * 1e9);
  long long ns = now.tv_nsec + add_ns % 1000000000LL;
  return timespec{now.tv_sec + static_cast<time_t>(add_ns / 1000000000LL + ns / 1000000000LL),
                  static_cast<long>(ns % 1000000000LL)};
}

long long ns_until(const timespec& deadline) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return (deadline.tv_sec - now.tv_sec) * 1000000000LL + (deadline.tv_nsec - now.tv_nsec);
}

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
Result<ZygoteKernel> request_zygote_kernel(const std::string& socket_path,
                                           const jail::JailSpec& spec, uid_t uid, gid_t gid,
                                           const jail::RootPaths& paths,
                                           const std::vector<std::string>& kernel_args,
                                           const std::vector<std::string>& env) {
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
  for (const auto& e : env) {
    auto eq = e.find('=');
    env_object[e.substr(0, eq)] = eq == std::string::npos ? "" : e.substr(eq + 1);
  }
  const json request = {{"spec", spec_to_json(spec)},  {"uid", uid},
                        {"gid", gid},                  {"staging", paths.staging},
                        {"conn_dir", paths.conn_dir},  {"work_dir", paths.work_dir},
                        {"args", kernel_args},         {"env", env_object}};
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
                      "the zygote refused: " + (answer.is_object()
                                                    ? answer.value("error", reply->text)
                                                    : reply->text));
  }
  k.pid = answer["pid"].get<pid_t>();
  k.pidfd = std::move(reply->fds[0]);
  return k;
}

// Supervises a zygote kernel: the jail's pid 1 is the zygote's child, so it is watched through
// its pidfd and its kernel's wait status arrives on the report pipe.
int run_zygote_kernel(ZygoteKernel k, int status_fd, const jail::JailSpec& spec,
                      std::unique_ptr<jail::Cgroup> cgroup, const Connection* conn,
                      const sigset_t& wait_set) {
  // A jail that died early must not take the launcher with it when "G" meets a closed pipe (this
  // process execs nothing in zygote mode, so ignoring SIGPIPE reaches no kernel).
  ::signal(SIGPIPE, SIG_IGN);
  auto fail = [&](const std::string& message) {
    ::syscall(SYS_pidfd_send_signal, k.pidfd.get(), SIGKILL, nullptr, 0);
    report(status_fd, setup_error(message));
    return 127;
  };
  if (cgroup) {
    if (auto added = cgroup->add_process(k.pid); !added) {
      return fail(added.error().message);
    }
  }
  write_all(k.go_write.get(), "G");
  std::string buffer;
  std::string first = read_line(k.rep_read.get(), buffer);
  if (first != "R") {
    return fail(first.size() > 1 && first[0] == 'E'
                    ? first.substr(1)
                    : "the zygote's jail ended before the kernel started");
  }
  report_started(status_fd, k.pid, conn, cgroup.get());

  sigset_t forwarded = wait_set;
  sigdelset(&forwarded, SIGCHLD);
  UniqueFd sfd(::signalfd(-1, &forwarded, SFD_CLOEXEC));
  const std::optional<timespec> deadline = time_limit_deadline(spec);
  bool timed_out = false;
  for (;;) {
    int timeout_ms = -1;
    if (deadline && !timed_out) {
      const long long left = ns_until(*deadline);
      if (left <= 0) {
        timed_out = true;
        ::syscall(SYS_pidfd_send_signal, k.pidfd.get(), SIGKILL, nullptr, 0);
        continue;
      }
      timeout_ms = static_cast<int>(std::min<long long>(left / 1000000 + 1, 60000));
    }
    pollfd fds[2] = {{k.pidfd.get(), POLLIN, 0}, {sfd.get(), POLLIN, 0}};
    if (::poll(fds, 2, timeout_ms) < 0) {
      continue;
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo info{};
      if (::read(sfd.get(), &info, sizeof info) == sizeof info) {
        ::syscall(SYS_pidfd_send_signal, k.pidfd.get(), static_cast<int>(info.ssi_signo), nullptr,
                  0);
      }
    }
    if (fds[0].revents != 0) {
      break;  // pid 1 of the jail is gone
    }
  }
  k.go_write.reset();
  std::optional<int> kernel_status;
  for (std::string line; !(line = read_line(k.rep_read.get(), buffer)).empty();) {
    if (line[0] == 'X') {
      kernel_status = std::atoi(line.c_str() + 1);
    }
  }
  // Without the reaper's report (it was killed: the time limit, or the launcher's own signal),
  // the jail ended by SIGKILL; the zygote, its parent, holds the real status.
  return finish(status_fd, spec, std::move(cgroup), k.pid, kernel_status.value_or(SIGKILL),
                timed_out);
}

}  // namespace

int run_probe_host() {
  std::cout << jail::probe_host().describe() << "\n";
  return 0;
}

int run_jailed_mode(const LaunchOptions& options) {
  const int status_fd = options.status_fd;
  if (status_fd >= 0) {
    ::fcntl(status_fd, F_SETFD, FD_CLOEXEC);
  }
  auto fail = [&](const std::string& message) {
    report(status_fd, setup_error(message));
    return 127;
  };
  if (!open_status_copy(options.status_file)) {
    return fail(errno_error(ErrorCode::kInternal, "", "open('" + options.status_file + "')", errno)
                    .message);
  }
  if (options.argv.empty()) {
    return fail("no kernel command given");
  }
  if (options.die_with_parent) {
    // The jail follows: exec mode's init has its own death signal on us, a zygote jail's reaper
    // sees its go pipe close.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  }
  if (::geteuid() != 0) {
    return fail("building the jail needs root (namespaces, cgroups, mounts): run this launcher "
                "as root, or through a gateway (cellgate serve, run, exec, mcp) started as this "
                "user, which enters a user namespace of its own first (rootless mode); or pass "
                "--no-jail to run the kernel unjailed, knowingly.");
  }
  jail::JailSpec spec;
  if (!options.spec_path.empty()) {
    auto loaded = load_spec(options.spec_path);
    if (!loaded) {
      return fail(loaded.error().message);
    }
    spec = std::move(loaded).value();
  }
  const pid_t self = ::getpid();
  uid_t uid = spec.uid.value_or(jail::kUidBase + static_cast<uid_t>(self));
  gid_t gid = spec.gid.value_or(static_cast<gid_t>(uid));
  if (jail::in_single_uid_user_namespace()) {
    // Rootless (userns.hpp): the namespace maps one uid, 0, the user outside; kernels run as it.
    uid = 0;
    gid = 0;
  } else if (const auto range = jail::kernel_uid_range(); range.count > 0 && !spec.uid) {
    // Rootless with a subordinate range: a uid of it, chosen as kUidBase + pid is as root.
    uid = range.first + static_cast<uid_t>(self) % range.count;
    gid = spec.gid.value_or(static_cast<gid_t>(uid));
  }
  if (spec.access_gid) {
    // Shared with an unprivileged gateway: what the kernel makes is that group's.
    gid = *spec.access_gid;
  }
  const std::string name = spec.name.empty() ? "k" + std::to_string(self) : spec.name;

  // The cgroup first: a limit the host cannot enforce stops us before anything else happens.
  std::vector<std::string> warnings;
  std::unique_ptr<jail::Cgroup> cgroup;
  {
    auto host = jail::CgroupHost::detect_system(spec.cgroup_parent);
    const bool all_optional = spec.optional.count("memory") && spec.optional.count("pids") &&
                              spec.optional.count("cpu");
    if (!host && !all_optional) {
      return fail("no usable cgroups on this host, so the memory, pids and cpu limits cannot be "
                  "enforced: " + host.error().message);
    }
    if (host) {
      jail::CgroupLimits limits;
      limits.memory_bytes = spec.memory_bytes;
      limits.swap_off = true;
      limits.pids = spec.pids;
      limits.cpus = spec.cpus;
      auto created = host->create(spec.cgroup_group, name, limits, spec.optional, &warnings);
      if (created) {
        cgroup = std::move(created).value();
      } else if (all_optional) {
        // No cgroup of our own here (an ordinary user on cgroup v1): every limit it would hold
        // was made optional by the operator.
        warnings.push_back("no cgroup for this kernel, so no memory, pids or cpu limit: " +
                           created.error().message);
      } else {
        return fail(created.error().message);
      }
    }
  }
  for (const auto& w : warnings) {
    std::cerr << "cellgate-kernel: warning: " << w << "\n";
  }

  if (!spec.work_dir.empty()) {
    auto mounted = jail::mount_work_tmpfs(spec.work_dir, spec.work_bytes, uid, gid,
                                          spec.access_gid);
    if (!mounted) {
      if (spec.optional.count("work_size") == 0) {
        return fail("the work dir's size cap needs a tmpfs: " + mounted.error().message);
      }
      std::cerr << "cellgate-kernel: warning: work dir not size-capped: "
                << mounted.error().message << "\n";
    }
    if (::chown(spec.work_dir.c_str(), uid, gid) != 0 ||
        (spec.access_gid && ::chmod(spec.work_dir.c_str(), 0770) != 0)) {
      return fail(errno_error(ErrorCode::kInternal, "", "chown('" + spec.work_dir + "')", errno)
                      .message);
    }
  }

  // Without a connection file the program is not a kernel (a probe in tests): no connection dir.
  std::optional<Connection> conn;
  std::vector<std::string> argv = options.argv;
  if (!options.connection_file.empty()) {
    auto prepared = prepare_connection(options.connection_file, name, uid, gid, spec.access_gid);
    if (!prepared) {
      return fail(prepared.error().message);
    }
    conn = std::move(prepared).value();
    for (auto& a : argv) {
      if (a == options.connection_file) {
        a = conn->jail_file;
      }
    }
  }
  auto staging = jail::staging_dir();
  if (!staging) {
    return fail(staging.error().message);
  }
  const jail::RootPaths paths{*staging, conn ? conn->conn_dir : "", spec.work_dir};
  const std::vector<std::string> env = kernel_env(spec);

  sigset_t wait_set, original_mask;
  sigemptyset(&wait_set);
  for (int sig : kForwarded) {
    sigaddset(&wait_set, sig);
  }
  sigaddset(&wait_set, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &wait_set, &original_mask);

  if (!options.zygote_socket.empty()) {
    std::vector<std::string> kernel_args;
    if (!zygote_can_serve(argv, resolve(argv[0], spec), &kernel_args)) {
      std::cerr << "cellgate-kernel: the zygote serves /usr/bin/python3 -m ipykernel_launcher "
                   "only; starting this kernel cold\n";
    } else {
      auto k = request_zygote_kernel(options.zygote_socket, spec, uid, gid, paths, kernel_args,
                                     env);
      if (k) {
        return run_zygote_kernel(std::move(k).value(), status_fd, spec, std::move(cgroup),
                                 conn ? &*conn : nullptr, wait_set);
      }
      if (k.error().code != ErrorCode::kUnavailable) {
        return fail(k.error().message);
      }
      std::cerr << "cellgate-kernel: warning: no zygote (" << k.error().message
                << "); starting this kernel cold\n";
    }
  }

  int go[2], rep[2];
  if (::pipe2(go, O_CLOEXEC) != 0 || ::pipe2(rep, O_CLOEXEC) != 0) {
    return fail(errno_error(ErrorCode::kInternal, "", "pipe2()", errno).message);
  }
  UniqueFd go_read(go[0]), go_write(go[1]), rep_read(rep[0]), rep_write(rep[1]);

  auto child = jail::clone_jailed();
  if (!child) {
    return fail(child.error().message);
  }
  if (*child == 0) {
    go_write.reset();
    rep_read.reset();
    if (status_fd >= 0) {
      ::close(status_fd);
    }
    if (status_copy_fd() >= 0) {
      ::close(status_copy_fd());  // a host file: nothing of it goes into the jail
    }
    run_init(spec, paths, uid, gid, argv, env, wait_set, original_mask, go_read.get(),
             rep_write.get());
  }
  const pid_t init = *child;
  go_read.reset();
  rep_write.reset();

  if (cgroup) {
    if (auto added = cgroup->add_process(init); !added) {
      ::kill(init, SIGKILL);
      ::waitpid(init, nullptr, 0);
      return fail(added.error().message);
    }
  }
  write_all(go_write.get(), "G");
  go_write.reset();

  std::string buffer;
  std::string first = read_line(rep_read.get(), buffer);
  if (first != "R") {
    int wstatus = 0;
    ::waitpid(init, &wstatus, 0);
    return fail(first.size() > 1 && first[0] == 'E' ? first.substr(1)
                                                    : "the jail's init ended before the kernel "
                                                      "started");
  }
  report_started(status_fd, init, conn ? &*conn : nullptr, cgroup.get());

  // Supervise: forward signals to init (which forwards them to the kernel), enforce the time
  // limit, and wait for init to end.
  const std::optional<timespec> deadline = time_limit_deadline(spec);
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
      timespec wait{static_cast<time_t>(left / 1000000000LL), static_cast<long>(left % 1000000000LL)};
      sig = ::sigtimedwait(&wait_set, &info, &wait);
    } else {
      sig = ::sigwaitinfo(&wait_set, &info);
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

  std::optional<int> kernel_status;
  for (std::string line; !(line = read_line(rep_read.get(), buffer)).empty();) {
    if (line[0] == 'X') {
      kernel_status = std::atoi(line.c_str() + 1);
    }
  }
  return finish(status_fd, spec, std::move(cgroup), init, kernel_status.value_or(init_status),
                timed_out);
}

}  // namespace cellgate::launcher
