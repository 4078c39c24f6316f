// Entering a running jail (enter.hpp): the helper's host-side steps, and the terminal.
#include "cellgate/jail/enter.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <utility>

#include "cellgate/jail/jail.hpp"
#include "cellgate/sys/file.hpp"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

namespace cellgate::jail {
namespace {

Error entry_error(const std::string& message) {
  return make_error(ErrorCode::kFailedPrecondition, "jail_entry", message);
}

// The inode of /proc/<who>/ns/<name>; 0 when this kernel has no such namespace type.
Result<ino_t> ns_inode(const std::string& who, const char* name) {
  struct stat st {};
  const std::string path = "/proc/" + who + "/ns/" + name;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return ino_t{0};
    }
    return errno_error(ErrorCode::kInternal, "jail_entry", "stat('" + path + "')", errno);
  }
  return st.st_ino;
}

// A cgroup directory as the launcher reported it: absolute, below /sys/fs/cgroup, no "..".
bool plain_cgroup_dir(const std::string& dir) {
  const std::string root = "/sys/fs/cgroup/";
  return dir.rfind(root, 0) == 0 && dir.find("/../") == std::string::npos &&
         dir.find("/./") == std::string::npos && dir.size() > root.size() &&
         dir.substr(dir.size() - 3) != "/.." && dir.find('\0') == std::string::npos;
}

// Whether `pid` is listed in <dir>/cgroup.procs.
Result<bool> in_cgroup(const std::string& dir, pid_t pid) {
  CELLGATE_ASSIGN_OR_RETURN(std::string procs,
                            sys::read_file(dir + "/cgroup.procs", std::size_t{4} << 20));
  const std::string want = std::to_string(pid);
  std::size_t start = 0;
  while (start < procs.size()) {
    std::size_t end = procs.find('\n', start);
    if (end == std::string::npos) {
      end = procs.size();
    }
    if (procs.compare(start, end - start, want) == 0) {
      return true;
    }
    start = end + 1;
  }
  return false;
}

// The pid 1 the caller named, pinned by a pidfd, and checked to be a jail's: namespaces other
// than ours (a reused pid on the host would share them) and a member of the kernel's cgroups.
// Checked after the pidfd is open: if the process ends meanwhile, setns() through the pidfd
// fails (ESRCH) instead of joining whatever took its pid.
Result<sys::PidFd> open_target(pid_t init_pid, const std::vector<std::string>& cgroup_dirs) {
  if (init_pid <= 1) {
    return entry_error("no jail's pid 1 given (pid " + std::to_string(init_pid) + ")");
  }
  CELLGATE_ASSIGN_OR_RETURN(sys::PidFd pidfd, sys::PidFd::open(init_pid));
  const std::string who = std::to_string(init_pid);
  for (const char* ns : {"mnt", "pid", "net", "ipc", "uts"}) {
    CELLGATE_ASSIGN_OR_RETURN(ino_t theirs, ns_inode(who, ns));
    CELLGATE_ASSIGN_OR_RETURN(ino_t ours, ns_inode("self", ns));
    if (theirs == 0 || theirs == ours) {
      return entry_error("pid " + who + " shares our " + ns +
                         " namespace: it is not the pid 1 of a jail (it ended, and its pid was "
                         "reused?)");
    }
  }
  for (const auto& dir : cgroup_dirs) {
    if (!plain_cgroup_dir(dir)) {
      return entry_error("'" + dir + "' is not a cgroup directory below /sys/fs/cgroup");
    }
    CELLGATE_ASSIGN_OR_RETURN(bool member, in_cgroup(dir, init_pid));
    if (!member) {
      return entry_error("pid " + who + " is not in the kernel's cgroup " + dir +
                         ": it is not that kernel's jail (it ended, and its pid was reused?)");
    }
  }
  if (pidfd.wait_readable(std::chrono::milliseconds(0))) {
    return entry_error("the jail's pid 1 (" + who + ") ended");
  }
  return pidfd;
}

// Joins the kernel's cgroups: our child is then born there, under its limits, and killed with
// it (cgroup.kill on v2, the launcher's kill loop on v1).
Result<void> join_cgroups(const std::vector<std::string>& cgroup_dirs) {
  for (const auto& dir : cgroup_dirs) {
    CELLGATE_TRY(sys::write_file(dir + "/cgroup.procs", std::to_string(::getpid())));
  }
  return {};
}

// setns(2) through the pidfd joins every namespace named at once (Linux 5.8), atomically: all or
// none. A user or time namespace is joined only where the jail's is not ours (the jail makes
// neither; a gateway in its own user namespace shares it with its jails, a restored checkpoint
// has a time namespace of CRIU's).
Result<std::vector<std::string>> join_namespaces(const sys::PidFd& init) {
  int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS;
  std::vector<std::string> joined = {"mnt", "pid", "net", "ipc", "uts"};
  const std::string who = std::to_string(init.pid());
  struct Optional {
    const char* name;
    int flag;
  };
  for (const Optional ns : {Optional{"cgroup", CLONE_NEWCGROUP}, Optional{"user", CLONE_NEWUSER},
                            Optional{"time", CLONE_NEWTIME}}) {
    CELLGATE_ASSIGN_OR_RETURN(ino_t theirs, ns_inode(who, ns.name));
    CELLGATE_ASSIGN_OR_RETURN(ino_t ours, ns_inode("self", ns.name));
    if (theirs != 0 && theirs != ours) {
      flags |= ns.flag;
      joined.emplace_back(ns.name);
    }
  }
  if (::setns(init.get(), flags) != 0) {
    return errno_error(ErrorCode::kFailedPrecondition, "jail_entry",
                       "setns(pidfd of " + who + ", " + std::to_string(flags) + ")", errno);
  }
  // setns(CLONE_NEWNS) put our root and cwd at the jail's root; nothing of the host's file
  // tree is reachable by path from here.
  if (::chdir("/") != 0) {
    return errno_error(ErrorCode::kInternal, "jail_entry", "chdir('/')", errno);
  }
  return joined;
}

}  // namespace

Result<JailEntry> enter_jail(pid_t init_pid, const std::vector<std::string>& cgroup_dirs,
                             bool allow_no_cgroup) {
  JailEntry entry;
  CELLGATE_TRY(run_steps({
      // First: from here on /proc/<us> and ptrace need CAP_SYS_PTRACE over our (the host's)
      // user namespace, which nothing in a jail holds (CVE-2016-9962). Kept across fork; the
      // child's execve resets it only once it is the jailed command.
      {"not dumpable",
       []() -> Result<void> {
         if (::prctl(PR_SET_DUMPABLE, 0) != 0) {
           return errno_error(ErrorCode::kInternal, "jail_entry", "prctl(PR_SET_DUMPABLE, 0)",
                              errno);
         }
         return {};
       }},
      {"target",
       [&]() -> Result<void> {
         if (cgroup_dirs.empty() && !allow_no_cgroup) {
           return entry_error(
               "no cgroup of the kernel given: a process entering its jail would escape its "
               "limits");
         }
         CELLGATE_ASSIGN_OR_RETURN(entry.init, open_target(init_pid, cgroup_dirs));
         return {};
       }},
      {"cgroup", [&] { return join_cgroups(cgroup_dirs); }},
      {"namespaces",
       [&]() -> Result<void> {
         CELLGATE_ASSIGN_OR_RETURN(entry.joined, join_namespaces(entry.init));
         return {};
       }},
  }));
  return entry;
}

Result<Terminal> open_terminal(TerminalSize size) {
  // The jail's /dev/ptmx leads to its own devpts instance (mounts.cpp): the pair is the jail's,
  // counted against its 64, invisible to the host's and other jails' /dev/pts.
  const int master = ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) {
    return errno_error(ErrorCode::kFailedPrecondition, "terminal", "open('/dev/ptmx')", errno);
  }
  Terminal t{master, -1};
  auto fail = [&](const char* call) {
    const int err = errno;
    ::close(master);
    return errno_error(ErrorCode::kInternal, "terminal", call, err);
  };
  int unlock = 0;
  if (::ioctl(master, TIOCSPTLCK, &unlock) != 0) {
    return fail("ioctl(TIOCSPTLCK)");
  }
  // The peer by the master itself, not by a /dev/pts/N path someone could swap (Linux 4.13).
  t.slave = ::ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (t.slave < 0) {
    return fail("ioctl(TIOCGPTPEER)");
  }
  winsize ws{};
  ws.ws_col = size.cols;
  ws.ws_row = size.rows;
  if (::ioctl(master, TIOCSWINSZ, &ws) != 0) {
    ::close(t.slave);
    return fail("ioctl(TIOCSWINSZ)");
  }
  return t;
}

Result<void> attach_terminal(int slave) {
  if (::ioctl(slave, TIOCSCTTY, 0) != 0) {
    return errno_error(ErrorCode::kInternal, "terminal", "ioctl(TIOCSCTTY)", errno);
  }
  for (int fd = 0; fd <= 2; ++fd) {
    if (::dup2(slave, fd) != fd) {
      return errno_error(ErrorCode::kInternal, "terminal", "dup2(pty, " + std::to_string(fd) + ")",
                         errno);
    }
  }
  return {};
}

}  // namespace cellgate::jail
