// KernelProcess: one kernel started through the cellgate-kernel launcher.
//
// start() makes a private runtime directory (0700) with a fresh ipc connection file and a work
// dir, posix_spawns `cellgate-kernel --status-fd 3 -- <kernelspec argv>` with exactly the given
// environment, and waits for the launcher's "started" line (or its setup_error). The destructor
// kills the kernel, reaps the launcher and removes the runtime directory.
//
//   auto kernel = KernelProcess::start({.spec = *find_kernelspec("python3")});
//   auto client = KernelClient::connect(kernel.value()->connection());
//   kernel.value()->signal(SIGINT);                 // interrupt
//   if (auto ended = kernel.value()->poll_exit()) { ... ended->reason ... }
//
// Thread-safety: not thread-safe; one owner.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/spec.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/launcher/status.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::kernel {

struct LaunchRequest {
  KernelSpec spec;
  // The registry's id for the kernel ("" outside one): a broker names its work dir after it.
  std::string kernel_id;
  // Path of cellgate-kernel; "" means the one beside the running binary.
  std::string launcher_path;
  // Parent of the per-kernel runtime directory; "" means $TMPDIR or /tmp.
  std::string runtime_parent;
  // An existing work dir to use (and keep: a restarted kernel finds its files again). The caller
  // owns it, and the tmpfs the launcher mounts on it. "" means a fresh one in the runtime dir,
  // removed with it.
  std::string work_dir;
  // The kernel's entire environment. Nothing else from the caller's environment is passed.
  // For a jailed kernel it becomes the spec's env (HOME is the jail's work dir).
  std::map<std::string, std::string> env;
  // The jail. nullopt runs the kernel unjailed, which must be the operator's explicit choice.
  // The spec's work_dir is set to the runtime dir's work/ (a size-capped tmpfs) when empty.
  std::optional<jail::JailSpec> jail;
  // Jailed only: the launcher's own environment, which the kernel must never see (tests put a
  // canary here). Empty by default.
  std::map<std::string, std::string> launcher_env;
  bool die_with_parent = false;
  // Jailed only: a ready zygote's socket (zygote.hpp); a python3 ipykernel is then forked from
  // it. "" (or no zygote answering, or another kernel): started cold.
  std::string zygote_socket;
  // Files written into the connection dir before the launch (name → content, mode 0644): the
  // kernel reads them at /run/kernel/<name> in the jail, beside its connection file unjailed.
  // Nothing secret: the kernel owns that dir. The display formatters' module travels this way.
  std::map<std::string, std::string> conn_files;
  // "ipc" (sockets in the runtime dir; what jailed kernels use) or "tcp" (loopback ports).
  std::string transport = "ipc";
  // Jailed only: a copy of a kernel (a fork, a start from a snapshot). The launcher restores
  // this image (a snapshot's, made by KernelProcess::snapshot) under this kernel's own uid,
  // cgroup and dirs instead of running the kernelspec's argv; `key` is the connection key the
  // image's kernel holds in memory.
  std::string restore_image;
  std::string key;
  std::chrono::milliseconds start_timeout{10000};
};

// The environment a kernel gets when nobody asks for more: a PATH, a UTF-8 locale, unbuffered
// Python, ipykernel's debugger quiet. Unjailed kernels also get HOME at their work dir and a
// matplotlib cache shared by all kernels; jailed ones get HOME=/home/kernel from the launcher.
std::map<std::string, std::string> default_kernel_env(const std::string& work_dir, bool jailed);

// The directory holding the running executable (/proc/self/exe).
std::string executable_dir();

// posix_spawns `argv` (argv[0] is the path) with exactly `env`, a status pipe whose write end
// becomes fd 3, stdin from /dev/null, stdout and stderr appended to `log_file`, no other
// descriptor of ours, an empty signal mask and default dispositions. Returns the child's pid; the
// caller reads the pipe's other end and reaps the child. Used for launchers and the zygote.
Result<pid_t> spawn_with_status_fd(std::vector<std::string> argv, std::vector<std::string> env,
                                   int status_write_fd, const std::string& log_file);

// A pipe for spawn_with_status_fd: {read end, write end}, both close-on-exec, the write end above
// fd 3 (its dup2 onto fd 3 must not be a no-op, which would keep FD_CLOEXEC).
Result<std::pair<UniqueFd, UniqueFd>> status_pipe();

class KernelProcess : public KernelProcessHandle {
 public:
  static Result<std::unique_ptr<KernelProcess>> start(LaunchRequest request);
  // A kernel a previous gateway started (its state record's facts): kNotFound when its launcher
  // is gone or the pid names another process now. It is then supervised through a pidfd (it is
  // not our child): signals with pidfd_send_signal, its end from the launcher's status file.
  static Result<std::unique_ptr<KernelProcess>> adopt(const AdoptionFacts& facts);
  // A kernel a previous gateway hibernated (checkpointed, no process left): a handle in the state
  // checkpoint() leaves, whose restore() brings it back through `launcher_path` ("": the
  // cellgate-kernel beside the running binary) from its recorded runtime dir. Refused when the
  // facts are not of a jailed kernel or its runtime dir is gone.
  static Result<std::unique_ptr<KernelProcess>> hibernated_from(const AdoptionFacts& facts,
                                                                const std::string& launcher_path);
  ~KernelProcess() override;
  KernelProcess(const KernelProcess&) = delete;
  KernelProcess& operator=(const KernelProcess&) = delete;

  const ConnectionInfo& connection() const override { return connection_; }
  const std::string& connection_file() const override { return connection_file_; }
  const std::string& work_dir() const { return work_dir_; }
  // The kernel's and the launcher's own stdout and stderr (not the cells' output, which travels
  // on iopub): start-up banners, crashes, C-level writes to fd 1 and 2.
  const std::string& log_file() const { return log_file_; }
  // The last `max_bytes` of the log, for error messages.
  std::string log_tail(std::size_t max_bytes = 2000) const override;
  pid_t pid() const override { return kernel_pid_; }

  bool jailed() const override { return jailed_; }
  // The kernel cgroup's figures (CPU used, memory now and at peak); kNotFound for an unjailed
  // kernel or once the cgroup is gone.
  Result<jail::CgroupStats> cgroup_stats() const override;
  Result<void> throttle_cpu(bool throttled) override;
  // Sends a signal to the kernel (SIGINT interrupts an ipykernel), through the launcher, which
  // forwards it (into the jail).
  Result<void> signal(int sig) override;
  // The launcher's "exited" report once the kernel has ended; nullopt while it runs.
  std::optional<launcher::StatusEvent> poll_exit() override;
  // Waits up to `timeout` for the kernel to end.
  std::optional<launcher::StatusEvent> wait_exit(std::chrono::milliseconds timeout) override;
  std::optional<AdoptionFacts> adoption_facts() const override;
  std::string spool_socket() const override;
  bool from_zygote() const override { return started_ && started_->zygote; }
  void detach() override;
  // process_checkpoint.cpp: `cellgate-kernel --checkpoint` and `--restore` on this kernel's
  // runtime dir (its jail spec, connection dir and work dir are reused as they are).
  Result<void> checkpointable() const override;
  Result<JailTarget> jail_target() const override;
  Result<void> checkpoint(const std::string& image_dir) override;
  Result<void> snapshot(const std::string& image_dir, bool compress) override;
  Result<void> restore(const std::string& image_dir, std::chrono::milliseconds timeout) override;
  Result<void> set_key(const std::string& key) override;

 private:
  KernelProcess() = default;
  Result<void> dump(const std::string& image_dir, bool leave_running, bool compress = true);
  void read_status(int timeout_ms);
  // Adopted: waits up to `timeout_ms` for the launcher to end, then takes its report from the
  // status file.
  void watch_adopted(int timeout_ms);
  // The runtime dir, status file, log, work dir and connection a previous gateway recorded.
  void take_files(const AdoptionFacts& facts);
  void parse_status_lines();
  void end_adopted();
  std::vector<std::string> launcher_environment() const;  // launcher_env_ as KEY=VALUE

  ConnectionInfo connection_;
  std::string launcher_path_;
  std::map<std::string, std::string> launcher_env_;
  bool die_with_parent_ = false;
  std::string runtime_dir_;
  std::string connection_file_;
  std::string work_dir_;
  std::string log_file_;
  bool jailed_ = false;
  bool work_mounted_ = false;
  pid_t launcher_pid_ = -1;
  std::string status_file_;
  bool adopted_ = false;
  UniqueFd launcher_pidfd_;  // adopted only
  pid_t kernel_pid_ = -1;
  UniqueFd status_fd_;
  std::string status_buffer_;
  std::optional<launcher::StatusEvent> started_;
  std::optional<launcher::StatusEvent> exited_;
  Mutex throttle_mu_;
  // The cgroup's own CPU limit while throttled, as its file said it.
  std::optional<std::string> own_cpu_quota_ CELLGATE_GUARDED_BY(throttle_mu_);
};

}  // namespace cellgate::kernel
