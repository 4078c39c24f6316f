// cellgate_seccomp_probe: attempts every call cellgate's seccomp table denies, and calls that must
// keep working, and prints one JSON object per attempt on stdout:
//
//   {"name":"socket:AF_NETLINK","expect":"deny","syscall":"socket","args":[16,3,0,0,0,0],
//    "ret":-1,"errno":95}
//   {"name":"fork","expect":"allow","ret":0,"errno":0}
//   {"name":"done","count":126}
//
// "expect" is the probe's intent; the test derives the exact errno from the table and the printed
// raw arguments. errno is 0 when the call succeeded; "signal" appears if the attempt was killed.
// Each syscall runs in a forked child, so fds, namespaces, personality or tracing it creates die
// with it. Arguments are chosen so that, without the filter, each call succeeds or fails with an
// errno other than the filter's, and does nothing to the host even as root (paths that do not
// exist, bad fds, bad magic numbers, zero-length or read-only requests).
//
//   cellgate_seccomp_probe           all probes, then "done"
//   cellgate_seccomp_probe --int80   getpid through the i386 ABI (int $0x80) from a second
//                                    thread; the filter kills the whole process
//   cellgate_seccomp_probe --x32     getpid through the x32 ABI; the filter kills
//
// Needs nothing but libc and kernel headers, so it can run inside the full jail too.
#include <fcntl.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/timex.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr std::size_t kArgCount = 6;
using Args = std::array<std::uint64_t, kArgCount>;

constexpr const char kMissing[] = "/nonexistent-cellgate-probe";
constexpr const char kMissingChild[] = "/nonexistent-cellgate-probe/node";
constexpr std::uint64_t kHighBit = std::uint64_t{1} << 32;
constexpr std::uint64_t kPersonalityQuery = 0xFFFFFFFFu;
// Linux UAPI values kept here so the probe needs no extra headers.
constexpr std::uint64_t kFsconfigSetFlag = 0;
constexpr std::uint64_t kBpfMapCreate = 0;
constexpr std::uint64_t kUffdUserModeOnly = 1;
constexpr std::uint64_t kKcmpFile = 0;
constexpr std::uint64_t kMadvCold = 20;
constexpr std::uint64_t kSyslogSizeBuffer = 10;
constexpr std::uint64_t kQGetFmtUsrQuota = 0x800004u << 8;  // QCMD(Q_GETFMT, USRQUOTA)
constexpr std::uint64_t kNetlinkRoute = 0;
constexpr std::uint64_t kEthPAllBe = 0x0300;  // htons(ETH_P_ALL)
constexpr std::uint64_t kFanClassNotif = 0;
constexpr std::uint64_t kKeyctlNoSuchCommand = 0x7FFF;
constexpr long kI386Getpid = 20;
constexpr long kX32SyscallBit = 0x40000000;

enum class Expect { kDeny, kAllow };

// What one attempt did, sent from the child that made it to the probe.
struct Outcome {
  Args args{};
  long ret = -1;
  int err = 0;
  int signal = 0;
};

int g_count = 0;

void write_line(const char* line, std::size_t len) {
  while (len > 0) {
    const ssize_t n = write(STDOUT_FILENO, line, len);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      _exit(3);
    }
    line += n;
    len -= static_cast<std::size_t>(n);
  }
}

void emit(const char* name, Expect expect, const char* syscall_name, const Outcome& o) {
  char line[512];
  int len = std::snprintf(line, sizeof line, "{\"name\":\"%s\",\"expect\":\"%s\"", name,
                          expect == Expect::kDeny ? "deny" : "allow");
  if (syscall_name != nullptr) {
    len += std::snprintf(
        line + len, sizeof line - static_cast<std::size_t>(len),
        ",\"syscall\":\"%s\",\"args\":[%llu,%llu,%llu,%llu,%llu,%llu]", syscall_name,
        static_cast<unsigned long long>(o.args[0]), static_cast<unsigned long long>(o.args[1]),
        static_cast<unsigned long long>(o.args[2]), static_cast<unsigned long long>(o.args[3]),
        static_cast<unsigned long long>(o.args[4]), static_cast<unsigned long long>(o.args[5]));
  }
  len += std::snprintf(line + len, sizeof line - static_cast<std::size_t>(len),
                       ",\"ret\":%ld,\"errno\":%d", o.ret, o.err);
  if (o.signal != 0) {
    len += std::snprintf(line + len, sizeof line - static_cast<std::size_t>(len), ",\"signal\":%d",
                         o.signal);
  }
  len += std::snprintf(line + len, sizeof line - static_cast<std::size_t>(len), "}\n");
  write_line(line, static_cast<std::size_t>(len));
  ++g_count;
}

// Runs `attempt` in a forked child and returns what it reported; a child killed by a signal
// reports that signal.
template <typename Attempt>
Outcome in_child(Attempt attempt) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return Outcome{{}, -1, errno, 0};
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    return Outcome{{}, -1, err, 0};
  }
  if (pid == 0) {
    close(fds[0]);
    const Outcome o = attempt();
    const ssize_t n = write(fds[1], &o, sizeof o);
    _exit(n == static_cast<ssize_t>(sizeof o) ? 0 : 4);
  }
  close(fds[1]);
  Outcome o;
  std::size_t got = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&o);
  while (got < sizeof o) {
    const ssize_t n = read(fds[0], bytes + got, sizeof o - got);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    got += static_cast<std::size_t>(n);
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (got != sizeof o) {
    o = Outcome{};
    o.err = -1;  // no report: not a valid errno, so the test fails loudly
  }
  if (WIFSIGNALED(status)) {
    o.signal = WTERMSIG(status);
  }
  return o;
}

long raw_syscall(long nr, const Args& a) {
  return syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

std::uint64_t ptr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// Runs syscall `nr` with the arguments `make_args` computes in the child (after `prepare`).
// For clone and clone3 (`forks`), a new child that the filter let through exits at once.
template <typename MakeArgs>
void probe(const char* name, const char* syscall_name, long nr, Expect expect, MakeArgs make_args,
           bool forks = false) {
  const Outcome o = in_child([&] {
    Outcome out;
    out.args = make_args();
    errno = 0;
    out.ret = raw_syscall(nr, out.args);
    out.err = out.ret < 0 ? errno : 0;
    if (forks && out.ret == 0) {
      _exit(0);
    }
    if (forks && out.ret > 0) {
      waitpid(static_cast<pid_t>(out.ret), nullptr, __WALL);
    }
    return out;
  });
  emit(name, expect, syscall_name, o);
}

void probe_args(const char* name, const char* syscall_name, long nr, Expect expect, Args args) {
  probe(name, syscall_name, nr, expect, [args] { return args; });
}

void deny(const char* name, const char* syscall_name, long nr, Args args) {
  probe_args(name, syscall_name, nr, Expect::kDeny, args);
}

void* thread_main(void* arg) {
  return arg;
}

void probe_controls() {
  emit("fork", Expect::kAllow, nullptr, in_child([] {
         Outcome out;
         const pid_t pid = fork();
         if (pid == 0) {
           _exit(0);
         }
         out.err = pid < 0 ? errno : 0;
         int status = 0;
         if (pid > 0 && waitpid(pid, &status, 0) == pid) {
           out.ret = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
         }
         return out;
       }));
  // glibc tries clone3 first; it gets ENOSYS and must fall back to clone.
  emit("pthread", Expect::kAllow, nullptr, in_child([] {
         Outcome out;
         pthread_t thread;
         out.err = pthread_create(&thread, nullptr, thread_main, nullptr);
         out.ret = out.err == 0 ? pthread_join(thread, nullptr) : -1;
         return out;
       }));
  probe(
      "clone:plain", "clone", SYS_clone, Expect::kAllow, [] { return Args{SIGCHLD}; }, true);
  probe_args("socket:AF_UNIX", "socket", SYS_socket, Expect::kAllow, {AF_UNIX, SOCK_STREAM, 0});
  static int pair[2];
  probe_args("socketpair:AF_UNIX", "socketpair", SYS_socketpair, Expect::kAllow,
             {AF_UNIX, SOCK_STREAM, 0, ptr(pair)});
  probe_args("personality:PER_LINUX", "personality", SYS_personality, Expect::kAllow, {0});
  probe_args("personality:query", "personality", SYS_personality, Expect::kAllow,
             {kPersonalityQuery});
  static int pending = 0;
  probe("ioctl:FIONREAD", "ioctl", SYS_ioctl, Expect::kAllow, [] {
    int p[2] = {-1, -1};
    if (pipe(p) != 0) {
      std::perror("pipe");
    }
    return Args{static_cast<std::uint64_t>(p[0]), FIONREAD, ptr(&pending)};
  });
  // A FIFO in a fresh directory under $TMPDIR or /tmp, removed again here.
  static char dir[2048];
  static char fifo[2100];
  const char* tmp = std::getenv("TMPDIR");
  static_cast<void>(
      std::snprintf(dir, sizeof dir, "%s/cellgate-probe-XXXXXX", tmp != nullptr ? tmp : "/tmp"));
  if (mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");  // the control then fails with ENOENT, which the test reports
  }
  static_cast<void>(std::snprintf(fifo, sizeof fifo, "%s/fifo", dir));
  probe_args("mknodat:S_IFIFO", "mknodat", SYS_mknodat, Expect::kAllow,
             {static_cast<std::uint64_t>(static_cast<std::int64_t>(AT_FDCWD)), ptr(fifo),
              S_IFIFO | 0600, 0});
  unlink(fifo);
  rmdir(dir);
}

void probe_processes() {
  // PTRACE_TRACEME would succeed: the probe (the child's parent) becomes its tracer.
  deny("ptrace:PTRACE_TRACEME", "ptrace", SYS_ptrace, {0 /*PTRACE_TRACEME*/});
  static char source[8] = "probe";
  static char target[8];
  static iovec local{target, sizeof target};
  static iovec remote{source, sizeof source};
  probe("process_vm_readv", "process_vm_readv", SYS_process_vm_readv, Expect::kDeny, [] {
    return Args{static_cast<std::uint64_t>(getpid()), ptr(&local), 1, ptr(&remote), 1, 0};
  });
  probe("process_vm_writev", "process_vm_writev", SYS_process_vm_writev, Expect::kDeny, [] {
    return Args{static_cast<std::uint64_t>(getpid()), ptr(&remote), 1, ptr(&local), 1, 0};
  });
  deny("process_madvise", "process_madvise", SYS_process_madvise,
       {static_cast<std::uint64_t>(-1), ptr(&local), 1, kMadvCold, 0});
  probe("kcmp", "kcmp", SYS_kcmp, Expect::kDeny, [] {
    const auto self = static_cast<std::uint64_t>(getpid());
    return Args{self, self, kKcmpFile, STDOUT_FILENO, STDOUT_FILENO};
  });
  probe("pidfd_getfd", "pidfd_getfd", SYS_pidfd_getfd, Expect::kDeny, [] {
    const long pidfd = syscall(SYS_pidfd_open, getpid(), 0);
    return Args{static_cast<std::uint64_t>(pidfd), STDOUT_FILENO, 0};
  });
}

void probe_namespaces() {
  deny("unshare:CLONE_NEWUSER", "unshare", SYS_unshare, {CLONE_NEWUSER});
  deny("unshare:CLONE_NEWNS", "unshare", SYS_unshare, {CLONE_NEWNS});
  deny("setns", "setns", SYS_setns, {static_cast<std::uint64_t>(-1), 0});
  struct Flag {
    const char* name;
    std::uint64_t value;
  };
  static constexpr Flag kFlags[] = {
      {"clone:CLONE_NEWNS", CLONE_NEWNS},     {"clone:CLONE_NEWCGROUP", CLONE_NEWCGROUP},
      {"clone:CLONE_NEWUTS", CLONE_NEWUTS},   {"clone:CLONE_NEWIPC", CLONE_NEWIPC},
      {"clone:CLONE_NEWUSER", CLONE_NEWUSER}, {"clone:CLONE_NEWPID", CLONE_NEWPID},
      {"clone:CLONE_NEWNET", CLONE_NEWNET},   {"clone:CLONE_NEWTIME", CLONE_NEWTIME},
  };
  for (const auto& flag : kFlags) {
    const std::uint64_t flags = flag.value | SIGCHLD;
    probe(
        flag.name, "clone", SYS_clone, Expect::kDeny, [flags] { return Args{flags}; }, true);
  }
  // struct clone_args, version 0 (64 bytes): flags, pidfd, child_tid, parent_tid, exit_signal,
  // stack, stack_size, tls.
  static std::uint64_t clone_args[8] = {0, 0, 0, 0, SIGCHLD, 0, 0, 0};
  probe(
      "clone3", "clone3", SYS_clone3, Expect::kDeny,
      [] {
        return Args{ptr(clone_args), sizeof clone_args};
      },
      true);
}

void probe_mounts() {
  static const char tmpfs[] = "tmpfs";
  static const char ro[] = "ro";
  const auto cwd = static_cast<std::uint64_t>(static_cast<std::int64_t>(AT_FDCWD));
  const auto bad_fd = static_cast<std::uint64_t>(-1);
  deny("mount", "mount", SYS_mount, {ptr(tmpfs), ptr(kMissing), ptr(tmpfs), 0, 0});
  deny("umount2", "umount2", SYS_umount2, {ptr(kMissing), 0});
  deny("pivot_root", "pivot_root", SYS_pivot_root, {ptr(kMissing), ptr(kMissing)});
  deny("chroot", "chroot", SYS_chroot, {ptr(kMissing)});
  deny("fsopen", "fsopen", SYS_fsopen, {ptr(tmpfs), 0});
  deny("fsconfig", "fsconfig", SYS_fsconfig, {bad_fd, kFsconfigSetFlag, ptr(ro), 0, 0});
  deny("fsmount", "fsmount", SYS_fsmount, {bad_fd, 0, 0});
  deny("fspick", "fspick", SYS_fspick, {cwd, ptr(kMissing), 0});
  deny("open_tree", "open_tree", SYS_open_tree, {cwd, ptr(kMissing), 0});
  deny("move_mount", "move_mount", SYS_move_mount, {cwd, ptr(kMissing), cwd, ptr(kMissing), 0});
  static std::uint64_t mount_attr[4] = {};  // struct mount_attr, all zero: a no-op
  deny("mount_setattr", "mount_setattr", SYS_mount_setattr,
       {cwd, ptr(kMissing), 0, ptr(mount_attr), sizeof mount_attr});
}

void probe_kernel_surface() {
  const auto bad_fd = static_cast<std::uint64_t>(-1);
  alignas(8) static unsigned char bpf_attr[128] = {};
  deny("bpf", "bpf", SYS_bpf, {kBpfMapCreate, ptr(bpf_attr), sizeof bpf_attr});
  static perf_event_attr perf{};
  perf.type = PERF_TYPE_SOFTWARE;
  perf.size = sizeof perf;
  perf.config = PERF_COUNT_SW_TASK_CLOCK;
  perf.exclude_kernel = 1;
  perf.exclude_hv = 1;
  deny("perf_event_open", "perf_event_open", SYS_perf_event_open,
       {ptr(&perf), 0, static_cast<std::uint64_t>(-1), bad_fd, PERF_FLAG_FD_CLOEXEC});
  deny("userfaultfd", "userfaultfd", SYS_userfaultfd, {O_CLOEXEC | kUffdUserModeOnly});
  alignas(8) static unsigned char uring_params[120] = {};  // struct io_uring_params
  deny("io_uring_setup", "io_uring_setup", SYS_io_uring_setup, {1, ptr(uring_params)});
  deny("io_uring_enter", "io_uring_enter", SYS_io_uring_enter, {bad_fd, 0, 0, 0, 0, 0});
  deny("io_uring_register", "io_uring_register", SYS_io_uring_register, {bad_fd, 0, 0, 0});
  static const char user[] = "user";
  static const char description[] = "cellgate-probe";
  static const char payload[] = "x";
  deny("keyctl", "keyctl", SYS_keyctl, {kKeyctlNoSuchCommand, 0, 0, 0, 0});
  deny("add_key", "add_key", SYS_add_key, {ptr(user), ptr(description), ptr(payload), 1, 0});
  deny("request_key", "request_key", SYS_request_key, {ptr(user), ptr(description), 0, 0});
  // Undefined flags: EINVAL before anything is loaded or unloaded (or ENOSYS without kexec).
  deny("kexec_load", "kexec_load", SYS_kexec_load, {0, 0, 0, 0x8000});
  deny("kexec_file_load", "kexec_file_load", SYS_kexec_file_load,
       {bad_fd, bad_fd, 0, 0, 0x80000000u});
  static const char not_elf[4] = {};
  static const char no_params[] = "";
  static const char no_module[] = "cellgate_probe_absent";
  deny("init_module", "init_module", SYS_init_module,
       {ptr(not_elf), sizeof not_elf, ptr(no_params)});
  deny("finit_module", "finit_module", SYS_finit_module, {bad_fd, ptr(no_params), 0});
  deny("delete_module", "delete_module", SYS_delete_module, {ptr(no_module), O_NONBLOCK});
  // Wrong magic numbers: EINVAL before any command is looked at.
  deny("reboot", "reboot", SYS_reboot, {0, 0, 0, 0});
  deny("swapon", "swapon", SYS_swapon, {ptr(kMissing), 0});
  deny("swapoff", "swapoff", SYS_swapoff, {ptr(kMissing)});
  deny("acct", "acct", SYS_acct, {ptr(kMissing)});
  alignas(8) static unsigned char quota_buf[64] = {};
  deny("quotactl", "quotactl", SYS_quotactl, {kQGetFmtUsrQuota, ptr(kMissing), 0, ptr(quota_buf)});
  deny("quotactl_fd", "quotactl_fd", SYS_quotactl_fd,
       {bad_fd, kQGetFmtUsrQuota, 0, ptr(quota_buf)});
  deny("syslog", "syslog", SYS_syslog, {kSyslogSizeBuffer, 0, 0});
  // Without a controlling terminal (setsid) vhangup has nothing to hang up.
  probe("vhangup", "vhangup", SYS_vhangup, Expect::kDeny, [] {
    setsid();
    return Args{};
  });
  deny("fanotify_init", "fanotify_init", SYS_fanotify_init, {kFanClassNotif, O_RDONLY});
  alignas(8) static char dcookie_buf[64];
  deny("lookup_dcookie", "lookup_dcookie", SYS_lookup_dcookie,
       {0, ptr(dcookie_buf), sizeof dcookie_buf});
  // struct file_handle: handle_bytes, handle_type, then the handle.
  alignas(8) static unsigned int handle[4] = {8, 1, 0, 0};
  alignas(8) static unsigned int empty_handle[4] = {0, 0, 0, 0};
  static int mount_id = 0;
  static const char root[] = "/";
  deny("open_by_handle_at", "open_by_handle_at", SYS_open_by_handle_at,
       {bad_fd, ptr(handle), O_RDONLY});
  deny("name_to_handle_at", "name_to_handle_at", SYS_name_to_handle_at,
       {static_cast<std::uint64_t>(static_cast<std::int64_t>(AT_FDCWD)), ptr(root),
        ptr(empty_handle), ptr(&mount_id), 0});
  // Out-of-range fractions (EINVAL); zero modes (read-only queries).
  static timeval bad_tv{0, 2000000};
  static timespec bad_ts{0, 2000000000};
  static timex query_tx{};
  deny("settimeofday", "settimeofday", SYS_settimeofday, {ptr(&bad_tv), 0});
  deny("clock_settime", "clock_settime", SYS_clock_settime, {CLOCK_REALTIME, ptr(&bad_ts)});
  deny("clock_adjtime", "clock_adjtime", SYS_clock_adjtime, {CLOCK_REALTIME, ptr(&query_tx)});
  deny("adjtimex", "adjtimex", SYS_adjtimex, {ptr(&query_tx)});
  deny("iopl", "iopl", SYS_iopl, {0});
  deny("ioperm", "ioperm", SYS_ioperm, {0x80, 1, 0});
  static const char name[] = "x";
  deny("sethostname", "sethostname", SYS_sethostname, {ptr(name), 1000});  // > 64: EINVAL
  deny("setdomainname", "setdomainname", SYS_setdomainname, {ptr(name), 1000});
  deny("uselib", "uselib", SYS_uselib, {ptr(kMissing)});
  deny("nfsservctl", "nfsservctl", SYS_nfsservctl, {0, 0, 0});
}

void probe_devices_and_terminals() {
  const auto cwd = static_cast<std::uint64_t>(static_cast<std::int64_t>(AT_FDCWD));
  const std::uint64_t dev_null = makedev(1, 3);
  deny("mknod:S_IFCHR", "mknod", SYS_mknod, {ptr(kMissingChild), S_IFCHR | 0600, dev_null});
  deny("mknod:S_IFBLK", "mknod", SYS_mknod, {ptr(kMissingChild), S_IFBLK | 0600, dev_null});
  deny("mknodat:S_IFCHR", "mknodat", SYS_mknodat,
       {cwd, ptr(kMissingChild), S_IFCHR | 0600, dev_null});
  deny("mknodat:S_IFBLK", "mknodat", SYS_mknodat,
       {cwd, ptr(kMissingChild), S_IFBLK | 0600, dev_null});
  // On a pipe, never a terminal: ENOTTY without the filter, even if stdin is a real tty.
  static char c = 'x';
  static constexpr std::uint64_t kCommands[][2] = {
      {TIOCSTI, 0}, {TIOCSTI | kHighBit, 0}, {TIOCLINUX, 0}};
  static constexpr const char* kNames[] = {"ioctl:TIOCSTI", "ioctl:TIOCSTI|1<<32",
                                           "ioctl:TIOCLINUX"};
  for (std::size_t i = 0; i < 3; ++i) {
    const std::uint64_t command = kCommands[i][0];
    probe(kNames[i], "ioctl", SYS_ioctl, Expect::kDeny, [command] {
      int p[2] = {-1, -1};
      if (pipe(p) != 0) {
        std::perror("pipe");
      }
      return Args{static_cast<std::uint64_t>(p[0]), command, ptr(&c)};
    });
  }
}

void probe_sockets() {
  struct Family {
    const char* name;
    std::uint64_t family;
    std::uint64_t type;
    std::uint64_t protocol;
  };
  static constexpr Family kFamilies[] = {
      {"socket:AF_INET", AF_INET, SOCK_STREAM, 0},
      {"socket:AF_INET6", AF_INET6, SOCK_DGRAM, 0},
      {"socket:AF_NETLINK", AF_NETLINK, SOCK_RAW, kNetlinkRoute},
      {"socket:AF_PACKET", AF_PACKET, SOCK_RAW, kEthPAllBe},
      {"socket:AF_VSOCK", AF_VSOCK, SOCK_STREAM, 0},
      {"socket:AF_ALG", AF_ALG, SOCK_SEQPACKET, 0},
      {"socket:AF_UNSPEC", AF_UNSPEC, SOCK_STREAM, 0},
      {"socket:AF_UNIX|1<<32", AF_UNIX | kHighBit, SOCK_STREAM, 0},
  };
  for (const auto& f : kFamilies) {
    deny(f.name, "socket", SYS_socket, {f.family, f.type, f.protocol});
  }
  static int pair[2];
  deny("socketpair:AF_INET", "socketpair", SYS_socketpair, {AF_INET, SOCK_STREAM, 0, ptr(pair)});
  deny("socketpair:AF_NETLINK", "socketpair", SYS_socketpair, {AF_NETLINK, SOCK_RAW, 0, ptr(pair)});
}

void probe_personality() {
  deny("personality:ADDR_NO_RANDOMIZE", "personality", SYS_personality, {0x0040000});
  deny("personality:READ_IMPLIES_EXEC", "personality", SYS_personality, {0x0400000});
  deny("personality:PER_LINUX32", "personality", SYS_personality, {0x0008});
  // One value per row of the table's 32 personality rows, matching that row alone: the low k+1
  // bits set, and 0x80000000.
  static char names[32][40];
  for (unsigned k = 0; k < 32; ++k) {
    const std::uint64_t value = k < 31 ? (std::uint64_t{1} << (k + 1)) - 1 : 0x80000000u;
    static_cast<void>(std::snprintf(names[k], sizeof names[k], "personality:0x%llx",
                                    static_cast<unsigned long long>(value)));
    deny(names[k], "personality", SYS_personality, {value});
  }
}

void* int80_getpid(void* result) {
  long ret = kI386Getpid;
  // In 64-bit code int $0x80 enters the i386 syscall table (audit arch i386).
  __asm__ __volatile__("int $0x80" : "+a"(ret) : : "memory", "r8", "r9", "r10", "r11");
  *static_cast<long*>(result) = ret;
  return nullptr;
}

// From a second thread, so that only a kill of the whole process (not of the calling thread)
// keeps the main thread from printing.
int run_int80() {
  long ret = 0;
  pthread_t thread;
  if (pthread_create(&thread, nullptr, int80_getpid, &ret) != 0 ||
      pthread_join(thread, nullptr) != 0) {
    return 5;
  }
  Outcome o;
  o.ret = ret;
  o.err = ret < 0 ? static_cast<int>(-ret) : 0;
  emit("int80:getpid", Expect::kAllow, nullptr, o);
  return 0;
}

int run_x32() {
  Outcome o;
  o.ret = syscall(kX32SyscallBit | SYS_getpid);
  o.err = o.ret < 0 ? errno : 0;
  emit("x32:getpid", Expect::kAllow, nullptr, o);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--int80") == 0) {
    return run_int80();
  }
  if (argc > 1 && std::strcmp(argv[1], "--x32") == 0) {
    return run_x32();
  }
  if (argc > 1) {
    static_cast<void>(std::fprintf(stderr, "usage: %s [--int80 | --x32]\n", argv[0]));
    return 2;
  }
  probe_controls();
  probe_processes();
  probe_namespaces();
  probe_mounts();
  probe_kernel_surface();
  probe_devices_and_terminals();
  probe_sockets();
  probe_personality();
  char line[64];
  const int len = std::snprintf(line, sizeof line, "{\"name\":\"done\",\"count\":%d}\n", g_count);
  write_line(line, static_cast<std::size_t>(len));
  return 0;
}
