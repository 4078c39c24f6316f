// The seccomp table and its loader. See seccomp.hpp for the contract; the rows below are the
// policy, each with its reason. The ids in the reasons ("(E3)", "(D18)") are rows of the escape
// checklist in jail/README.md. Other sources: Docker's (moby's) default profile and flatpak's
// seccomp table.
#include "cellgate/jail/seccomp.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

namespace cellgate::jail {
namespace {

constexpr std::uint64_t kAllBits = ~std::uint64_t{0};
constexpr std::uint64_t kLow32 = 0xFFFFFFFFu;
constexpr unsigned kSyscallArgCount = 6;
constexpr int kMaxErrno = 4095;  // what SCMP_ACT_ERRNO can carry as a -errno return
// A masked "not equal" becomes one libseccomp rule per mask bit; this bounds the product.
constexpr std::size_t kMaxRulesPerRow = 64;

// Every CLONE_NEW* flag. CLONE_NEWTIME (0x80) lies in clone()'s exit-signal byte (CSIGNAL); no
// valid exit signal has bit 7 set, so denying it there costs nothing and covers the flag if a
// future kernel accepts it.
constexpr std::uint64_t kCloneNewFlags = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS |
                                         CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
                                         CLONE_NEWNET | CLONE_NEWTIME;
static_assert(kCloneNewFlags == 0x7E020080u, "CLONE_NEW* mask");

SeccompRow deny(std::string syscall, std::string reason) {
  return SeccompRow{std::move(syscall), EPERM, {}, std::move(reason)};
}

SeccompRow deny_if(std::string syscall, int errno_value, SeccompArg arg, std::string reason) {
  return SeccompRow{std::move(syscall), errno_value, {arg}, std::move(reason)};
}

SeccompArg arg_equals(unsigned index, std::uint64_t mask, std::uint64_t value) {
  return SeccompArg{index, mask, value, false};
}

SeccompArg arg_differs(unsigned index, std::uint64_t mask, std::uint64_t value) {
  return SeccompArg{index, mask, value, true};
}

void add_personality_rows(std::vector<SeccompRow>& table) {
  // Allowed: PER_LINUX (0) and the query 0xffffffff; the kernel reads the low 32 bits only.
  // libseccomp takes one condition per argument, so "neither 0 nor 0xffffffff" cannot be one
  // row. Any other 32-bit value has a set bit followed (cyclically) by a clear bit, so these 32
  // rows, "bit i set and bit i+1 clear", match exactly the values to deny.
  for (unsigned i = 0; i < 32; ++i) {
    const std::uint64_t bit = std::uint64_t{1} << i;
    const std::uint64_t next = std::uint64_t{1} << ((i + 1) % 32);
    table.push_back(deny_if(
        "personality", EPERM, arg_equals(0, bit | next, bit),
        "personality flags (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, ...) turn off NX and ASLR for "
        "later execs; only PER_LINUX (0) and the query 0xffffffff pass (row " +
            std::to_string(i + 1) + " of 32: bit " + std::to_string(i) + " set, bit " +
            std::to_string((i + 1) % 32) + " clear)"));
  }
}

std::vector<SeccompRow> build_default_table() {
  std::vector<SeccompRow> t;
  // Other processes: reading or steering them (E3).
  t.push_back(deny("ptrace",
                   "reads and writes other processes' memory and registers; before "
                   "Linux 4.8 it also bypassed seccomp (E3)"));
  t.push_back(deny("process_vm_readv", "reads another process's memory without attaching (E3)"));
  t.push_back(deny("process_vm_writev", "writes another process's memory (E3)"));
  t.push_back(deny("process_madvise",
                   "acts on another process's memory through a pidfd; Docker "
                   "requires CAP_SYS_PTRACE"));
  t.push_back(deny("kcmp",
                   "compares two processes' kernel objects, leaking kernel pointer order; "
                   "Docker requires CAP_SYS_PTRACE (E3)"));
  t.push_back(deny("pidfd_getfd", "copies a file descriptor out of another process (E3)"));

  // Namespaces: the main unprivileged route to kernel bugs, and a way back out (E4).
  t.push_back(deny("unshare",
                   "new namespaces, a user namespace above all, expose netfilter, "
                   "overlayfs and mount code to the kernel (E4, E12)"));
  t.push_back(deny("setns",
                   "joins namespaces through /proc/*/ns or a pidfd, a way out of the "
                   "jail (E4)"));
  t.push_back(deny_if("clone", EPERM, arg_differs(0, kCloneNewFlags, 0),
                      "clone with any CLONE_NEW* flag (mask 0x7E020080) is unshare by another "
                      "name (E4); Docker's mask is 0x7E020000, ours adds CLONE_NEWTIME. Plain "
                      "fork and threads pass"));
  t.push_back(deny("clone3",
                   "seccomp cannot read clone3's flags (they are in memory); ENOSYS "
                   "makes glibc fall back to clone, whose flags are filtered (Docker)"));
  t.back().errno_value = ENOSYS;

  // Mounts, old and new API (E5, E6).
  t.push_back(deny("mount",
                   "mounting over or remounting the jail's filesystems; cgroup v1 "
                   "release_agent escape CVE-2022-0492 (E5, E6)"));
  t.push_back(deny("umount2", "unmounting uncovers what the jail's mounts hide (E5)"));
  t.push_back(deny("pivot_root", "changes the root filesystem (E5); Docker never allows it"));
  t.push_back(deny("chroot",
                   "with a directory fd kept outside, chroot is a classic escape; no "
                   "kernel needs it"));
  t.push_back(deny("fsopen",
                   "new mount API: the fsconfig heap overflow CVE-2022-0185 was "
                   "reachable through fsopen from a user namespace (E5)"));
  t.push_back(deny("fsconfig", "new mount API; CVE-2022-0185 (E5)"));
  t.push_back(deny("fsmount", "new mount API: turns a configured filesystem into a mount (E5)"));
  t.push_back(deny("fspick", "new mount API: reconfigures an existing mount (E5)"));
  t.push_back(deny("open_tree", "clones mount trees (OPEN_TREE_CLONE) to attach elsewhere (E5)"));
  t.push_back(deny("move_mount", "attaches or moves mounts (E5)"));
  t.push_back(deny("mount_setattr",
                   "changes mount flags (ro, nosuid, noexec) and idmaps "
                   "mounts (E5)"));

  // Kernel attack surface with no use in a notebook kernel.
  t.push_back(deny("bpf",
                   "eBPF verifier bugs are a recurring LPE source; do not depend on the "
                   "host's unprivileged_bpf_disabled (E9)"));
  t.push_back(deny("perf_event_open",
                   "perf has a long LPE and side-channel record; Docker "
                   "requires CAP_PERFMON (E9)"));
  t.push_back(deny("userfaultfd",
                   "stalls page faults at will, widening races in kernel "
                   "exploits (E11)"));
  t.push_back(deny("io_uring_setup",
                   "io_uring is a large, often exploited surface; Docker "
                   "blocks it since 2023 (moby #46762) (E10)"));
  t.push_back(deny("io_uring_enter", "io_uring (E10)"));
  t.push_back(deny("io_uring_register", "io_uring (E10)"));
  t.push_back(deny("keyctl",
                   "kernel keyrings are not namespaced: leaks between jails and quota "
                   "exhaustion (E8, D14)"));
  t.push_back(deny("add_key", "kernel keyrings are not namespaced (E8)"));
  t.push_back(deny("request_key",
                   "kernel keyrings are not namespaced; can start a userspace "
                   "upcall (E8)"));
  t.push_back(deny("kexec_load", "loads a new kernel (E15)"));
  t.push_back(deny("kexec_file_load", "loads a new kernel (E15)"));
  t.push_back(deny("init_module", "loads kernel code (E15)"));
  t.push_back(deny("finit_module", "loads kernel code from a file (E15)"));
  t.push_back(deny("delete_module", "unloads kernel modules (E15)"));
  t.push_back(deny("reboot", "restarts or halts the machine, or the pid namespace (E15)"));
  t.push_back(deny("swapon", "changes the host's swap (E15)"));
  t.push_back(deny("swapoff", "changes the host's swap (E15)"));
  t.push_back(deny("acct",
                   "turns process accounting on, into a file of the caller's choice "
                   "(E15)"));
  t.push_back(deny("quotactl", "administers filesystem quotas; Docker requires CAP_SYS_ADMIN"));
  t.push_back(deny("quotactl_fd", "quotactl through an fd (Linux 5.14)"));
  t.push_back(deny("syslog",
                   "reads or clears the kernel log: kernel addresses and other "
                   "tenants' messages"));
  t.push_back(deny("vhangup", "hangs up a terminal other processes may share"));
  t.push_back(deny("fanotify_init",
                   "filesystem-wide event monitoring; Docker requires "
                   "CAP_SYS_ADMIN"));
  t.push_back(deny("lookup_dcookie",
                   "oprofile's dentry cookies leak kernel pointers; Docker "
                   "requires CAP_SYS_ADMIN"));
  t.push_back(deny("open_by_handle_at",
                   "opens any inode by handle, ignoring the mount "
                   "namespace: the 2014 'shocker' container escape"));
  t.push_back(deny("name_to_handle_at",
                   "makes the handles open_by_handle_at needs and leaks "
                   "inode and mount ids"));
  t.push_back(deny("settimeofday", "the realtime clock is host-wide (D18)"));
  t.push_back(deny("clock_settime", "the realtime clock is host-wide (D18)"));
  t.push_back(deny("clock_adjtime", "adjusts host clocks; even read-only use is not needed (D18)"));
  t.push_back(deny("adjtimex", "adjusts the host clock; even read-only use is not needed (D18)"));
  t.push_back(deny("iopl", "raw I/O port privilege level (E15)"));
  t.push_back(deny("ioperm", "raw I/O port access (E15)"));
  t.push_back(deny("sethostname",
                   "the jail's hostname is set by the jail; Docker requires "
                   "CAP_SYS_ADMIN"));
  t.push_back(deny("setdomainname",
                   "the jail's domain name is set by the jail; Docker requires "
                   "CAP_SYS_ADMIN"));
  t.push_back(deny("uselib", "legacy a.out loader; Docker never allows it"));
  t.push_back(deny("nfsservctl", "removed in Linux 3.1; Docker never allows it"));

  // Device nodes: raw access to host disks and memory wherever a mount lacks nodev.
  for (const char* name : {"mknod", "mknodat"}) {
    const unsigned mode_arg = std::strcmp(name, "mknod") == 0 ? 1 : 2;
    t.push_back(deny_if(name, EPERM, arg_equals(mode_arg, S_IFMT, S_IFCHR),
                        "character device nodes reach host devices where a mount lacks nodev "
                        "(FIFOs and sockets stay allowed)"));
    t.push_back(deny_if(name, EPERM, arg_equals(mode_arg, S_IFMT, S_IFBLK),
                        "block device nodes reach host disks where a mount lacks nodev"));
  }

  // Terminal injection. The kernel reads the command as 32 bits, so the compare is masked to the
  // low half, or TIOCSTI | 1 << 32 would slip through (flatpak).
  t.push_back(deny_if("ioctl", EPERM, arg_equals(1, kLow32, TIOCSTI),
                      "TIOCSTI fakes input to the controlling terminal (CVE-2017-5226)"));
  t.push_back(deny_if("ioctl", EPERM, arg_equals(1, kLow32, TIOCLINUX),
                      "TIOCLINUX can push console selections into a virtual console's input "
                      "(CVE-2023-28100)"));

  // Sockets: the jail has no network; ZeroMQ over ipc:// needs AF_UNIX only. The netlink row
  // must come first: it overlaps the next one, and the first matching row is the answer
  // (libseccomp tests the equal compare before the not-equal one).
  for (const char* name : {"socket", "socketpair"}) {
    t.push_back(deny_if(name, EOPNOTSUPP, arg_equals(0, kAllBits, AF_NETLINK),
                        "AF_NETLINK gets EOPNOTSUPP, not EPERM: libzmq's getifaddrs() path "
                        "aborts the kernel on EPERM and tolerates EOPNOTSUPP (jail experiment, "
                        "pitfall 1)"));
    t.push_back(deny_if(name, EPERM, arg_differs(0, kAllBits, AF_UNIX),
                        "every family but AF_UNIX: AF_INET*, AF_PACKET, AF_VSOCK, AF_ALG and raw "
                        "sockets (E12, E18); all 64 bits compared, so a family with stray high "
                        "bits is denied too"));
  }

  add_personality_rows(t);
  return t;
}

// ---- the loopback network's socket rows ------------------------------------------------------

// The small values of an argument are compared in aligned blocks of 0..31; above that, one row
// matches any set bit.
constexpr std::uint64_t kSmallValues = 0x1F;
constexpr std::uint64_t kSocketTypeMask = 0xF;  // SOCK_TYPE_MASK: the kernel ignores the rest here

// Appends masked compares on argument `index` that match exactly the values in
// [start, start + size) of the low `width` bits that are not in `allowed`: the aligned blocks
// holding no allowed value, halving only where one does. `upper` joins every mask: the bits above
// `width` that must be 0 as well. The depth is log2(width + 1), at most 5 here.
void add_blocks_outside(std::vector<SeccompArg>& out, unsigned index, std::uint64_t width,
                        std::uint64_t upper, const std::vector<std::uint64_t>& allowed,
                        std::uint64_t start, std::uint64_t size) {
  const bool holds_allowed = std::any_of(allowed.begin(), allowed.end(), [&](std::uint64_t v) {
    return v >= start && v < start + size;
  });
  if (!holds_allowed) {
    out.push_back(arg_equals(index, upper | (width & ~(size - 1)), start));
    return;
  }
  if (size > 1) {
    add_blocks_outside(out, index, width, upper, allowed, start, size / 2);
    add_blocks_outside(out, index, width, upper, allowed, start + size / 2, size / 2);
  }
}

std::vector<SeccompArg> blocks_outside(unsigned index, std::uint64_t width, std::uint64_t upper,
                                       const std::vector<std::uint64_t>& allowed) {
  std::vector<SeccompArg> out;
  add_blocks_outside(out, index, width, upper, allowed, 0, width + 1);
  return out;
}

SeccompRow socket_row(std::vector<SeccompArg> args, std::string reason) {
  return SeccompRow{"socket", EPERM, std::move(args), std::move(reason)};
}

// socket() for a kernel with a loopback network: AF_UNIX as always, and AF_INET/AF_INET6 stream
// and datagram sockets with protocol 0, TCP or UDP. No row overlaps another with a different
// errno, so their order does not matter. The kernel reads the three arguments as ints: each is
// compared on its low 32 bits, so stray high bits neither pass nor block anything the int would.
std::vector<SeccompRow> loopback_socket_rows() {
  std::vector<SeccompRow> t;
  t.push_back(deny_if("socket", EOPNOTSUPP, arg_equals(0, kLow32, AF_NETLINK),
                      "AF_NETLINK gets EOPNOTSUPP, not EPERM: libzmq's getifaddrs() path "
                      "aborts the kernel on EPERM and tolerates EOPNOTSUPP (jail experiment, "
                      "pitfall 1); lo was brought up by the jail's pid 1, not by the kernel"));
  for (const auto& block : blocks_outside(0, kSmallValues, kLow32 & ~kSmallValues,
                                          {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK})) {
    t.push_back(socket_row({block},
                           "loopback network: families 0-31 but AF_UNIX, AF_INET, AF_INET6 "
                           "(AF_PACKET, AF_KEY, AF_APPLETALK, AF_X25, AF_AX25, …) (E12)"));
  }
  t.push_back(socket_row({arg_differs(0, kLow32 & ~kSmallValues, 0)},
                         "loopback network: families 32 and up (AF_ALG, AF_VSOCK, AF_XDP, "
                         "AF_MCTP, …) (E12)"));
  for (const std::uint64_t family : {std::uint64_t{AF_INET}, std::uint64_t{AF_INET6}}) {
    const SeccompArg is_family = arg_equals(0, kLow32, family);
    const std::string name = family == AF_INET ? "AF_INET" : "AF_INET6";
    for (const auto& block : blocks_outside(1, kSocketTypeMask, 0, {SOCK_STREAM, SOCK_DGRAM})) {
      t.push_back(socket_row({is_family, block},
                             "loopback network: " + name +
                                 " of a type other than SOCK_STREAM or SOCK_DGRAM (SOCK_RAW "
                                 "crafts packets, SOCK_PACKET, SOCK_DCCP loads a module) (E12)"));
    }
    for (const auto& block :
         blocks_outside(2, kSmallValues, kLow32 & ~kSmallValues, {0, IPPROTO_TCP, IPPROTO_UDP})) {
      t.push_back(socket_row({is_family, block},
                             "loopback network: " + name +
                                 " protocols 1-31 but TCP and UDP (ICMP ping sockets, IGMP, "
                                 "…) (E12)"));
    }
    t.push_back(socket_row({is_family, arg_differs(2, kLow32 & ~kSmallValues, 0)},
                           "loopback network: " + name +
                               " protocols 32 and up (SCTP, UDP-Lite, L2TP, MPTCP, …): each a "
                               "module the kernel would load on demand, with its own CVEs (E12)"));
  }
  return t;
}

std::vector<SeccompRow> build_loopback_table() {
  std::vector<SeccompRow> t;
  for (const auto& row : default_seccomp_table()) {
    if (row.syscall != "socket") {
      t.push_back(row);
    }
  }
  for (auto& row : loopback_socket_rows()) {
    t.push_back(std::move(row));
  }
  return t;
}

struct FilterRelease {
  void operator()(void* ctx) const { seccomp_release(ctx); }
};
using Filter = std::unique_ptr<void, FilterRelease>;

std::string hex(std::uint64_t v) {
  char buf[24];
  static_cast<void>(std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v)));
  return buf;
}

std::string describe_arg(const SeccompArg& a) {
  std::string text = "a" + std::to_string(a.index);
  if (a.mask != kAllBits) {
    text += " & " + hex(a.mask);
  }
  return text + (a.not_equal ? " != " : " == ") + hex(a.value);
}

std::string describe_row(const SeccompRow& row) {
  const char* name = strerrorname_np(row.errno_value);
  std::string text =
      row.syscall + " -> " + (name != nullptr ? name : std::to_string(row.errno_value));
  for (const auto& a : row.args) {
    text += ", " + describe_arg(a);
  }
  return text;
}

Error bad_row(const SeccompRow& row, const std::string& why) {
  return make_error(ErrorCode::kInvalidArgument, "seccomp_bad_row",
                    "seccomp row '" + describe_row(row) + "': " + why);
}

// SCMP_CMP is a C compound literal, which ISO C++ lacks.
scmp_arg_cmp compare(unsigned index, scmp_compare op, std::uint64_t datum_a,
                     std::uint64_t datum_b = 0) {
  scmp_arg_cmp cmp{};
  cmp.arg = index;
  cmp.op = op;
  cmp.datum_a = datum_a;
  cmp.datum_b = datum_b;
  return cmp;
}

// The libseccomp conditions any one of which makes `a` true.
std::vector<scmp_arg_cmp> alternatives(const SeccompArg& a) {
  std::vector<scmp_arg_cmp> out;
  if (!a.not_equal) {
    if (a.mask == kAllBits) {
      out.push_back(compare(a.index, SCMP_CMP_EQ, a.value));
    } else {
      out.push_back(compare(a.index, SCMP_CMP_MASKED_EQ, a.mask, a.value));
    }
  } else if (a.mask == kAllBits) {
    out.push_back(compare(a.index, SCMP_CMP_NE, a.value));
  } else {
    // libseccomp has no masked not-equal: (x & m) != v iff some bit of m differs from v's.
    for (unsigned b = 0; b < 64; ++b) {
      const std::uint64_t bit = std::uint64_t{1} << b;
      if ((a.mask & bit) != 0) {
        out.push_back(compare(a.index, SCMP_CMP_MASKED_EQ, bit, ~a.value & bit));
      }
    }
  }
  return out;
}

// A row as libseccomp rules (an OR of ANDs, one condition per argument in each).
Result<std::vector<std::vector<scmp_arg_cmp>>> row_to_rules(const SeccompRow& row) {
  if (row.errno_value <= 0 || row.errno_value > kMaxErrno) {
    return bad_row(row, "errno must be in 1.." + std::to_string(kMaxErrno));
  }
  if (row.reason.empty()) {
    return bad_row(row, "every row needs a reason");
  }
  std::vector<std::vector<scmp_arg_cmp>> rules{{}};
  bool seen[kSyscallArgCount] = {};
  for (const auto& a : row.args) {
    if (a.index >= kSyscallArgCount) {
      return bad_row(row, "argument index must be 0..5");
    }
    if (seen[a.index]) {
      return bad_row(row,
                     "two conditions on one argument; libseccomp takes one per argument in "
                     "a rule, so write separate rows");
    }
    seen[a.index] = true;
    if (a.mask == 0 || (a.value & ~a.mask) != 0) {
      return bad_row(row,
                     "the value must lie inside a non-zero mask, or the condition is "
                     "constant");
    }
    const auto alts = alternatives(a);
    if (rules.size() * alts.size() > kMaxRulesPerRow) {
      return bad_row(
          row, "expands to more than " + std::to_string(kMaxRulesPerRow) + " libseccomp rules");
    }
    std::vector<std::vector<scmp_arg_cmp>> next;
    for (const auto& rule : rules) {
      for (const auto& alt : alts) {
        next.push_back(rule);
        next.back().push_back(alt);
      }
    }
    rules = std::move(next);
  }
  return rules;
}

Result<void> set_attr(const Filter& filter, scmp_filter_attr attr, std::uint32_t value,
                      const char* attr_name) {
  if (const int rc = seccomp_attr_set(filter.get(), attr, value); rc < 0) {
    return errno_error(ErrorCode::kInternal, "seccomp_attr_failed",
                       std::string("seccomp_attr_set(") + attr_name + ")", -rc);
  }
  return ok_result();
}

Result<void> add_row(const Filter& filter, const SeccompRow& row) {
  const int nr = seccomp_syscall_resolve_name(row.syscall.c_str());
  if (nr == __NR_SCMP_ERROR) {
    return make_error(ErrorCode::kInvalidArgument, "seccomp_unknown_syscall",
                      "seccomp_syscall_resolve_name('" + row.syscall + "'): libseccomp " +
                          std::to_string(seccomp_version()->major) + "." +
                          std::to_string(seccomp_version()->minor) + " does not know this syscall");
  }
  if (nr < 0) {
    return make_error(ErrorCode::kInvalidArgument, "seccomp_unknown_syscall",
                      "seccomp_syscall_resolve_name('" + row.syscall +
                          "'): not a syscall on this architecture, so the row would do nothing");
  }
  CELLGATE_ASSIGN_OR_RETURN(const auto rules, row_to_rules(row));
  for (const auto& rule : rules) {
    const int rc = seccomp_rule_add_array(filter.get(), SCMP_ACT_ERRNO(row.errno_value), nr,
                                          static_cast<unsigned>(rule.size()), rule.data());
    if (rc < 0) {
      return errno_error(ErrorCode::kInvalidArgument, "seccomp_rule_failed",
                         "seccomp_rule_add(" + describe_row(row) + ")", -rc);
    }
  }
  return ok_result();
}

}  // namespace

const std::vector<SeccompRow>& default_seccomp_table() {
  static const std::vector<SeccompRow> table = build_default_table();
  return table;
}

const std::vector<SeccompRow>& loopback_seccomp_table() {
  static const std::vector<SeccompRow> table = build_loopback_table();
  return table;
}

Result<void> apply_seccomp(const std::vector<SeccompRow>& table) {
  Filter filter(seccomp_init(SCMP_ACT_ALLOW));
  if (!filter) {
    return make_error(ErrorCode::kInternal, "seccomp_init_failed",
                      "seccomp_init(SCMP_ACT_ALLOW) failed (out of memory?)");
  }
  // A syscall through another ABI (int 0x80, x32) kills the process: the table names native
  // syscall numbers only, and i386's socketcall would defeat the argument filters anyway.
  CELLGATE_TRY(set_attr(filter, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS, "ACT_BADARCH"));
  CELLGATE_TRY(set_attr(filter, SCMP_FLTATR_CTL_TSYNC, 1, "CTL_TSYNC"));
  // Report the kernel's own errno from seccomp_load, not libseccomp's -ECANCELED.
  CELLGATE_TRY(set_attr(filter, SCMP_FLTATR_API_SYSRAWRC, 1, "API_SYSRAWRC"));
  for (const auto& row : table) {
    CELLGATE_TRY(add_row(filter, row));
  }
  // libseccomp sets no_new_privs itself if the caller has not (SCMP_FLTATR_CTL_NNP defaults on).
  if (const int rc = seccomp_load(filter.get()); rc != 0) {
    const int err = rc < 0 ? -rc : ESRCH;  // positive: a thread TSYNC could not synchronize
    return errno_error(ErrorCode::kFailedPrecondition, "seccomp_load_failed",
                       "seccomp_load(" + std::to_string(table.size()) + " rows, TSYNC)", err);
  }
  return ok_result();
}

std::string describe_seccomp_support() {
  const scmp_version* v = seccomp_version();
  std::string text = "libseccomp " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                     "." + std::to_string(v->micro) + " (API level " +
                     std::to_string(seccomp_api_get()) + ")";
  // SECCOMP_GET_ACTION_AVAIL (Linux 4.14) answers for the two actions the filter uses.
  for (std::uint32_t action :
       {std::uint32_t{SECCOMP_RET_ERRNO}, std::uint32_t{SECCOMP_RET_KILL_PROCESS}}) {
    if (syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action) != 0) {
      const int err = errno;
      const char* name = strerrorname_np(err);
      return text + ", filter mode unavailable: seccomp(SECCOMP_GET_ACTION_AVAIL, " + hex(action) +
             "): " + (name != nullptr ? name : std::to_string(err)) +
             " (the kernel needs CONFIG_SECCOMP_FILTER, Linux 4.14 or later)";
    }
  }
  text += ", filter mode available";
  if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) == 2) {
    text += " (this process is already filtered)";
  }
  return text;
}

}  // namespace cellgate::jail
