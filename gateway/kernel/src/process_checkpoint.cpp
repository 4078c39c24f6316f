// KernelProcess's hibernation: its jail checkpointed by `cellgate-kernel --checkpoint` and
// brought back by `cellgate-kernel --restore` (kernel-launcher/src/restore_mode.cpp), on the
// same runtime dir: the jail spec, the connection dir (its ipc sockets are restored at the same
// paths) and the work dir, whose tmpfs outlives the jail's processes.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <fstream>
#include <sstream>
#include <utility>

#include "cellgate/kernel/process.hpp"
#include "cellgate/kernel/spool.hpp"
#include "cellgate/sys/file.hpp"

namespace cellgate::kernel {
namespace {

using Clock = std::chrono::steady_clock;

// The launcher answers a hold once its SUB socket is closed: milliseconds, unless it is busy
// answering a gateway's read of the spool (bounded by its own reply timeout).
constexpr std::chrono::milliseconds kSpoolHoldTimeout{15000};

Error not_hibernatable(const std::string& why) {
  return make_error(ErrorCode::kFailedPrecondition, "not_hibernatable", why);
}

// Waits for `pid` (our child) and answers its wait status.
int reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// The launcher's last "cellgate-kernel: …" line in the log (what a failed dump said), or "".
std::string last_launcher_line(const std::string& tail) {
  std::istringstream in(tail);
  std::string found;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cellgate-kernel: ", 0) == 0) {
      found = line.substr(17);
    }
  }
  return found;
}

}  // namespace

std::vector<std::string> KernelProcess::launcher_environment() const {
  std::vector<std::string> env;
  for (const auto& [k, v] : launcher_env_) {
    env.push_back(k + "=" + v);
  }
  return env;
}

Result<void> KernelProcess::checkpointable() const {
  if (!jailed_) {
    return not_hibernatable(
        "an unjailed kernel cannot be checkpointed (a checkpoint is of a jail)");
  }
  if (adopted_) {
    return not_hibernatable(
        "this kernel was adopted from a previous gateway, whose launcher is not ours to replace; "
        "restart it to make it hibernatable");
  }
  if (launcher_pid_ <= 0 || kernel_pid_ <= 0 || exited_ || !started_ ||
      started_->cgroup_paths.empty()) {
    return not_hibernatable("the kernel is not running in a jail of its own");
  }
  // A process forked from the zygote runs the cellgate-zygote binary, mapped from outside the
  // jail's mount namespace: CRIU dumps it but cannot map it again at restore.
  std::ifstream procs(started_->cgroup_paths.front() + "/cgroup.procs");
  for (pid_t pid = 0; procs >> pid;) {
    auto exe = sys::read_link("/proc/" + std::to_string(pid) + "/exe");
    if (exe && exe->find("/cellgate-zygote") != std::string::npos) {
      return not_hibernatable(
          "the kernel was forked from the zygote, whose binary lies outside its jail where CRIU "
          "cannot restore it; kernels started cold can hibernate (cellgate serve --no-zygote)");
    }
  }
  return {};
}

Result<JailTarget> KernelProcess::jail_target() const {
  if (!jailed_ || kernel_pid_ <= 0 || exited_ || !started_) {
    return make_error(ErrorCode::kFailedPrecondition, "no_jail",
                      "the kernel is not running in a jail of its own");
  }
  JailTarget t;
  t.launcher_path = launcher_path_;
  t.init_pid = kernel_pid_;
  t.spec_file = runtime_dir_ + "/jail.json";
  t.cgroup_dirs = started_->cgroup_paths;
  t.launcher_env = launcher_environment();
  return t;
}

// `cellgate-kernel --checkpoint` on this kernel's jail; a snapshot (`leave_running`) keeps it.
Result<void> KernelProcess::dump(const std::string& image_dir, bool leave_running, bool compress) {
  CELLGATE_TRY(checkpointable());
  std::vector<std::string> args = {
      launcher_path_,  "--checkpoint", std::to_string(kernel_pid_), "--images",
      image_dir,       "--spec",       runtime_dir_ + "/jail.json", "--connection-file",
      connection_file_};
  if (leave_running) {
    args.emplace_back("--leave-running");
  }
  if (!compress) {
    args.emplace_back("--no-compress");
  }
  // The launcher's iopub spool is a unix stream into the jail, which CRIU cannot dump: it lets
  // go of the kernel's iopub for the dump, and takes it up again when the jail runs on.
  const std::string spool = spool_socket();
  bool held = false;
  if (!spool.empty()) {
    auto hold = hold_spool(spool, true, kSpoolHoldTimeout);
    held = hold && *hold;
    if (!held) {
      spdlog::warn("kernel {}: its launcher's spool was not held for the dump: {}", kernel_pid_,
                   hold ? "it could not close its socket" : hold.error().message);
    }
  }
  auto let_go = [&] {
    if (held) {
      if (auto go = hold_spool(spool, false, kSpoolHoldTimeout); !go || *go) {
        spdlog::warn(
            "kernel {}: its launcher's spool did not take up iopub again after the "
            "dump; output published while no gateway runs may be lost",
            kernel_pid_);
      }
    }
  };
  CELLGATE_ASSIGN_OR_RETURN(auto pipe, status_pipe());
  auto& [read_end, write_end] = pipe;
  auto dumper =
      spawn_with_status_fd(std::move(args), launcher_environment(), write_end.get(), log_file_);
  if (!dumper) {
    let_go();
    return std::move(dumper).error();
  }
  write_end.reset();
  const int status = reap(*dumper);
  if (leave_running || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    let_go();  // the jail runs on
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string why = last_launcher_line(log_tail(4000));
    return make_error(ErrorCode::kInternal, "checkpoint_failed",
                      std::string("the ") + (leave_running ? "snapshot" : "checkpoint") +
                          " of the kernel's jail failed; the kernel runs on: " +
                          (why.empty() ? "see " + log_file_ : why));
  }
  return {};
}

Result<void> KernelProcess::snapshot(const std::string& image_dir, bool compress) {
  return dump(image_dir, /*leave_running=*/true, compress);
}

Result<void> KernelProcess::set_key(const std::string& key) {
  if (key.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "set_key", "a connection key cannot be empty");
  }
  ConnectionInfo next = connection_;
  next.key = key;
  CELLGATE_TRY(next.save(connection_file_));  // atomic: an adopting gateway reads one or other
  connection_ = std::move(next);
  return {};
}

Result<void> KernelProcess::checkpoint(const std::string& image_dir) {
  CELLGATE_TRY(dump(image_dir, /*leave_running=*/false));
  // The jail's pid 1 was killed by the dump: its launcher reports so and removes the cgroup.
  wait_exit(std::chrono::seconds(10));
  if (!exited_) {
    ::kill(launcher_pid_, SIGKILL);
  }
  reap(launcher_pid_);
  launcher_pid_ = -1;
  kernel_pid_ = -1;
  status_fd_.reset();
  status_buffer_.clear();
  started_.reset();
  exited_.reset();
  return {};
}

Result<void> KernelProcess::restore(const std::string& image_dir,
                                    std::chrono::milliseconds timeout) {
  if (!jailed_ || adopted_ || launcher_pid_ > 0) {
    return not_hibernatable("only a checkpointed jailed kernel of this gateway can be restored");
  }
  std::vector<std::string> args = {launcher_path_,   "--status-fd", "3",
                                   "--status-file",  status_file_,  "--connection-file",
                                   connection_file_, "--spec",      runtime_dir_ + "/jail.json",
                                   "--restore",      image_dir,     "--spool-socket",
                                   spool_socket()};
  if (die_with_parent_) {
    args.emplace_back("--die-with-parent");
  }
  CELLGATE_ASSIGN_OR_RETURN(auto pipe, status_pipe());
  auto& [read_end, write_end] = pipe;
  CELLGATE_ASSIGN_OR_RETURN(
      launcher_pid_,
      spawn_with_status_fd(std::move(args), launcher_environment(), write_end.get(), log_file_));
  write_end.reset();
  ::fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
  status_fd_ = std::move(read_end);
  const auto deadline = Clock::now() + timeout;
  while (!started_ && !exited_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      // The destructor ends the launcher and whatever it restored.
      return make_error(ErrorCode::kDeadlineExceeded, "restore_timeout",
                        "the restoring launcher did not report within " +
                            std::to_string(timeout.count()) + " ms");
    }
    read_status(static_cast<int>(left.count()));
  }
  if (!started_) {
    return make_error(ErrorCode::kInternal, "restore_failed",
                      "the kernel could not be restored: " + exited_->message);
  }
  kernel_pid_ = started_->pid;
  return {};
}

}  // namespace cellgate::kernel
