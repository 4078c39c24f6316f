// Entering a running jail: how a second process (an envd command, a terminal) joins a kernel's
// jail — the same namespaces, cgroup, uid, capabilities (none), no_new_privs, Landlock ruleset,
// seccomp table and rlimits — without the jail's own processes being able to reach it on the way
// in (jail/README.md, "Exec into a running jail", rows E24–E28 of the escape checklist).
//
//   helper (host, root, single-threaded, not dumpable)
//     "not dumpable" → "target" (pidfd of the jail's pid 1, checked to be in the kernel's cgroup
//     and in namespaces other than ours) → "cgroup" (join the kernel's cgroup) → "namespaces"
//     (setns(pidfd, …): mount — which sets root and cwd to the jail's root —, pid, net, ipc,
//     uts, cgroup, and user/time where the jail's differ from ours)
//     └─ fork: the child is a process of the jail's pid namespace, born in its cgroup;
//        contain_exec() (pipeline.cpp): "session" → "rlimits" → "cpu affinity" → "umask" →
//        "credentials" → "parent death" → "terminal" → "no_new_privs" → "landlock" →
//        "work dir" → "file descriptors" → "seccomp" → execve
//
//   CELLGATE_ASSIGN_OR_RETURN(jail::JailEntry entry, jail::enter_jail(init_pid, cgroup_dirs));
//   pid_t child = fork();   // inside the jail's pid namespace
//
// The helper itself stays outside the jail's pid namespace (setns(CLONE_NEWPID) moves only its
// children), so the jail's /proc never shows it; its child is visible there but not dumpable
// (owned by root for /proc and ptrace) until its execve, which happens after every step above.
//
// Thread-safety: these change the calling process; call them from a single-threaded process.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "cellgate/result.hpp"
#include "cellgate/sys/process.hpp"

namespace cellgate::jail {

// What enter_jail() joined.
struct JailEntry {
  sys::PidFd init;                  // the jail's pid 1: setns was done through it (no pid reuse)
  std::vector<std::string> joined;  // the namespaces joined ("mnt", "pid", …), for the log
};

// The steps above, in order, up to the fork: the first failure is "<step>: <message>".
// `cgroup_dirs` are the kernel's cgroup directories on the host (one per hierarchy; the
// launcher's "started" report names them): pid 1 must be in each, and the caller joins them all.
// An empty list is refused unless `allow_no_cgroup` (a kernel started with every cgroup limit
// optional and no cgroup at all).
Result<JailEntry> enter_jail(pid_t init_pid, const std::vector<std::string>& cgroup_dirs,
                             bool allow_no_cgroup = false);

// A terminal for a process entering the jail: a pty pair of the jail's own devpts instance,
// opened as the caller's (already dropped) uid so the slave belongs to it.
struct Terminal {
  int master = -1;  // owned by the caller
  int slave = -1;   // owned by the caller
};
struct TerminalSize {
  unsigned short cols = 80;
  unsigned short rows = 24;
};
// Opens /dev/ptmx (in the jail's mount namespace), unlocks it and opens its peer without a path
// (TIOCGPTPEER), sets the window size.
Result<Terminal> open_terminal(TerminalSize size);
// Makes `slave` the controlling terminal of the calling process (which leads a new session) and
// its stdin, stdout and stderr.
Result<void> attach_terminal(int slave);

}  // namespace cellgate::jail
