// Zygote mode: a fork server that has Python, ipykernel and the scientific stack imported once, so
// a jailed kernel starts by copying it instead of by starting Python.
//
//   cellgate-kernel --zygote --socket /run/cellgate/zygote.sock --status-fd 3
//       [--preload ipykernel,IPython,numpy,pandas,matplotlib]
//   cellgate-kernel --zygote-socket /run/cellgate/zygote.sock --spec jail.json
//       --connection-file c.json -- python3 -m ipykernel_launcher -f c.json    (one kernel)
//
// The zygote (src/zygote_server.cpp, embeds CPython; its Python is python/cellgate_zygote.py,
// embedded at build time and tested by tests/launcher/test_zygote_python.py):
//   1. re-execs itself with an empty environment: every kernel gets a copy of its memory, so it
//      must never hold a secret (a dumpable kernel could read the old block in /proc/self/environ);
//   2. binds its socket (0600), then jails itself: new mount, network, ipc and uts namespaces, the
//      whole mount tree read-only, a private /tmp. It stays root (it builds jails), so this guards
//      against an import's side effects, not against a hostile zygote: the zygote runs no code but
//      the preload list;
//   3. imports the preload list without starting a thread or a ZeroMQ context (checked), loads
//      matplotlib's font list, builds the InteractiveShell every ipykernel would build (its
//      history in memory, no thread), and freezes the garbage collector (gc.freeze: a collection
//      in a kernel must not touch, and so copy, the shared objects);
//   4. reports {"event":"ready"} on the status fd and serves requests, one at a time; after each
//      answer it parses that request's kernel command line into an IPKernelApp, for the next
//      kernel with the same arguments (jailed kernels' are all the same).
//
// A request (the launcher, after it made the cgroup, work dir and connection dir as in exec mode):
//   {"spec":{…},"uid":N,"gid":N,"staging":"…","conn_dir":"…","work_dir":"…",
//    "args":["-f","/run/kernel/kernel.json",…],"env":{…}}
//   + fds: the host's mount namespace, the report pipe (write end), the go pipe (read end),
//     stdout, stderr.
// The zygote clones a child into new pid, network, ipc and uts namespaces and answers
//   {"pid":N} + the child's pidfd            or            {"error":"…"}.
// The child enters the host's mount namespace and unshares its own, waits for "G" on the go pipe
// (the launcher has put it into the kernel's cgroup), then takes exec mode's steps,
// jail::contain_init() (cgroup namespace, root filesystem, hostname); it forks the kernel, which
// takes jail::contain_kernel() (session, work dir, rlimits, credentials, no_new_privs, fds,
// seccomp; its fd step keeps /dev/null on the numbers Python holds), reseeds every random
// generator and runs IPKernelApp on the request's connection file: skipping the parse when the
// zygote did it, and adopting the zygote's shell (its kernel, profile, history file and thread,
// home and environment are then the kernel's own) unless a profile config file configures more
// than the app. Together ~25 ms less per start here, half of it copy-on-write page faults. The
// child then execs the static cellgate-reaper as the jail's pid 1 (a Python copy as pid 1 would
// cost megabytes per kernel). Both report on the report pipe exactly as exec mode's init does
// ("R", "E…", "X…": src/init.hpp, one pid-1 protocol and one reaper loop for both modes), so
// the launcher supervises a zygote kernel the same way, through the pidfd. The zygote is out of
// the loop once it answered: when it dies, its kernels run on.
//
// Memory: pages a kernel still shares with the zygote are charged to the zygote's memory cgroup
// (the gateway's), not to the kernel's; the kernel's memory limit caps its private pages.
//
// Thread-safety: single-threaded processes.
#pragma once

#include <string>
#include <vector>

namespace cellgate::launcher {

struct ZygoteOptions {
  std::string socket_path;
  int status_fd = -1;
  // Modules imported before the first fork.
  std::vector<std::string> preload = {"ipykernel", "IPython", "numpy", "pandas", "matplotlib"};
  // argv of this process, for the re-exec with an empty environment.
  std::vector<std::string> self_argv;
};

// Runs the zygote until SIGTERM. Returns the process exit code.
int run_zygote(const ZygoteOptions& options);

}  // namespace cellgate::launcher
