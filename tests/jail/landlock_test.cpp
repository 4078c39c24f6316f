// Landlock's step outside a full jail: the policy on the host's own tree, and failing closed on a
// kernel without Landlock, which a seccomp filter answering ENOSYS / EOPNOTSUPP to
// landlock_create_ruleset stands in for. Each case runs in a forked child (a Landlock domain and
// a filter cannot be undone) and reports one line through a pipe. Needs no root.
#include "cellgate/jail/landlock.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>

#include "cellgate/sys/error_text.hpp"

namespace cellgate::jail {
namespace {

// Runs `body` in a child with stderr on the pipe too; returns everything it wrote.
std::string in_child(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) {
    return "pipe failed";
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], STDERR_FILENO);
    const std::string out = body();
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) {
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return out;
}

// A filter that makes landlock_create_ruleset fail with `err`, as on a kernel without Landlock.
bool deny_landlock_with(int err) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_landlock_create_ruleset, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(err) & 0xffff)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

std::string try_open(const char* path, int flags) {
  const int fd = ::open(path, flags | O_CLOEXEC, 0600);
  if (fd < 0) {
    return std::string(path) + " " +
           (errno == EACCES ? "EACCES" : cellgate::sys::error_text(errno)) + "\n";
  }
  ::close(fd);
  if ((flags & O_CREAT) != 0) {
    ::unlink(path);
  }
  return std::string(path) + " ok\n";
}

TEST(Landlock, TheSpecAcceptsLandlockAsOptional) {
  JailSpec spec;
  spec.optional = {"landlock", "swap"};
  EXPECT_TRUE(spec.validate());
  spec.optional = {"landlocks"};
  auto r = spec.validate();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("landlock"), std::string::npos) << r.error().message;
}

TEST(Landlock, WithoutLandlockTheStepFailsClosed) {
  for (int err : {ENOSYS, EOPNOTSUPP}) {
    const std::string out = in_child([err] {
      if (!deny_landlock_with(err)) {
        return std::string("no filter");
      }
      auto r = apply_landlock(JailSpec{});
      return r ? "applied ABI " + std::to_string(*r) : r.error().message;
    });
    EXPECT_NE(out.find("landlock unavailable: the kernel lacks it or boots without lsm="),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("optional"), std::string::npos) << out;
  }
}

TEST(Landlock, WithoutLandlockAnOptionalStepWarnsAndGoesOn) {
  const std::string out = in_child([] {
    if (!deny_landlock_with(ENOSYS)) {
      return std::string("no filter");
    }
    JailSpec spec;
    spec.optional = {"landlock"};
    auto r = apply_landlock(spec);
    return r ? "applied ABI " + std::to_string(*r) : r.error().message;
  });
  EXPECT_NE(out.find("warning: landlock is not applied (allowed as optional)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("applied ABI 0"), std::string::npos) << out;
}

// The policy on this host's tree: /usr readable, /tmp writable, / and /var not at all.
TEST(Landlock, ThePolicyDeniesEverythingOutsideItsRows) {
  if (landlock_abi() == 0) {
    GTEST_SKIP() << "this kernel has no Landlock";
  }
  const std::string tmp = "/tmp/cellgate-landlock-test-" + std::to_string(::getpid());
  const std::string var = "/var/tmp/cellgate-landlock-test-" + std::to_string(::getpid());
  const std::string out = in_child([&] {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      return std::string("no_new_privs failed");
    }
    auto r = apply_landlock(JailSpec{});
    if (!r) {
      return r.error().message;
    }
    return "abi " + std::to_string(*r) + "\n" + try_open("/usr/bin/env", O_RDONLY) +
           try_open("/", O_RDONLY | O_DIRECTORY) + try_open(tmp.c_str(), O_WRONLY | O_CREAT) +
           try_open(var.c_str(), O_WRONLY | O_CREAT);
  });
  EXPECT_NE(out.find("abi " + std::to_string(landlock_abi()) + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("/usr/bin/env ok\n"), std::string::npos) << out;
  EXPECT_NE(out.find("\n/ EACCES\n"), std::string::npos) << out;
  EXPECT_NE(out.find(tmp + " ok\n"), std::string::npos) << out;
  EXPECT_NE(out.find(var + " EACCES\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace cellgate::jail
