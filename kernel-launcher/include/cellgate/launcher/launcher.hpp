// The kernel launcher's exec mode: start one kernel process, supervise it, and report on the
// status fd (see status.hpp) when it started and why it ended.
//
//   cellgate-kernel --status-fd 3 --cwd /run/k1/work -- /usr/bin/python3 -m ipykernel_launcher -f …
//
// The kernel gets the launcher's environment (the gateway spawns the launcher with exactly the
// kernel's environment), its own process group, and no inherited file descriptor above 2.
// SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher are forwarded to the kernel. The jail
// issue adds the jail steps between fork and exec.
//
// Thread-safety: the launcher is single-threaded; run_exec_mode() is called once from main().
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace cellgate::launcher {

struct LaunchOptions {
  std::vector<std::string> argv;  // the kernel's argv; argv[0] is a path or a name on PATH
  int status_fd = -1;             // -1: no status reports
  // The same status lines appended here too (the kernel's runtime dir): the pipe's reader, the
  // gateway, may be gone when the kernel ends, and a gateway that adopts the kernel reads them.
  std::string status_file;
  std::string cwd;  // "" : inherit (unjailed only; a jailed kernel starts in its work dir)
  bool die_with_parent = false;  // SIGKILL the kernel when the launcher's parent dies
  bool jail = true;              // false: run unjailed (an explicit operator choice)
  std::string spec_path;         // JailSpec JSON; "": the defaults
  // The kernel's connection file on the host. In the jail it becomes kJailConnDir/kernel.json
  // (ipc endpoints) and every argv element equal to this path is replaced by that.
  std::string connection_file;
  // Jailed only: the zygote's socket (zygote.hpp). A python3 ipykernel is then forked from the
  // zygote instead of started cold; any other kernel, or no zygote answering, starts cold.
  std::string zygote_socket;
  // Jailed only (--spool-socket): where the launcher answers a gateway asking for the kernel's
  // iopub messages it spooled (src/spool.hpp: the last kSpoolBudgetBytes of them, kept while no
  // gateway listens). "": no spool.
  std::string spool_socket;
  // run_restore_mode() only: the image dir a checkpoint was dumped to (checkpoint.hpp).
  std::string restore_dir;
  // run_checkpoint() only (--leave-running): a snapshot; the jail runs on after the dump and
  // its work dir's files are saved in the image.
  bool leave_running = false;
  bool no_compress = false;  // run_checkpoint() only (--no-compress): no zstd on the pages
  // run_exec_into() only (--exec-into PID): the jail's pid 1, the kernel's cgroup dirs
  // (--cgroup, one per hierarchy), the command's working directory in the jail (--cwd), its
  // environment on top of the kernel's (--env K=V), a pty (--pty COLSxROWS) and the control
  // socket to the gateway (--control-fd).
  pid_t exec_into = -1;
  std::vector<std::string> cgroup_dirs;
  std::vector<std::string> exec_env;
  std::string pty;
  int control_fd = -1;
};

// Runs the kernel to completion. Returns the launcher's exit code: the kernel's exit code,
// 128 + signal if it was killed, or 127 when it could not be started.
int run_exec_mode(const LaunchOptions& options);

// The jailed variant (src/jailed.cpp): the same contract, with the jail's steps between fork
// and exec: the host side built as a HostJail (src/host_jail.hpp), then the kernel from the
// zygote (src/zygote_client.cpp) or cold (src/exec_mode.cpp), pid 1 the same in both
// (src/init.hpp). A limit that cannot be enforced ends it with setup_error before the kernel runs.
int run_jailed_mode(const LaunchOptions& options);

// Restores the jail checkpointed in options.restore_dir (src/restore_mode.cpp) and supervises it
// as run_jailed_mode() does a launched one: the same status events, the same exit codes. The
// spec is the one the jail was launched with (its name is its cgroup's) and the connection file
// the same, or (a copy: a fork, a start from a snapshot) a new kernel's, whose uid, gid and
// cgroup the image is rebased onto (checkpoint/rebase.hpp); the kernel's argv is not needed.
int run_restore_mode(const LaunchOptions& options);

// Checkpoints the running jail whose pid 1 is `init_pid` into `image_dir` (which must not
// exist) and ends it; `options` are the ones it was launched with (spec and connection file say
// which binds it has). Prints {"dump_ms":…,"compress_ms":…,"image_bytes":…} on stdout. Returns
// 0, or 1 with the reason on stderr (the jail then runs on).
int run_checkpoint(pid_t init_pid, const std::string& image_dir, const LaunchOptions& options);

// Runs `options.argv` inside the running jail whose pid 1 is options.exec_into
// (src/exec_into.cpp; jail/enter.hpp): its namespaces, cgroup, uid, Landlock, seccomp and
// rlimits, the kernel's environment plus options.exec_env. Reports on the control socket
// (a SOCK_SEQPACKET, options.control_fd), one status line per message: {"event":"started",
// "pid":<the command's pid in the jail>} (with a pty, its master attached), then
// {"event":"exited",…}; it takes {"signal":N} messages, and kills the command when the socket
// closes. stdin, stdout and stderr are the command's own. Returns 0, or 127 on a setup error.
int run_exec_into(const LaunchOptions& options);

// Prints what the host supports (cgroups, user namespaces, Landlock, seccomp) as one line.
int run_probe_host();

}  // namespace cellgate::launcher
