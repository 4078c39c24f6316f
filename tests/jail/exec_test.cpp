// Red-team tests of "exec into a running jail" (jail/enter.hpp, cellgate-kernel --exec-into,
// kernel::JailCommand; jail/README.md rows E24–E28): commands run in a real jailed ipykernel's
// jail, started cold and from the zygote, try to leave it. Need root (skip with a reason
// otherwise).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "cellgate/kernel/jail_command.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/proc.hpp"
#include "placement.hpp"
#include "test_zygote.hpp"

namespace cellgate::kernel {
namespace {

constexpr const char* kLauncherCanary = "cellgate-exec-launcher-canary-40c2";
constexpr const char* kGatewayCanary = "cellgate-exec-gateway-canary-9b1e";
constexpr auto kCommandBound = 60s;  // a bound on a hang, not a speed expectation

struct Output {
  std::string out, err;
  launcher::StatusEvent ended;
};

// Reads a command's stdout and stderr until it ends (or the bound passes).
Result<Output> drain(JailCommand& cmd, std::chrono::milliseconds bound = kCommandBound) {
  Output o;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!cmd.exited() || cmd.stdout_fd() >= 0 || cmd.stderr_fd() >= 0 || cmd.pty_fd() >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return make_error(ErrorCode::kDeadlineExceeded, "test", "the command did not end: " + o.out);
    }
    pollfd fds[4] = {{cmd.stdout_fd(), POLLIN, 0},
                     {cmd.stderr_fd(), POLLIN, 0},
                     {cmd.pty_fd(), POLLIN, 0},
                     {cmd.exited() ? -1 : cmd.control_fd(), POLLIN, 0}};
    if (::poll(fds, 4, static_cast<int>(left.count())) <= 0) {
      continue;
    }
    for (int i = 0; i < 3; ++i) {
      if (fds[i].fd >= 0 && fds[i].revents != 0) {
        char buf[4096];
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        if (n <= 0) {
          cmd.close_output(fds[i].fd);
        } else {
          (i == 1 ? o.err : o.out).append(buf, static_cast<std::size_t>(n));
        }
      }
    }
    if (fds[3].fd >= 0 && fds[3].revents != 0) {
      cmd.read_control();
    }
  }
  o.ended = *cmd.exited();
  return o;
}

struct Kernel {
  std::unique_ptr<KernelProcess> process;
  JailTarget target;
  uid_t uid = 0;
};

Result<Kernel> start_kernel(Mode mode, uid_t uid) {
  CELLGATE_ASSIGN_OR_RETURN(KernelSpec ks, find_kernelspec("python3"));
  LaunchRequest req;
  req.spec = std::move(ks);
  req.launcher_path = cellgate::jail::testing::bin_dir() + "/cellgate-kernel";
  req.die_with_parent = true;
  jail::JailSpec spec;
  spec.memory_bytes = 512ull << 20;
  spec.pids = 64;
  spec.tmp_bytes = 8ull << 20;
  spec.uid = uid;
  spec.gid = uid;
  spec.cgroup_parent = cellgate::jail::testing::cgroup_parent();
  req.jail = std::move(spec);
  req.env = default_kernel_env("", /*jailed=*/true);
  req.env["KERNEL_ALLOWED"] = "yes";  // the kernel's allowlisted environment
  req.launcher_env = {{"CELLGATE_CANARY", kLauncherCanary}};
  if (mode == Mode::kZygote) {
    CELLGATE_ASSIGN_OR_RETURN(TestZygote * zygote, shared_zygote());
    req.zygote_socket = zygote->socket();
  }
  Kernel k;
  k.uid = uid;
  CELLGATE_ASSIGN_OR_RETURN(k.process, KernelProcess::start(std::move(req)));
  if (mode == Mode::kZygote && !k.process->from_zygote()) {
    return make_error(ErrorCode::kInternal, "test", "the kernel did not come from the zygote");
  }
  CELLGATE_ASSIGN_OR_RETURN(k.target, k.process->jail_target());
  return k;
}

Result<Output> sh(const Kernel& k, const std::string& script, CommandRequest req = {}) {
  req.argv = {"/bin/sh", "-c", script};
  CELLGATE_ASSIGN_OR_RETURN(auto cmd, JailCommand::start(k.target, req));
  cmd->close_stdin();
  return drain(*cmd);
}

std::string host_ns(pid_t pid, const char* name) {
  auto link = sys::read_link("/proc/" + std::to_string(pid) + "/ns/" + name);
  return link ? *link : "?";
}

class JailExec : public ::testing::TestWithParam<Mode> {
 protected:
  static void TearDownTestSuite() {
    for (auto& k : kernels_) {
      delete k;
      k = nullptr;
    }
  }
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "entering a jail needs root (setns, the kernel's cgroup)";
    }
    if (cellgate::jail::testing::rootless()) {
      GTEST_SKIP() << "exec into a jail is tested as root (jail/README.md)";
    }
    ::setenv("CELLGATE_GATEWAY_SECRET", kGatewayCanary, 1);
    const auto i = static_cast<std::size_t>(GetParam());
    if (kernels_[i] == nullptr) {
      auto k = start_kernel(GetParam(), 3100000 + static_cast<uid_t>(i));
      ASSERT_TRUE(k) << k.error().describe();
      kernels_[i] = new Kernel(std::move(k).value());
    }
    k_ = kernels_[i];
  }
  Kernel* k_ = nullptr;
  static inline Kernel* kernels_[2] = {nullptr, nullptr};
};

TEST_P(JailExec, RunsInTheKernelsNamespaces) {
  auto o = sh(*k_, "for n in mnt pid net ipc uts cgroup user; do readlink /proc/self/ns/$n; done");
  ASSERT_TRUE(o) << o.error().describe();
  std::string want;
  for (const char* n : {"mnt", "pid", "net", "ipc", "uts", "cgroup", "user"}) {
    want += host_ns(k_->target.init_pid, n) + "\n";
    if (std::string(n) != "user") {
      EXPECT_NE(host_ns(k_->target.init_pid, n), host_ns(::getpid(), n)) << n;
    }
  }
  EXPECT_EQ(o->out, want) << o->err;
  EXPECT_EQ(o->ended.exit_code, 0);
}

TEST_P(JailExec, IsInTheKernelsCgroupAsItsUid) {
  CommandRequest req;
  req.argv = {"/bin/sh", "-c", "echo $$; id -u; id -g; cat /proc/self/cgroup; exec sleep 60"};
  auto cmd = JailCommand::start(k_->target, req);
  ASSERT_TRUE(cmd) << cmd.error().describe();
  const pid_t jail_pid = (*cmd)->pid();
  EXPECT_GT(jail_pid, 1);
  // What it printed before it became sleep (the last line of /proc/self/cgroup is "0::…").
  std::string printed;
  const auto printed_by = std::chrono::steady_clock::now() + kCommandBound;
  while (printed.find("\n0::") == std::string::npos &&
         std::chrono::steady_clock::now() < printed_by) {
    pollfd p{(*cmd)->stdout_fd(), POLLIN, 0};
    char buf[1024];
    ssize_t n = 0;
    if (::poll(&p, 1, 1000) > 0 && (n = ::read((*cmd)->stdout_fd(), buf, sizeof buf)) > 0) {
      printed.append(buf, static_cast<std::size_t>(n));
    }
  }
  // Its host pid: the member of the kernel's cgroup whose innermost pid is jail_pid.
  ASSERT_FALSE(k_->target.cgroup_dirs.empty());
  const auto deadline = std::chrono::steady_clock::now() + kCommandBound;
  bool found = false;
  while (!found && std::chrono::steady_clock::now() < deadline) {
    for (const auto& dir : k_->target.cgroup_dirs) {
      std::ifstream procs(dir + "/cgroup.procs");
      int count = 0;
      for (pid_t pid = 0; procs >> pid;) {
        auto status = sys::read_file("/proc/" + std::to_string(pid) + "/status");
        const auto nspid = status ? sys::status_field(*status, "NSpid") : std::nullopt;
        if (nspid && nspid->substr(nspid->rfind('\t') + 1) == std::to_string(jail_pid)) {
          ++count;
        }
      }
      found = count == 1;
      if (!found) {
        break;
      }
    }
    if (!found) {
      std::this_thread::sleep_for(20ms);  // the shell is exec'ing sleep: poll, bounded above
    }
  }
  EXPECT_TRUE(found) << "pid " << jail_pid << " not in every cgroup of the kernel";
  ASSERT_TRUE((*cmd)->signal(SIGKILL));
  auto o = drain(**cmd);
  ASSERT_TRUE(o) << o.error().describe();
  o->out = printed + o->out;
  std::istringstream lines(o->out);
  std::string pid, uid, gid;
  lines >> pid >> uid >> gid;
  EXPECT_EQ(pid, std::to_string(jail_pid));
  EXPECT_EQ(uid, std::to_string(k_->uid));
  EXPECT_EQ(gid, std::to_string(k_->uid));
  // Its cgroup namespace's root is the kernel's cgroup: every hierarchy shows "/".
  EXPECT_EQ(o->out.find("cellgate"), std::string::npos) << o->out;
  EXPECT_EQ(o->ended.signal, SIGKILL);
}

TEST_P(JailExec, SeesOnlyTheJailsProcessesAndFiles) {
  auto o = sh(*k_,
              "ls /proc | grep -c '^[0-9]'; cat /proc/1/environ >/dev/null 2>&1 || echo no-environ;"
              "ls / ; test -e /etc/shadow || echo no-shadow; ls /sys/fs/cgroup 2>&1 | head -1;"
              "for p in /proc/[0-9]*; do readlink $p/exe; done 2>/dev/null | sort -u");
  ASSERT_TRUE(o) << o.error().describe();
  std::istringstream lines(o->out);
  int count = 0;
  lines >> count;
  EXPECT_GT(count, 1);
  EXPECT_LT(count, 12) << o->out;  // pid 1, the kernel, this shell and its children
  EXPECT_NE(o->out.find("no-environ"), std::string::npos);
  EXPECT_NE(o->out.find("no-shadow"), std::string::npos);
  EXPECT_EQ(o->out.find("cellgate-kernel"), std::string::npos) << "the helper is visible";
  EXPECT_EQ(o->out.find("cellgate-zygote\n"), std::string::npos) << o->out;
}

TEST_P(JailExec, KeepsTheSeccompTableAndHasNoPrivileges) {
  auto o = sh(
      *k_,
      "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status;"
      "unshare -r true 2>/dev/null || echo unshare-refused;"
      "mount -t tmpfs x /tmp 2>/dev/null || echo mount-refused;"
      "python3 -c 'import socket; socket.socket(socket.AF_INET)' 2>/dev/null || echo inet-refused");
  ASSERT_TRUE(o) << o.error().describe();
  for (const char* cap : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) {
    EXPECT_NE(o->out.find(std::string(cap) + ":\t0000000000000000"), std::string::npos) << cap;
  }
  EXPECT_NE(o->out.find("NoNewPrivs:\t1"), std::string::npos) << o->out;
  EXPECT_NE(o->out.find("Seccomp:\t2"), std::string::npos) << o->out;
  for (const char* refused : {"unshare-refused", "mount-refused", "inet-refused"}) {
    EXPECT_NE(o->out.find(refused), std::string::npos) << refused << " in " << o->out;
  }
}

TEST_P(JailExec, HasOnlyItsStdioAndTheAllowlistedEnvironment) {
  CommandRequest req;
  req.env = {"FROM_CALLER=1"};
  req.cwd = "/tmp";
  auto o = sh(*k_, "ls /proc/self/fd; echo ---; env; echo ---; pwd; cat /proc/self/limits", req);
  ASSERT_TRUE(o) << o.error().describe();
  const std::string fds = o->out.substr(0, o->out.find("---"));
  EXPECT_EQ(fds, "0\n1\n2\n3\n") << "3 is ls's own directory";
  EXPECT_NE(o->out.find("FROM_CALLER=1\n"), std::string::npos);
  EXPECT_NE(o->out.find("KERNEL_ALLOWED=yes\n"), std::string::npos);
  EXPECT_NE(o->out.find("\n/tmp\n"), std::string::npos);
  EXPECT_EQ(o->out.find(kGatewayCanary), std::string::npos) << "the gateway's environment leaked";
  EXPECT_EQ(o->out.find(kLauncherCanary), std::string::npos) << "the launcher's environment";
  EXPECT_NE(o->out.find("Max processes"), std::string::npos);
}

TEST_P(JailExec, CannotCatchTheHelperOnItsWayIn) {
  // A watcher in the jail opens every process's exe, environ and mem over and over while
  // commands join; the joining processes must never give it the launcher (exe) or its
  // environment (the canary).
  CommandRequest watch;
  watch.argv = {
      "/usr/bin/python3", "-c",
      "import os,sys,time\n"
      "seen=set(); end=time.time()+60\n"
      "print('ready', flush=True)\n"
      "while time.time()<end and not os.path.exists('/tmp/stop-watch'):\n"
      "  for p in os.listdir('/proc'):\n"
      "    if not p.isdigit(): continue\n"
      "    for f in ('exe','environ','mem','fd'):\n"
      "      try:\n"
      "        if f=='exe': seen.add(os.readlink('/proc/%s/exe'%p))\n"
      "        elif f=='fd': seen.update(os.readlink('/proc/%s/fd/%s'%(p,x)) for x in "
      "os.listdir('/proc/%s/fd'%p))\n"
      "        else: seen.add(open('/proc/%s/%s'%(p,f),'rb').read(4096).decode('latin1'))\n"
      "      except Exception: pass\n"
      "print('\\n'.join(sorted(seen)))\n"};
  auto watcher = JailCommand::start(k_->target, watch);
  ASSERT_TRUE(watcher) << watcher.error().describe();
  std::string ready;
  char c = 0;
  while (ready.find('\n') == std::string::npos && ::read((*watcher)->stdout_fd(), &c, 1) == 1) {
    ready += c;
  }
  ASSERT_EQ(ready, "ready\n");
  for (int i = 0; i < 15; ++i) {
    auto o = sh(*k_, "true");
    ASSERT_TRUE(o) << o.error().describe();
  }
  auto stop = sh(*k_, "touch /tmp/stop-watch");
  ASSERT_TRUE(stop) << stop.error().describe();
  auto o = drain(**watcher);
  ASSERT_TRUE(o) << o.error().describe();
  (void)sh(*k_, "rm -f /tmp/stop-watch");
  EXPECT_EQ(o->out.find("cellgate-kernel"), std::string::npos) << o->out;
  EXPECT_EQ(o->out.find(kLauncherCanary), std::string::npos) << o->out;
  EXPECT_EQ(o->out.find("/sys/fs/cgroup"), std::string::npos) << o->out;
  EXPECT_EQ(o->ended.exit_code, 0) << o->err;
}

TEST_P(JailExec, PtraceIsRefused) {
  auto o = sh(*k_,
              "python3 -c \"import ctypes,os; l=ctypes.CDLL(None, use_errno=True);"
              "print(l.ptrace(16, 1, 0, 0), ctypes.get_errno())\"");
  ASSERT_TRUE(o) << o.error().describe();
  EXPECT_EQ(o->out, "-1 1\n") << o->err;  // PTRACE_ATTACH to pid 1: EPERM
}

TEST_P(JailExec, TerminalOfTheJailResizes) {
  CommandRequest req;
  req.argv = {"/bin/sh", "-c", "tty; stty size; read x; stty size"};
  req.pty = PtySize{100, 30};
  auto cmd = JailCommand::start(k_->target, req);
  ASSERT_TRUE(cmd) << cmd.error().describe();
  // Wait for the first size, then resize and let it go on.
  std::string seen;
  const auto deadline = std::chrono::steady_clock::now() + kCommandBound;
  while (seen.find("30 100") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{(*cmd)->pty_fd(), POLLIN, 0};
    if (::poll(&p, 1, 1000) > 0) {
      char buf[512];
      const ssize_t n = ::read((*cmd)->pty_fd(), buf, sizeof buf);
      if (n <= 0) {
        break;
      }
      seen.append(buf, static_cast<std::size_t>(n));
    }
  }
  ASSERT_NE(seen.find("30 100"), std::string::npos) << seen;
  EXPECT_NE(seen.find("/dev/pts/"), std::string::npos) << seen;
  ASSERT_TRUE((*cmd)->resize({120, 40}));
  ASSERT_EQ(::write((*cmd)->pty_fd(), "\n", 1), 1);
  auto o = drain(**cmd);
  ASSERT_TRUE(o) << o.error().describe();
  EXPECT_NE(o->out.find("40 120"), std::string::npos) << o->out;
}

TEST_P(JailExec, CannotReachAnotherKernelAndNothingOutlivesItsKernel) {
  auto other = start_kernel(GetParam(), 3100010 + static_cast<uid_t>(GetParam()));
  ASSERT_TRUE(other) << other.error().describe();
  const pid_t their_init = other->target.init_pid;
  // From this kernel's jail: the other's pid 1 (a host pid) is no process here.
  auto o = sh(*k_, "kill -0 " + std::to_string(their_init) + " 2>/dev/null || echo no-such");
  ASSERT_TRUE(o) << o.error().describe();
  EXPECT_NE(o->out.find("no-such"), std::string::npos) << o->out;
  EXPECT_FALSE(other->process->poll_exit());

  // Commands in the other jail, one with a grandchild that leaves its session, end with it.
  CommandRequest req;
  req.argv = {"/bin/sh", "-c", "setsid sleep 300 & sleep 300"};
  auto cmd = JailCommand::start(other->target, req);
  ASSERT_TRUE(cmd) << cmd.error().describe();
  const auto dirs = other->target.cgroup_dirs;
  other->process.reset();  // ends the kernel
  auto ended = drain(**cmd);
  ASSERT_TRUE(ended) << ended.error().describe();
  EXPECT_EQ(ended->ended.signal, SIGKILL);
  for (const auto& dir : dirs) {
    EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " outlived the kernel";
  }
}

TEST(JailExecRefusals, AReusedPidOrAForeignCgroupIsRefused) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "entering a jail needs root";
  }
  auto k = start_kernel(Mode::kCold, 3100020);
  ASSERT_TRUE(k) << k.error().describe();
  // Our own pid is no jail's pid 1: its namespaces are ours.
  JailTarget host = k->target;
  host.init_pid = ::getpid();
  CommandRequest req;
  req.argv = {"/bin/true"};
  auto refused = JailCommand::start(host, req);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("not the pid 1 of a jail"), std::string::npos)
      << refused.error().message;
  // A cgroup the jail is not in.
  JailTarget foreign = k->target;
  foreign.cgroup_dirs = {std::filesystem::path(foreign.cgroup_dirs.front()).parent_path()};
  refused = JailCommand::start(foreign, req);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("is not in the kernel's cgroup"), std::string::npos)
      << refused.error().message;
  // No cgroup at all: it would escape the limits.
  JailTarget none = k->target;
  none.cgroup_dirs.clear();
  refused = JailCommand::start(none, req);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("no cgroup"), std::string::npos)
      << refused.error().message;
}

INSTANTIATE_TEST_SUITE_P(Modes, JailExec, ::testing::Values(Mode::kCold, Mode::kZygote), mode_name);

}  // namespace
}  // namespace cellgate::kernel
