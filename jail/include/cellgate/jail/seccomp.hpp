// The kernel's seccomp policy: default allow, and a table of denials with a reason on every row.
//
// A row names a syscall, the errno it returns, optionally a condition on one argument (a masked
// compare, as flatpak's and Docker's profiles do), and why it is denied. The table is data, so a
// test can run a probe for every row and assert the exact errno.
//
//   for (const auto& row : default_seccomp_table()) { ... row.syscall, row.errno_value ... }
//   CELLGATE_TRY(apply_seccomp(default_seccomp_table()));   // last step before execve
//
// Architecture: the filter is built for the native architecture only; a syscall made through any
// other ABI (int 0x80 on x86_64, x32) kills the process, so it cannot be used to dodge the table.
//
// Thread-safety: default_seccomp_table() returns an immutable table. apply_seccomp() filters the
// calling process (all threads with SECCOMP_FILTER_FLAG_TSYNC); call it after no_new_privs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::jail {

struct SeccompArg {
  unsigned index = 0;      // which argument (0-5)
  std::uint64_t mask = 0;  // (arg & mask) == value
  std::uint64_t value = 0;
  bool not_equal = false;  // true: (arg & mask) != value  — used as "any other value"
};

struct SeccompRow {
  std::string syscall;           // name as libseccomp knows it, e.g. "ptrace"
  int errno_value = 0;           // EPERM, ENOSYS, EOPNOTSUPP, …
  std::vector<SeccompArg> args;  // empty: every call; several: all must match (separate args)
  std::string reason;            // why, with a CVE or a reference where there is one
};

const std::vector<SeccompRow>& default_seccomp_table();

// The table of a kernel with a loopback network (JailSpec::loopback_network): the default table
// with its `socket` rows replaced, so that AF_INET and AF_INET6 sockets of type SOCK_STREAM or
// SOCK_DGRAM with protocol 0, IPPROTO_TCP or IPPROTO_UDP open; every other family (AF_NETLINK
// still EOPNOTSUPP, the rest EPERM), type (SOCK_RAW, SOCK_PACKET, SOCK_SEQPACKET, SOCK_DCCP, …)
// and protocol (ICMP, SCTP, L2TP, UDP-Lite, MPTCP, …, whose modules the kernel would autoload)
// is refused. Families, types and protocols are compared on their low 32 bits, the int the
// kernel reads. socketpair is unchanged (AF_UNIX only).
const std::vector<SeccompRow>& loopback_seccomp_table();

// Loads the table as a filter on the calling process: default allow; each row returns its errno.
// Fails with a message naming the syscall or libseccomp call that failed.
Result<void> apply_seccomp(const std::vector<SeccompRow>& table);

// libseccomp's version and whether the running kernel supports seccomp filters, for the
// start-up log: "libseccomp 2.5.4, filter mode available".
std::string describe_seccomp_support();

}  // namespace cellgate::jail
