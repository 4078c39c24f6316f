#include "cellgate/kernel/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/proc.hpp"
#include "cellgate/util/descriptors.hpp"
#include "cellgate/util/fs.hpp"
#include "spawn.hpp"

namespace cellgate::kernel {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kLauncherStatusFd = 3;
constexpr std::size_t kKernelDescriptors = 32;

// The end of a kernel whose launcher ended without saying how (killed, or it crashed).
launcher::StatusEvent launcher_lost() {
  launcher::StatusEvent lost;
  lost.kind = launcher::StatusEvent::Kind::kExited;
  lost.reason = launcher::ExitReason::kSetupError;
  lost.message = "the launcher ended without a report";
  return lost;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}

}  // namespace

std::string executable_dir() {
  auto exe = sys::read_link("/proc/self/exe");
  return exe ? fs::path(*exe).parent_path().string() : std::string(".");
}

std::map<std::string, std::string> default_kernel_env(const std::string& work_dir, bool jailed) {
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/bin:/usr/bin:/bin"},
      {"LANG", "C.UTF-8"},
      {"PYTHONUNBUFFERED", "1"},
      // ipykernel's debugger warns on stderr about frozen modules at every start.
      {"PYDEVD_DISABLE_FILE_VALIDATION", "1"},
  };
  if (!jailed) {
    std::string cache = env_or("XDG_CACHE_HOME", env_or("HOME", "/tmp") + "/.cache");
    env["HOME"] = work_dir;
    env["MPLCONFIGDIR"] = cache + "/cellgate/matplotlib";
  }
  return env;
}

Result<std::pair<UniqueFd, UniqueFd>> status_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return errno_error(ErrorCode::kInternal, "spawn", "pipe2()", errno);
  }
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(::fcntl(fds[1], F_DUPFD_CLOEXEC, 10));
  ::close(fds[1]);
  if (!write_end) {
    return errno_error(ErrorCode::kInternal, "spawn", "fcntl(F_DUPFD_CLOEXEC)", errno);
  }
  return std::pair<UniqueFd, UniqueFd>(std::move(read_end), std::move(write_end));
}

Result<pid_t> spawn_with_status_fd(std::vector<std::string> argv, std::vector<std::string> env,
                                   int status_write_fd, const std::string& log_file) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, status_write_fd, kLauncherStatusFd);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_file.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addclosefrom_np(&actions, kLauncherStatusFd + 1);
  pid_t pid = -1;
  const int rc = detail::spawn_clean(&pid, actions, argv, std::move(env));
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return errno_error(ErrorCode::kFailedPrecondition, "spawn", "posix_spawn('" + argv[0] + "')",
                       rc);
  }
  return pid;
}

Result<std::unique_ptr<KernelProcess>> KernelProcess::start(LaunchRequest request) {
  // A kernel costs the gateway ~15 descriptors (launcher pipes, ZeroMQ sockets and their
  // signalers); libraries fail badly when they run out midway, so refuse here, whole.
  CELLGATE_TRY(require_free_descriptors(kKernelDescriptors, "starting a kernel"));
  std::unique_ptr<KernelProcess> kp(new KernelProcess());

  // A private runtime directory: connection file (it holds the key), ipc sockets, work dir.
  std::string parent =
      request.runtime_parent.empty() ? env_or("TMPDIR", "/tmp") : request.runtime_parent;
  std::string templ = parent + "/cellgate-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    return errno_error(ErrorCode::kInternal, "runtime_dir", "mkdtemp('" + templ + "')", errno);
  }
  kp->runtime_dir_ = templ;
  if (request.jail && request.jail->access_gid) {
    // An unprivileged gateway (the access group) reaches the connection and work dirs in it; it
    // lists nothing and reads no file here (the connection file holds the key).
    if (::chown(templ.c_str(), static_cast<uid_t>(-1), *request.jail->access_gid) != 0 ||
        ::chmod(templ.c_str(), 0710) != 0) {
      return errno_error(ErrorCode::kInternal, "runtime_dir", "chown('" + templ + "')", errno);
    }
  }
  if (request.work_dir.empty()) {
    kp->work_dir_ = templ + "/work";
    if (::mkdir(kp->work_dir_.c_str(), 0700) != 0) {
      return errno_error(ErrorCode::kInternal, "runtime_dir", "mkdir('" + kp->work_dir_ + "')",
                         errno);
    }
  } else {
    kp->work_dir_ = request.work_dir;
  }
  kp->jailed_ = request.jail.has_value();
  // The connection dir holds the ipc sockets and, for a jailed kernel, is bound into the jail.
  const std::string conn_dir = templ + "/conn";
  if (::mkdir(conn_dir.c_str(), 0700) != 0) {
    return errno_error(ErrorCode::kInternal, "runtime_dir", "mkdir('" + conn_dir + "')", errno);
  }
  if (request.transport == "tcp" && !kp->jailed_) {
    CELLGATE_ASSIGN_OR_RETURN(kp->connection_, ConnectionInfo::make_tcp());
  } else {
    kp->connection_ = ConnectionInfo::make_ipc(conn_dir + "/k");
  }
  kp->connection_.kernel_name = request.spec.name;
  if (!request.restore_image.empty()) {
    if (!request.jail || request.key.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "restore_image",
                        "a copy of a kernel is restored into a jail, with its source's key");
    }
    kp->connection_.key = request.key;
  }
  kp->connection_file_ = conn_dir + "/connection.json";
  CELLGATE_TRY(kp->connection_.save(kp->connection_file_));
  for (const auto& [name, content] : request.conn_files) {
    if (name.empty() || name.find('/') != std::string::npos || name == "connection.json") {
      return make_error(ErrorCode::kInvalidArgument, "conn_files",
                        "a connection-dir file needs a plain name other than connection.json");
    }
    CELLGATE_TRY(
        atomic_write(conn_dir + "/" + name, content, 0644, Durability::kNone, "runtime_dir"));
  }

  std::string launcher =
      request.launcher_path.empty() ? executable_dir() + "/cellgate-kernel" : request.launcher_path;
  kp->launcher_path_ = launcher;
  kp->launcher_env_ = request.launcher_env;
  kp->die_with_parent_ = request.die_with_parent;
  kp->status_file_ = templ + "/status";
  std::vector<std::string> args = {launcher,
                                   "--status-fd",
                                   std::to_string(kLauncherStatusFd),
                                   "--status-file",
                                   kp->status_file_,
                                   "--connection-file",
                                   kp->connection_file_};
  auto env_map = request.env.empty() ? default_kernel_env(kp->work_dir_, kp->jailed_) : request.env;
  for (auto& [k, v] : request.spec.env.items()) {
    if (v.is_string()) {
      env_map[k] = v.get<std::string>();
    }
  }
  if (kp->jailed_) {
    jail::JailSpec spec = *request.jail;
    if (spec.work_dir.empty()) {
      spec.work_dir = kp->work_dir_;
    }
    spec.env = env_map;
    const std::string spec_file = templ + "/jail.json";
    {
      std::ofstream out(spec_file);
      out << launcher::spec_to_json(spec).dump(1);
      if (!out) {
        return errno_error(ErrorCode::kInternal, "runtime_dir", "write('" + spec_file + "')",
                           errno);
      }
    }
    args.insert(args.end(), {"--spec", spec_file, "--spool-socket", templ + "/spool.sock"});
    if (!request.restore_image.empty()) {
      args.insert(args.end(), {"--restore", request.restore_image});
    } else if (!request.zygote_socket.empty()) {
      args.insert(args.end(), {"--zygote-socket", request.zygote_socket});
    }
    kp->work_mounted_ = request.work_dir.empty();  // ours to unmount only when we made it
    // The launcher's own environment: nothing but what was asked (the kernel's is the spec's).
    env_map = request.launcher_env;
  } else {
    args.insert(args.end(), {"--no-jail", "--cwd", kp->work_dir_});
  }
  if (request.die_with_parent) {
    args.emplace_back("--die-with-parent");
  }
  if (request.restore_image.empty()) {
    args.emplace_back("--");
    for (auto& a : request.spec.expand_argv(kp->connection_file_)) {
      args.push_back(std::move(a));
    }
  }

  std::vector<std::string> env_strings;
  for (auto& [k, v] : env_map) {
    env_strings.push_back(k + "=" + v);
  }

  CELLGATE_ASSIGN_OR_RETURN(auto pipe, status_pipe());
  auto& [read_end, write_end] = pipe;

  kp->log_file_ = templ + "/kernel.log";
  // Nothing else of the gateway's reaches the launcher or its kernel: not its listening socket
  // (which an orphaned kernel would keep open), not client connections, not other kernels' fds.
  auto spawned =
      spawn_with_status_fd(std::move(args), std::move(env_strings), write_end.get(), kp->log_file_);
  if (!spawned) {
    Error e = std::move(spawned).error();
    e.reason = "launcher_missing";
    return e;
  }
  const pid_t pid = *spawned;
  kp->launcher_pid_ = pid;
  write_end.reset();
  ::fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
  kp->status_fd_ = std::move(read_end);

  const auto deadline = Clock::now() + request.start_timeout;
  while (!kp->started_ && !kp->exited_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return make_error(ErrorCode::kDeadlineExceeded, "start_timeout",
                        "the launcher did not report within " +
                            std::to_string(request.start_timeout.count()) + " ms");
    }
    kp->read_status(static_cast<int>(left.count()));
  }
  if (!kp->started_) {
    return make_error(ErrorCode::kFailedPrecondition, "kernel_setup_error",
                      "the kernel could not be started: " + kp->exited_->message);
  }
  // A kernel that exits at once (bad argv, missing module) starts, then ends: callers see that
  // through poll_exit() and log_tail().
  kp->kernel_pid_ = kp->started_->pid;
  if (!kp->started_->connection_file.empty()) {
    CELLGATE_ASSIGN_OR_RETURN(kp->connection_, ConnectionInfo::load(kp->started_->connection_file));
  }
  return kp;
}

std::string KernelProcess::spool_socket() const {
  return jailed_ && !runtime_dir_.empty() ? runtime_dir_ + "/spool.sock" : std::string();
}

Result<std::unique_ptr<KernelProcess>> KernelProcess::adopt(const AdoptionFacts& facts) {
  auto gone = [&](const std::string& why) {
    return make_error(ErrorCode::kNotFound, "launcher_gone",
                      "the launcher (pid " + std::to_string(facts.launcher_pid) + ") " + why);
  };
  if (facts.launcher_pid <= 0 || facts.launcher_start_time.empty()) {
    return gone("is not recorded");
  }
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, facts.launcher_pid, 0));
  if (fd < 0) {
    return gone("has ended");
  }
  UniqueFd pidfd(fd);
  // Checked after the pidfd is held: the pid cannot be reused while we hold it.
  if (process_start_time(facts.launcher_pid) != facts.launcher_start_time) {
    return gone("has ended (the pid now names another process)");
  }
  std::unique_ptr<KernelProcess> kp(new KernelProcess());
  kp->adopted_ = true;
  kp->launcher_pidfd_ = std::move(pidfd);
  kp->launcher_pid_ = facts.launcher_pid;
  kp->kernel_pid_ = facts.kernel_pid;
  kp->jailed_ = facts.jailed;
  kp->take_files(facts);
  launcher::StatusEvent started;
  started.kind = launcher::StatusEvent::Kind::kStarted;
  started.pid = facts.kernel_pid;
  started.cgroup_paths = facts.cgroup_paths;
  started.cgroup_version = facts.cgroup_version;
  kp->started_ = started;
  kp->parse_status_lines();  // an exit reported while no gateway listened
  return kp;
}

void KernelProcess::take_files(const AdoptionFacts& facts) {
  runtime_dir_ = facts.runtime_dir;
  status_file_ = facts.status_file;
  log_file_ = facts.log_file;
  work_dir_ = facts.work_dir;
  connection_ = facts.connection;
  connection_file_ = facts.connection_file;
}

Result<std::unique_ptr<KernelProcess>> KernelProcess::hibernated_from(
    const AdoptionFacts& facts, const std::string& launcher_path) {
  if (!facts.jailed || facts.runtime_dir.empty() || facts.connection_file.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "not_hibernated",
                      "the record is not of a hibernated jailed kernel");
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(facts.runtime_dir + "/jail.json", ec)) {
    return make_error(ErrorCode::kNotFound, "runtime_dir_gone",
                      "the kernel's runtime dir " + facts.runtime_dir +
                          " (its jail spec and connection) is gone");
  }
  std::unique_ptr<KernelProcess> kp(new KernelProcess());
  kp->jailed_ = true;
  kp->launcher_path_ =
      launcher_path.empty() ? executable_dir() + "/cellgate-kernel" : launcher_path;
  kp->take_files(facts);
  return kp;
}

std::optional<AdoptionFacts> KernelProcess::adoption_facts() const {
  AdoptionFacts f;
  f.launcher_pid = launcher_pid_;
  f.launcher_start_time = process_start_time(launcher_pid_);
  f.kernel_pid = kernel_pid_;
  f.jailed = jailed_;
  f.runtime_dir = runtime_dir_;
  f.status_file = status_file_;
  f.log_file = log_file_;
  f.work_dir = work_dir_;
  if (started_) {
    f.cgroup_paths = started_->cgroup_paths;
    f.cgroup_version = started_->cgroup_version;
  }
  f.connection = connection_;
  f.connection_file = connection_file_;
  return f;
}

void KernelProcess::detach() {
  launcher_pid_ = -1;
  adopted_ = false;
  work_mounted_ = false;
  runtime_dir_.clear();
}

void KernelProcess::parse_status_lines() {
  std::ifstream in(status_file_);
  exited_.reset();
  for (std::string line; std::getline(in, line);) {
    auto ev = launcher::StatusEvent::parse_line(line);
    if (!ev) {
      continue;
    }
    if (ev->kind == launcher::StatusEvent::Kind::kExited) {
      exited_ = *ev;
    } else if (ev->kind == launcher::StatusEvent::Kind::kStarted) {
      // A hibernated kernel's file goes on after its restore: the dump's exit came before.
      exited_.reset();
    }
  }
}

void KernelProcess::watch_adopted(int timeout_ms) {
  if (exited_ || !launcher_pidfd_) {
    return;
  }
  pollfd pfd{launcher_pidfd_.get(), POLLIN, 0};
  if (::poll(&pfd, 1, timeout_ms) <= 0) {
    return;
  }
  parse_status_lines();
  if (!exited_) {
    exited_ = launcher_lost();
  }
}

void KernelProcess::read_status(int timeout_ms) {
  if (adopted_) {
    watch_adopted(timeout_ms);
    return;
  }
  if (!status_fd_) {
    return;
  }
  pollfd pfd{status_fd_.get(), POLLIN, 0};
  if (::poll(&pfd, 1, timeout_ms) <= 0) {
    return;
  }
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(status_fd_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n == 0) {
      status_fd_.reset();  // the launcher is gone
      if (!exited_) {
        exited_ = launcher_lost();
      }
      break;
    }
    if (n < 0) {
      break;  // EAGAIN
    }
    status_buffer_.append(buf, static_cast<std::size_t>(n));
  }
  for (std::size_t nl; (nl = status_buffer_.find('\n')) != std::string::npos;) {
    auto ev = launcher::StatusEvent::parse_line(std::string_view(status_buffer_).substr(0, nl));
    status_buffer_.erase(0, nl + 1);
    if (!ev) {
      continue;
    }
    if (ev->kind == launcher::StatusEvent::Kind::kStarted) {
      started_ = *ev;
    } else {
      exited_ = *ev;
    }
  }
}

std::string KernelProcess::log_tail(std::size_t max_bytes) const {
  std::ifstream in(log_file_, std::ios::binary | std::ios::ate);
  if (!in) {
    return {};
  }
  const auto size = static_cast<std::size_t>(in.tellg());
  const std::size_t start = size > max_bytes ? size - max_bytes : 0;
  in.seekg(static_cast<std::streamoff>(start));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Result<void> KernelProcess::signal(int sig) {
  if (kernel_pid_ <= 0 || exited_) {
    return make_error(ErrorCode::kFailedPrecondition, "not_running", "the kernel is not running");
  }
  // The launcher forwards it to the kernel (through the jail's init when jailed).
  const int sent = adopted_ ? static_cast<int>(::syscall(SYS_pidfd_send_signal,
                                                         launcher_pidfd_.get(), sig, nullptr, 0))
                            : ::kill(launcher_pid_, sig);
  if (sent != 0) {
    return errno_error(ErrorCode::kInternal, "signal",
                       "kill(" + std::to_string(kernel_pid_) + ", " + std::to_string(sig) + ")",
                       errno);
  }
  return {};
}

std::optional<launcher::StatusEvent> KernelProcess::poll_exit() {
  read_status(0);
  return exited_;
}

std::optional<launcher::StatusEvent> KernelProcess::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!exited_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || (!status_fd_ && !launcher_pidfd_)) {
      break;
    }
    read_status(static_cast<int>(left.count()));
  }
  return exited_;
}

namespace {

// The parent pid of `pid` (field 4 of /proc/<pid>/stat), or -1.
pid_t parent_of(pid_t pid) {
  const auto st = sys::read_proc_stat(pid);
  return st ? st->ppid : -1;
}

}  // namespace

// An adopted kernel is ended through its launcher, which is not our child: SIGTERM, which it
// forwards to the kernel (into the jail); if it has not reported within 2 s, SIGKILL for it and
// for the kernel's cgroup (what the launcher would have removed), or, unjailed, the kernel's
// process group while its parent is still that launcher.
void KernelProcess::end_adopted() {
  if (poll_exit()) {
    return;
  }
  (void)signal(SIGTERM);
  wait_exit(std::chrono::milliseconds(2000));
  if (exited_) {
    return;
  }
  if (!jailed_ && kernel_pid_ > 0 && parent_of(kernel_pid_) == launcher_pid_) {
    ::kill(-kernel_pid_, SIGKILL);
  }
  ::syscall(SYS_pidfd_send_signal, launcher_pidfd_.get(), SIGKILL, nullptr, 0);
  if (started_ && !started_->cgroup_paths.empty()) {
    // Its destructor kills every process left in it and removes it.
    jail::Cgroup::adopt(
        started_->cgroup_version == "v2" ? jail::CgroupVersion::kV2 : jail::CgroupVersion::kV1,
        started_->cgroup_paths);
  }
  wait_exit(std::chrono::milliseconds(1000));
}

KernelProcess::~KernelProcess() {
  if (adopted_) {
    end_adopted();
  } else if (launcher_pid_ > 0) {
    if (kernel_pid_ > 0 && !poll_exit()) {
      // A jailed kernel's pid is its jail's init: killing it ends the whole pid namespace. An
      // unjailed kernel leads its own process group.
      ::kill(jailed_ ? kernel_pid_ : -kernel_pid_, SIGKILL);
      wait_exit(std::chrono::milliseconds(2000));
    }
    if (!exited_) {
      ::kill(launcher_pid_, SIGKILL);
    }
    int wstatus = 0;
    while (::waitpid(launcher_pid_, &wstatus, 0) < 0 && errno == EINTR) {
    }
  }
  if (work_mounted_) {
    // The launcher mounted a size-capped tmpfs on the work dir (it outlives the kernel so a
    // restart keeps the files); it goes with the runtime dir.
    ::umount2(work_dir_.c_str(), MNT_DETACH);
  }
  if (!runtime_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(runtime_dir_, ec);
  }
}

Result<jail::CgroupStats> KernelProcess::cgroup_stats() const {
  if (!started_ || started_->cgroup_paths.empty()) {
    return make_error(ErrorCode::kNotFound, "no_cgroup", "the kernel has no cgroup of its own");
  }
  return jail::read_cgroup_stats(
      started_->cgroup_version == "v2" ? jail::CgroupVersion::kV2 : jail::CgroupVersion::kV1,
      started_->cgroup_paths);
}

Result<void> KernelProcess::throttle_cpu(bool throttled) {
  if (!started_ || started_->cgroup_paths.empty()) {
    return make_error(ErrorCode::kNotFound, "no_cgroup", "the kernel has no cgroup of its own");
  }
  const auto version =
      started_->cgroup_version == "v2" ? jail::CgroupVersion::kV2 : jail::CgroupVersion::kV1;
  const std::string least = jail::least_cpu_quota(version);
  MutexLock lock(throttle_mu_);
  if (throttled) {
    if (!own_cpu_quota_) {
      CELLGATE_ASSIGN_OR_RETURN(std::string own,
                                jail::read_cpu_quota(version, started_->cgroup_paths));
      if (own != least) {
        own_cpu_quota_ = std::move(own);
      }
    }
    return jail::write_cpu_quota(version, started_->cgroup_paths, least);
  }
  if (!own_cpu_quota_) {
    return ok_result();
  }
  CELLGATE_TRY(jail::write_cpu_quota(version, started_->cgroup_paths, *own_cpu_quota_));
  own_cpu_quota_.reset();
  return ok_result();
}

}  // namespace cellgate::kernel
