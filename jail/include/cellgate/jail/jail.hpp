// The jail's steps. Each is a named function returning a Result whose message names the syscall
// that failed and its arguments; run_steps() applies a list in order and stops at the first
// failure, prefixing its name — nsjail's containProc as a checklist.
//
// The order is written once, in contain_init() and contain_kernel() (src/pipeline.cpp), and both
// ways a kernel starts use it: exec mode (kernel-launcher/src/jailed.cpp) and the zygote
// (kernel-launcher/src/zygote_server.cpp):
//   host, as root:   cgroup created and the child added            (cgroup.hpp)
//   pid 1 of new mount, pid, net, ipc, uts namespaces (clone_jailed(), or the zygote's clone),
//   contain_init():
//     "session" → "cgroup namespace" → "root filesystem" → "hostname"
//     → "loopback network" (only for a spec with loopback_network)
//   the kernel, forked by pid 1, just before execve (or before the zygote's Python runs it),
//   contain_kernel():
//     "session" → "work dir" → "rlimits" → "cpu affinity" → "credentials" → "no_new_privs"
//     → "landlock" (landlock.hpp) → "file descriptors" → "seccomp"
//
//   CELLGATE_TRY(jail::contain_init(spec, paths, uid, gid));                      // in pid 1
//   CELLGATE_TRY(jail::contain_kernel(spec, uid, gid,                              // in the kernel
//                                     [&] { return jail::close_inherited_fds(err_fd); }));
//
// Thread-safety: these change the calling process; call them from a single-threaded process.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/jail/spec.hpp"
#include "cellgate/result.hpp"

namespace cellgate::jail {

struct Step {
  const char* name;
  std::function<Result<void>()> run;
};

// Runs the steps in order; the first failure is returned as "<step>: <message>".
Result<void> run_steps(const std::vector<Step>& steps);

// clone(2) into new mount, pid, net, ipc and uts namespaces, fork-style (no new stack): returns
// the child's pid in the parent and 0 in the child, which is pid 1 of its pid namespace.
Result<pid_t> clone_jailed();

// Where pid 1's own program is bound in the jail (RootPaths::init_program).
inline constexpr const char* kJailInitProgram = "/run/init";

struct RootPaths {
  std::string staging;   // an empty root-owned directory to build the new root on
  std::string conn_dir;  // host path, bound at kJailConnDir ("" : none)
  std::string work_dir;  // host path bound at kJailWorkDir, or "" for a private tmpfs
  // Host path of the static program pid 1 runs (cellgate-reaper), bound read-only at
  // kJailInitProgram, so that what pid 1 executes lies inside the jail's mount namespace, as a
  // checkpoint needs (CRIU finds every mapped file there). "" : none.
  std::string init_program;
};

// The two lists of steps, in the order above; the first failure is "<step>: <message>".
Result<void> contain_init(const JailSpec& spec, const RootPaths& paths, uid_t uid, gid_t gid);
// `settle_fds` is the "file descriptors" step, the one that differs: exec mode closes every
// inherited descriptor but its error pipe (close_inherited_fds); the zygote also leaves /dev/null
// on the numbers its Python objects hold.
Result<void> contain_kernel(const JailSpec& spec, uid_t uid, gid_t gid,
                            const std::function<Result<void>()>& settle_fds);

// A process entering a running jail (enter.hpp), in the child the helper forks once it joined
// the jail's namespaces and cgroup: the kernel's steps, in the same order, with its own session,
// optionally a terminal of the jail's devpts, and the caller's working directory:
//   "session" → "rlimits" → "cpu affinity" → "umask" → "credentials" → "parent death"
//   → "terminal" → "no_new_privs" → "landlock" → "work dir" → "file descriptors" → "seccomp"
struct TerminalSize;
struct ExecSteps {
  std::string cwd;  // in the jail; "" = kJailWorkDir
  // A pty (enter.hpp's open_terminal) as stdin, stdout, stderr and controlling terminal.
  const TerminalSize* terminal = nullptr;
  // Given the pty's master (still owned by the step) to pass on to whoever serves it.
  std::function<Result<void>(int master)> hand_over_master;
  std::function<Result<void>()> settle_fds;
};
Result<void> contain_exec(const JailSpec& spec, uid_t uid, gid_t gid, const ExecSteps& steps);

// Child steps.
Result<void> enter_cgroup_namespace();
Result<void> build_root(const JailSpec& spec, const RootPaths& paths, uid_t uid, gid_t gid);
Result<void> set_hostname(const std::string& name);
// For a spec with loopback_network: checks that the (new) network namespace holds only `lo` and
// brings it up (IFF_UP), as root in that namespace, before any of the kernel runs. Fails, naming
// the call, if it cannot: the kernel then does not start.
Result<void> bring_up_loopback();

// Kernel steps.
Result<void> new_session();
Result<void> enter_work_dir();  // chdir(kJailWorkDir)
Result<void> apply_rlimits(const JailSpec& spec);
// Narrows the calling process's CPU affinity to ceil(cpus) of the CPUs it may run on, starting
// at the `spread`-th (mod their number; the kernel's uid, so that 1-CPU kernels spread out).
// The quota (cgroup cpu.max / cfs_quota_us) caps CPU time but leaves every host CPU visible,
// and thread pools sized from the affinity mask (os.sched_getaffinity, OpenBLAS, OpenMP,
// joblib's loky) would start one busy worker per host CPU inside a 1-CPU share. The kernel may
// widen its mask again (sched_setaffinity on itself): a size hint, not a limit; the quota is.
Result<void> limit_cpu_affinity(double cpus, unsigned spread);
// How many CPUs limit_cpu_affinity(cpus, …) leaves a kernel started from this process: for its
// OMP_NUM_THREADS and the like, which the launcher sets before the kernel runs.
int kernel_cpu_count(double cpus);
// setgroups(0), setresgid, setresuid; the bounding set, ambient, effective, permitted and
// inheritable capabilities all emptied; securebits locked so uid 0 can never regain them.
Result<void> drop_privileges(uid_t uid, gid_t gid);
Result<void> set_no_new_privs();
// Closes every descriptor above 2 except `keep` (-1: none).
Result<void> close_inherited_fds(int keep = -1);

// Host side: a size-capped tmpfs on the host's work dir unless it already is a mount point.
// Returns true when it mounted one. With an access gid (JailSpec::access_gid) its root is
// uid:access_gid 0770, else uid:gid 0700.
Result<bool> mount_work_tmpfs(const std::string& work_dir, std::uint64_t bytes, uid_t uid,
                              gid_t gid, std::optional<gid_t> access_gid = std::nullopt);
// The staging directory for new roots (/run/cellgate/root), checked to be a root-owned real
// directory, created if missing.
Result<std::string> staging_dir();

// What this host supports, for the start-up log and for failing closed with a clear reason.
struct HostSupport {
  bool root = false;
  bool user_namespaces = false;
  int landlock_abi = 0;  // 0: none
  std::string cgroup;    // CgroupHost::describe(), or why none was found
  std::string seccomp;
  std::string kernel_release;
  std::string describe() const;
};
HostSupport probe_host();

}  // namespace cellgate::jail
