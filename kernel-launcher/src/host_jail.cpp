// The host side of a jailed launch: see host_jail.hpp.
#include "host_jail.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cellgate/jail/userns.hpp"
#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/unique_fd.hpp"
#include "init.hpp"
#include "spool_service.hpp"

namespace cellgate::launcher {
namespace {

using nlohmann::json;

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

// Reads the host connection file and writes the jail's copy: same key and port numbers,
// transport ipc, sockets in the connection dir. `made_dir` is set when it created that dir.
Result<Connection> prepare_connection_dir(const std::string& connection_file,
                                          const std::string& name, uid_t uid, gid_t gid,
                                          std::optional<gid_t> access_gid, bool* made_dir) {
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
    if (::mkdir(c.conn_dir.c_str(), 0700) == 0) {
      *made_dir = true;
    } else if (errno != EEXIST) {
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
  if (auto port = j.find("iopub_port"); port != j.end() && port->is_number_integer()) {
    c.iopub_endpoint =
        "ipc://" + c.conn_dir + "/" + prefix + "-" + std::to_string(port->get<long long>());
  }
  json inside = j;
  inside["transport"] = "ipc";
  inside["ip"] = std::string(jail::kJailConnDir) + "/" + prefix;
  c.jail_file = std::string(jail::kJailConnDir) + "/kernel.json";
  CELLGATE_TRY(write_private_file(c.conn_dir + "/kernel.json", inside.dump(1), uid, gid));
  return c;
}

long long monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec;
}

}  // namespace

std::string resolve_program(const std::string& program, const jail::JailSpec& spec) {
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

std::optional<long long> time_limit_deadline(const jail::JailSpec& spec) {
  if (spec.time_limit_seconds <= 0) {
    return std::nullopt;
  }
  return monotonic_ns() + static_cast<long long>(spec.time_limit_seconds * 1e9);
}

long long ns_until(long long deadline) {
  return deadline - monotonic_ns();
}

// ---- the steps ----

HostJail::HostJail(const LaunchOptions& options, StatusSink& status)
    : options_(options), status_(status), argv_(options.argv) {}

HostJail::~HostJail() {
  for (auto it = undo_before_start_.rbegin(); it != undo_before_start_.rend(); ++it) {
    (*it)();
  }
  // cgroup_'s destructor kills what is left in it and removes it.
}

Result<std::unique_ptr<HostJail>> HostJail::build(const LaunchOptions& options,
                                                  StatusSink& status) {
  std::unique_ptr<HostJail> j(new HostJail(options, status));
  CELLGATE_TRY(j->read_spec());
  CELLGATE_TRY(j->choose_identity());
  CELLGATE_TRY(j->create_cgroup());
  CELLGATE_TRY(j->mount_work_dir());
  CELLGATE_TRY(j->prepare_connection());
  CELLGATE_TRY(j->find_staging());
  j->build_env();
  j->block_signals();
  return j;
}

Result<void> HostJail::read_spec() {
  if (options_.spec_path.empty()) {
    return {};
  }
  CELLGATE_ASSIGN_OR_RETURN(spec_, load_spec(options_.spec_path));
  return {};
}

// The kernel's uid and gid, and its name (the cgroup's, the connection dir's).
Result<void> HostJail::choose_identity() {
  const pid_t self = ::getpid();
  uid_ = spec_.uid.value_or(jail::kUidBase + static_cast<uid_t>(self));
  gid_ = spec_.gid.value_or(static_cast<gid_t>(uid_));
  if (jail::in_single_uid_user_namespace()) {
    // Rootless (userns.hpp): the namespace maps one uid, 0, the user outside; kernels run as it.
    uid_ = 0;
    gid_ = 0;
  } else if (const auto range = jail::kernel_uid_range(); range.count > 0 && !spec_.uid) {
    // Rootless with a subordinate range: a uid of it, chosen as kUidBase + pid is as root.
    uid_ = range.first + static_cast<uid_t>(self) % range.count;
    gid_ = spec_.gid.value_or(static_cast<gid_t>(uid_));
  }
  if (spec_.access_gid) {
    // Shared with an unprivileged gateway: what the kernel makes is that group's.
    gid_ = *spec_.access_gid;
  }
  name_ = spec_.name.empty() ? "k" + std::to_string(self) : spec_.name;
  return {};
}

// First of what the launch makes: a limit the host cannot enforce stops it before anything else.
Result<void> HostJail::create_cgroup() {
  std::vector<std::string> warnings;
  auto host = jail::CgroupHost::detect_system(spec_.cgroup_parent);
  const bool all_optional =
      spec_.optional.count("memory") && spec_.optional.count("pids") && spec_.optional.count("cpu");
  if (!host && !all_optional) {
    return make_error(ErrorCode::kFailedPrecondition, "cgroup",
                      "no usable cgroups on this host, so the memory, pids and cpu limits cannot "
                      "be enforced: " +
                          host.error().message);
  }
  if (host) {
    jail::CgroupLimits limits;
    limits.memory_bytes = spec_.memory_bytes;
    limits.swap_off = true;
    limits.pids = spec_.pids;
    limits.cpus = spec_.cpus;
    auto created = host->create(spec_.cgroup_group, name_, limits, spec_.optional, &warnings);
    if (created) {
      cgroup_ = std::move(created).value();
    } else if (all_optional) {
      // No cgroup of our own here (an ordinary user on cgroup v1): every limit it would hold
      // was made optional by the operator.
      warnings.push_back("no cgroup for this kernel, so no memory, pids or cpu limit: " +
                         created.error().message);
    } else {
      return created.error();
    }
  }
  for (const auto& w : warnings) {
    std::cerr << "cellgate-kernel: warning: " << w << "\n";
  }
  return {};
}

Result<void> HostJail::mount_work_dir() {
  if (spec_.work_dir.empty()) {
    return {};
  }
  auto mounted =
      jail::mount_work_tmpfs(spec_.work_dir, spec_.work_bytes, uid_, gid_, spec_.access_gid);
  if (!mounted) {
    if (spec_.optional.count("work_size") == 0) {
      return make_error(ErrorCode::kFailedPrecondition, "work_dir",
                        "the work dir's size cap needs a tmpfs: " + mounted.error().message);
    }
    std::cerr << "cellgate-kernel: warning: work dir not size-capped: " << mounted.error().message
              << "\n";
  } else if (*mounted) {
    undo_before_start_.push_back([dir = spec_.work_dir] { ::umount2(dir.c_str(), MNT_DETACH); });
  }
  if (::chown(spec_.work_dir.c_str(), uid_, gid_) != 0 ||
      (spec_.access_gid && ::chmod(spec_.work_dir.c_str(), 0770) != 0)) {
    return errno_error(ErrorCode::kInternal, "", "chown('" + spec_.work_dir + "')", errno);
  }
  return {};
}

// Without a connection file the program is not a kernel (a probe in tests): no connection dir.
Result<void> HostJail::prepare_connection() {
  if (options_.connection_file.empty()) {
    return {};
  }
  bool made_dir = false;
  auto prepared = prepare_connection_dir(options_.connection_file, name_, uid_, gid_,
                                         spec_.access_gid, &made_dir);
  if (made_dir) {
    const std::string dir = dirname_of(options_.connection_file) + "/" + name_ + ".conn";
    undo_before_start_.push_back([dir] {
      for (const char* file : {"/kernel.json", "/host-connection.json"}) {
        ::unlink((dir + file).c_str());
      }
      ::rmdir(dir.c_str());  // fails, harmlessly, if anything else is in it
    });
  }
  if (!prepared) {
    return prepared.error();
  }
  conn_ = std::move(prepared).value();
  for (auto& a : argv_) {
    if (a == options_.connection_file) {
      a = conn_->jail_file;
    }
  }
  return {};
}

Result<void> HostJail::find_staging() {
  CELLGATE_ASSIGN_OR_RETURN(paths_.staging, jail::staging_dir());
  paths_.conn_dir = conn_ ? conn_->conn_dir : "";
  paths_.work_dir = spec_.work_dir;
  // Exec mode's pid 1 execs the static reaper built beside us (exec_mode.cpp) from inside the
  // jail; without one it reaps in place, as before, and cannot be checkpointed.
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string reaper = self.parent_path().string() + "/cellgate-reaper";
  if (!ec && ::access(reaper.c_str(), X_OK) == 0) {
    paths_.init_program = reaper;
  }
  return {};
}

std::vector<std::string> kernel_environment(const jail::JailSpec& spec) {
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
  out.reserve(env.size());
  for (const auto& [k, v] : env) {
    out.push_back(k + "=" + v);
  }
  return out;
}

std::optional<std::pair<uid_t, gid_t>> spec_identity(const jail::JailSpec& spec) {
  if (jail::in_single_uid_user_namespace()) {
    return std::make_pair(uid_t{0}, gid_t{0});
  }
  if (!spec.uid) {
    return std::nullopt;
  }
  const gid_t gid = spec.access_gid ? *spec.access_gid : spec.gid.value_or(*spec.uid);
  return std::make_pair(*spec.uid, gid);
}

void HostJail::build_env() {
  env_ = kernel_environment(spec_);
}

// The forwarded signals and SIGCHLD, blocked from here on: sigwaitinfo/signalfd pick them up,
// and the jail's pid 1 inherits them blocked.
void HostJail::block_signals() {
  wait_set_ = init::reaper_signals();
  ::pthread_sigmask(SIG_BLOCK, &wait_set_, &original_mask_);
}

// ---- after the build ----

Result<void> HostJail::add_to_cgroup(pid_t pid) {
  if (!cgroup_) {
    return {};
  }
  return cgroup_->add_process(pid);
}

void HostJail::report_started(pid_t pid, bool from_zygote) {
  undo_before_start_.clear();  // the work dir and the connection dir are the kernel's now
  StatusEvent started;
  started.kind = StatusEvent::Kind::kStarted;
  started.pid = pid;
  started.zygote = from_zygote;
  if (conn_ && conn_->rewritten_from_tcp) {
    started.connection_file = conn_->host_file;
  }
  if (cgroup_) {
    started.cgroup_paths = cgroup_->paths();
    started.cgroup_version = cgroup_->version() == jail::CgroupVersion::kV1 ? "v1" : "v2";
  }
  status_.report(started);
}

std::unique_ptr<SpoolService> HostJail::start_spool() const {
  if (!conn_) {
    return nullptr;
  }
  return SpoolService::start(conn_->iopub_endpoint, options_.spool_socket, spec_.access_gid);
}

int HostJail::fail(const std::string& message) {
  status_.report(setup_error(message));
  return 127;
}

int HostJail::finish(pid_t init, int status, bool timed_out) {
  StatusEvent exited;
  exited.kind = StatusEvent::Kind::kExited;
  exited.pid = init;
  jail::CgroupStats stats;
  if (cgroup_) {
    if (auto s = cgroup_->stats(); s) {
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
                       std::to_string(spec_.time_limit_seconds) + " s";
    } else if (exited.signal == SIGKILL && stats.oom_kills > 0) {
      exited.reason = ExitReason::kOom;
      exited.message =
          "killed by the memory limit of " + std::to_string(spec_.memory_bytes) + " bytes";
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
  cgroup_.reset();  // kills anything left and removes the cgroup, before the last report
  status_.report(exited);
  return exit_code;
}

}  // namespace cellgate::launcher
