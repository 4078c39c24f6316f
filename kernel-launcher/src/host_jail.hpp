// Internal: the host side of one jailed launch, in both modes (exec and zygote).
//
//   auto jail = HostJail::build(options);          // the named steps below, in order
//   if (!jail) { report setup_error; return 127; }
//   return zygote_or_exec(**jail);                 // exec_mode.cpp, zygote_client.cpp
//
// build() is a checklist, nsjail's containProc in shape: read the spec → choose the kernel's
// uid/gid → its cgroup (a limit the host cannot enforce stops us before anything else happens)
// → the work dir's tmpfs → the connection dir (the jail has no network: ipc sockets in a dir
// bound into it) → the staging dir for the new root → the kernel's environment → the forwarded
// signals blocked. Each step returns a Result; the first error stops the build.
//
// What it made is undone by its destructor: the cgroup always (its destructor kills what is left
// in it and removes it; finish() does so before the last report). The work dir's tmpfs and the
// connection dir it created stay once a kernel started (the gateway keeps the work dir across
// restarts and unmounts it itself); a launch that fails before its kernel started takes them down
// again. The blocked signal mask stays: the launcher returns right after, and a signal left
// pending must not kill it on the way out.
//
// Thread-safety: one launcher thread.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/spec.hpp"
#include "cellgate/launcher/launcher.hpp"
#include "cellgate/result.hpp"
#include "report.hpp"

namespace cellgate::launcher {

// The kernel's connection file as the jail sees it.
struct Connection {
  std::string conn_dir;   // host directory bound at kJailConnDir
  std::string jail_file;  // kJailConnDir/kernel.json
  std::string host_file;  // the file the gateway should use (reported when it changed)
  bool rewritten_from_tcp = false;
  std::string iopub_endpoint;  // on the host: ipc://<conn_dir>/<prefix>-<iopub_port>
};

class HostJail {
 public:
  // Runs the steps for `options` (whose status fd and copy `status` reports on).
  static Result<std::unique_ptr<HostJail>> build(const LaunchOptions& options, StatusSink& status);

  ~HostJail();
  HostJail(const HostJail&) = delete;
  HostJail& operator=(const HostJail&) = delete;

  const jail::JailSpec& spec() const { return spec_; }
  uid_t uid() const { return uid_; }
  gid_t gid() const { return gid_; }
  const jail::RootPaths& paths() const { return paths_; }
  // The kernel cgroup's leaf name.
  const std::string& cgroup_name() const { return name_; }
  // The kernel's argv, the host connection file's path replaced by the jail's.
  const std::vector<std::string>& argv() const { return argv_; }
  const std::vector<std::string>& env() const { return env_; }
  // The forwarded signals and SIGCHLD (init::reaper_signals()), blocked by build().
  const sigset_t& wait_set() const { return wait_set_; }
  const sigset_t& original_mask() const { return original_mask_; }
  StatusSink& status() { return status_; }
  // The spool of the kernel's iopub (spool_service.hpp), once it has started; null without
  // --spool-socket or a connection file, or when it could not start.
  std::unique_ptr<class SpoolService> start_spool() const;

  // Puts `pid` (the jail's pid 1) into the kernel's cgroup; ok without one.
  Result<void> add_to_cgroup(pid_t pid);
  // {"event":"started"}: the jail's pid 1, the connection file when it was rewritten, the
  // cgroup. From here on the work dir and the connection dir are the kernel's.
  void report_started(pid_t pid, bool from_zygote = false);
  // {"event":"exited", "reason":"setup_error"}; returns the launcher's exit code, 127.
  int fail(const std::string& message);
  // Reports how the kernel ended (its wait status, the cgroup's figures) after removing the
  // cgroup. Returns the launcher's exit code.
  int finish(pid_t init, int wait_status, bool timed_out);

 private:
  HostJail(const LaunchOptions& options, StatusSink& status);

  Result<void> read_spec();
  Result<void> choose_identity();
  Result<void> create_cgroup();
  Result<void> mount_work_dir();
  Result<void> prepare_connection();
  Result<void> find_staging();
  void build_env();
  void block_signals();

  const LaunchOptions& options_;
  StatusSink& status_;
  jail::JailSpec spec_;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  std::string name_;
  std::unique_ptr<jail::Cgroup> cgroup_;
  std::optional<Connection> conn_;
  jail::RootPaths paths_;
  std::vector<std::string> argv_;
  std::vector<std::string> env_;
  sigset_t wait_set_{};
  sigset_t original_mask_{};
  // What only a kernel that started keeps, undone in reverse order unless report_started() ran.
  std::vector<std::function<void()>> undo_before_start_;
};

// The kernel's environment (KEY=VALUE): the spec's env, HOME at the work dir, the CPU-count hints
// for thread pools. Also what a command run in its jail (exec_into.cpp) starts from.
std::vector<std::string> kernel_environment(const jail::JailSpec& spec);

// The kernel's uid and gid when the spec names them (a gateway's kernels) or the namespace maps
// only uid 0 (rootless); nullopt otherwise (the launcher then derives them from its pid).
std::optional<std::pair<uid_t, gid_t>> spec_identity(const jail::JailSpec& spec);

// argv[0] resolved against the spec's PATH (execve does not search).
std::string resolve_program(const std::string& program, const jail::JailSpec& spec);

// The deadline of the spec's time limit, from now, as ns on CLOCK_MONOTONIC; nullopt: none.
std::optional<long long> time_limit_deadline(const jail::JailSpec& spec);
// ns left until `deadline` (CLOCK_MONOTONIC); <= 0 once it passed.
long long ns_until(long long deadline);

namespace init {
class InitReport;
}

// Once the jail's pid 1 (`init`, our child) runs and reported ready: forwards the signals we get
// to it, enforces the time limit, waits for it to end and reports how (HostJail::finish).
// Returns the launcher's exit code. Exec mode and a restored checkpoint (restore_mode.cpp).
int supervise_init(HostJail& jail, pid_t init, init::InitReport& report);

// The two ways to run the kernel in a built HostJail; each returns the launcher's exit code.
// exec_mode.cpp: the launcher clones init itself and init execs the kernel.
int run_exec_kernel(HostJail& jail);
// zygote_client.cpp: the zygote at `socket` clones init and forks the kernel from its Python.
// nullopt: the zygote cannot serve this kernel or none answered (the caller starts it cold).
std::optional<int> run_zygote_kernel(HostJail& jail, const std::string& socket);

}  // namespace cellgate::launcher
