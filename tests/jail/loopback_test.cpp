// The debugger's loopback network, below the kernel: the seccomp table a loopback kernel gets
// (loopback_seccomp_table) answers exactly as its rows say under the real filter, for every
// family, type and protocol class, and opens only AF_INET/AF_INET6 TCP and UDP beside AF_UNIX;
// bring_up_loopback brings lo up in a new network namespace and fails, naming the call, where it
// cannot. A kernel in the jail with it is red-teamed in containment_test.cpp (JailLoopback).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/seccomp.hpp"
#include "placement.hpp"

namespace cellgate::jail {
namespace {

constexpr std::uint64_t kHigh = std::uint64_t{1} << 32;
// What the test's copy of the table answers instead of EPERM, so that a refusal by the filter
// cannot be mistaken for the kernel's own EPERM.
constexpr int kMarker = EHWPOISON;

bool row_matches(const SeccompRow& row, const std::vector<std::uint64_t>& args) {
  for (const auto& a : row.args) {
    const std::uint64_t v = a.index < args.size() ? args[a.index] : 0;
    if (((v & a.mask) == a.value) == a.not_equal) {
      return false;
    }
  }
  return true;
}

// The table's answer for socket(args): the errno of the first matching row, or 0 (allowed).
int answer(const std::vector<SeccompRow>& table, const std::vector<std::uint64_t>& args) {
  for (const auto& row : table) {
    if (row.syscall == "socket" && row_matches(row, args)) {
      return row.errno_value;
    }
  }
  return 0;
}

TEST(LoopbackSeccomp, OpensOnlyTcpAndUdpOverIpBesideUnix) {
  const auto& t = loopback_seccomp_table();
  EXPECT_EQ(answer(t, {AF_UNIX, SOCK_STREAM, 0}), 0);
  EXPECT_EQ(answer(t, {AF_INET, SOCK_STREAM, 0}), 0);
  EXPECT_EQ(answer(t, {AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP}), 0);
  EXPECT_EQ(answer(t, {AF_INET6, SOCK_DGRAM, IPPROTO_UDP}), 0);
  EXPECT_EQ(answer(t, {AF_INET | kHigh, SOCK_STREAM, IPPROTO_TCP | kHigh}), 0);  // ints to Linux
  EXPECT_EQ(answer(t, {AF_NETLINK, SOCK_RAW, 0}), EOPNOTSUPP);
  EXPECT_EQ(answer(t, {AF_NETLINK | kHigh, SOCK_RAW, 0}), EOPNOTSUPP);
  for (const std::uint64_t family : {std::uint64_t{AF_INET}, std::uint64_t{AF_INET6}}) {
    EXPECT_EQ(answer(t, {family, SOCK_RAW, IPPROTO_RAW}), EPERM);
    EXPECT_EQ(answer(t, {family, SOCK_RAW | SOCK_NONBLOCK, 0}), EPERM);
    EXPECT_EQ(answer(t, {family, SOCK_PACKET, 0}), EPERM);
    EXPECT_EQ(answer(t, {family, SOCK_SEQPACKET, 0}), EPERM);
    EXPECT_EQ(answer(t, {family, SOCK_DCCP, 0}), EPERM);
    EXPECT_EQ(answer(t, {family, SOCK_DGRAM, IPPROTO_ICMP}), EPERM);    // ping sockets
    EXPECT_EQ(answer(t, {family, SOCK_DGRAM, IPPROTO_ICMPV6}), EPERM);  // and their v6 kind
    EXPECT_EQ(answer(t, {family, SOCK_STREAM, IPPROTO_SCTP}), EPERM);
    EXPECT_EQ(answer(t, {family, SOCK_STREAM, IPPROTO_SCTP | kHigh}), EPERM);
    EXPECT_EQ(answer(t, {family, SOCK_DGRAM, IPPROTO_UDPLITE}), EPERM);
    EXPECT_EQ(answer(t, {family, SOCK_DGRAM, 115}), EPERM);  // IPPROTO_L2TP
    EXPECT_EQ(answer(t, {family, SOCK_STREAM, IPPROTO_MPTCP}), EPERM);
  }
  for (const std::uint64_t family : std::initializer_list<std::uint64_t>{
           AF_PACKET, AF_VSOCK, AF_ALG, AF_UNSPEC, AF_KEY, AF_XDP, AF_BLUETOOTH, AF_CAN, AF_TIPC,
           AF_RDS, AF_PACKET | kHigh}) {
    EXPECT_EQ(answer(t, {family, SOCK_STREAM, 0}), EPERM) << family;
  }
  // Families, exhaustively over the low bits: open only AF_UNIX, AF_INET, AF_INET6.
  for (std::uint64_t family = 0; family < 256; ++family) {
    const int expected = family == AF_UNIX || family == AF_INET || family == AF_INET6 ? 0
                         : family == AF_NETLINK                                       ? EOPNOTSUPP
                                                                                      : EPERM;
    EXPECT_EQ(answer(t, {family, SOCK_STREAM, 0}), expected) << family;
  }
}

TEST(LoopbackSeccomp, EveryOtherRowIsTheDefaultTables) {
  std::vector<std::string> loopback;
  std::vector<std::string> plain;
  for (const auto& row : loopback_seccomp_table()) {
    if (row.syscall != "socket") {
      loopback.push_back(row.syscall + ": " + row.reason);
    }
  }
  for (const auto& row : default_seccomp_table()) {
    if (row.syscall != "socket") {
      plain.push_back(row.syscall + ": " + row.reason);
    }
  }
  EXPECT_EQ(loopback, plain);
  // socketpair stays AF_UNIX only.
  for (const auto& row : loopback_seccomp_table()) {
    if (row.syscall == "socketpair" && row.errno_value == EPERM) {
      ASSERT_EQ(row.args.size(), 1u);
      EXPECT_TRUE(row.args[0].not_equal);
      EXPECT_EQ(row.args[0].value, static_cast<std::uint64_t>(AF_UNIX));
    }
  }
}

// Under the real filter, in a child: every call gets what the table says (libseccomp compiles
// the rows as the simulation above reads them).
TEST(LoopbackSeccomp, TheLoadedFilterAnswersAsTheTableSays) {
  std::vector<SeccompRow> table = loopback_seccomp_table();
  for (auto& row : table) {
    if (row.errno_value == EPERM) {
      row.errno_value = kMarker;
    }
  }
  std::vector<std::vector<std::uint64_t>> calls;
  for (std::uint64_t family = 0; family < 64; ++family) {
    calls.push_back({family, SOCK_STREAM, 0});
  }
  for (const std::uint64_t family : {std::uint64_t{AF_INET}, std::uint64_t{AF_INET6}}) {
    for (std::uint64_t type = 0; type < 16; ++type) {
      calls.push_back({family, type, 0});
      calls.push_back({family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0});
    }
    for (std::uint64_t protocol = 0; protocol < 40; ++protocol) {
      calls.push_back({family, SOCK_DGRAM, protocol});
      calls.push_back({family, SOCK_STREAM, protocol});
    }
    for (const std::uint64_t protocol : std::initializer_list<std::uint64_t>{
             115, 132, 136, 255, 256, 262, 0x7FFFFFFF, 132 | kHigh, IPPROTO_TCP | kHigh}) {
      calls.push_back({family, SOCK_STREAM, protocol});
    }
    calls.push_back({family | kHigh, SOCK_RAW, IPPROTO_ICMP});
  }
  calls.push_back({AF_PACKET | kHigh, SOCK_RAW, 0});
  calls.push_back({AF_NETLINK | kHigh, SOCK_RAW, 0});

  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || !apply_seccomp(table)) {
      ::_exit(120);
    }
    for (const auto& c : calls) {
      const long fd = ::syscall(SYS_socket, c[0], c[1], c[2]);
      const int err = fd < 0 ? errno : 0;
      if (fd >= 0) {
        ::close(static_cast<int>(fd));
      }
      if (::write(pipe_fds[1], &err, sizeof err) != sizeof err) {
        ::_exit(121);
      }
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::vector<int> got;
  int err = 0;
  while (::read(pipe_fds[0], &err, sizeof err) == sizeof err) {
    got.push_back(err);
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_EQ(got.size(), calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const int expected = answer(table, calls[i]);
    SCOPED_TRACE("socket(" + std::to_string(calls[i][0]) + ", " + std::to_string(calls[i][1]) +
                 ", " + std::to_string(calls[i][2]) + ")");
    if (expected != 0) {
      EXPECT_EQ(got[i], expected) << std::strerror(got[i]);
    } else {
      EXPECT_NE(got[i], kMarker);  // the kernel's own answer: a socket, or its errno
    }
  }
}

// Runs `fn` in a forked child in a new network namespace (as root); its error text, or "".
template <typename Fn>
std::string in_new_netns(Fn fn) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return "pipe2 failed";
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    std::string text = ::unshare(CLONE_NEWNET) == 0 ? fn() : "unshare failed";
    if (text.empty()) {
      ::_exit(0);
    }
    (void)!::write(pipe_fds[1], text.data(), text.size());
    ::_exit(1);
  }
  ::close(pipe_fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) {
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : (out.empty() ? "failed" : out);
}

TEST(LoopbackBringUp, BringsLoUpInANewNamespace) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root for a network namespace";
  }
  if (!cellgate::jail::testing::has_net_admin()) {
    GTEST_SKIP() << "no CAP_NET_ADMIN here (a container without it): loopback kernels fail "
                    "closed, as the next test shows";
  }
  const std::string err = in_new_netns([]() -> std::string {
    if (auto r = bring_up_loopback(); !r) {
      return r.error().describe();
    }
    // TCP to the namespace's own 127.0.0.1 works now.
    const int srv = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(srv, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(srv, 1) != 0 || ::getsockname(srv, reinterpret_cast<sockaddr*>(&addr), &len)) {
      return std::string("listen: ") + std::strerror(errno);
    }
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return std::string("connect: ") + std::strerror(errno);
    }
    return "";
  });
  EXPECT_EQ(err, "");
}

TEST(LoopbackBringUp, FailsClosedNamingTheCallWithoutThePrivilege) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root for a network namespace";
  }
  const std::string err = in_new_netns([]() -> std::string {
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
      return "setresuid failed";
    }
    auto r = bring_up_loopback();
    return r ? std::string() : r.error().describe();
  });
  EXPECT_NE(err.find("SIOCSIFFLAGS"), std::string::npos) << err;
  EXPECT_NE(err.find("EPERM"), std::string::npos) << err;
}

}  // namespace
}  // namespace cellgate::jail
