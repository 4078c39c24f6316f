// Containment: a jailed ipykernel, driven by cells that try what hostile code would try.
// Each cell prints a verdict; the test asserts on it. Needs root (skips with a reason otherwise).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "cellgate/kernel/client.hpp"
#include "cellgate/kernel/process.hpp"

namespace cellgate::kernel {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kCanaryValue = "cellgate-canary-7f3a9c";

struct Jailed {
  std::unique_ptr<KernelProcess> process;
  std::unique_ptr<KernelClient> client;
};

Result<Jailed> start_jailed(jail::JailSpec spec) {
  Jailed k;
  CELLGATE_ASSIGN_OR_RETURN(KernelSpec ks, find_kernelspec("python3"));
  LaunchRequest req;
  req.spec = std::move(ks);
  req.launcher_path = std::string(CELLGATE_BIN_DIR) + "/cellgate-kernel";
  req.die_with_parent = true;
  req.jail = std::move(spec);
  req.launcher_env = {{"CELLGATE_CANARY", kCanaryValue}};
  CELLGATE_ASSIGN_OR_RETURN(k.process, KernelProcess::start(std::move(req)));
  CELLGATE_ASSIGN_OR_RETURN(k.client, KernelClient::connect(k.process->connection()));
  auto ready = k.client->wait_ready(60s);
  if (!ready) {
    return make_error(ready.error().code, ready.error().reason,
                      ready.error().message + "; kernel log: " + k.process->log_tail());
  }
  return k;
}

// Runs a cell; returns its stdout, or the error "ename: evalue" prefixed with "!".
std::string run(KernelClient& client, const std::string& code,
                std::chrono::milliseconds timeout = 60s) {
  auto r = client.request(Channel::kShell, "execute_request", execute_content(code), timeout);
  if (!r) {
    return "!request: " + r.error().message;
  }
  std::string out;
  for (const auto& [ch, msg] : r->messages) {
    if (msg.msg_type() == "stream" && msg.content.value("name", "") == "stdout") {
      out += msg.content.value("text", "");
    } else if (msg.msg_type() == "error") {
      out += "!" + msg.content.value("ename", "") + ": " + msg.content.value("evalue", "");
    }
  }
  return out;
}

class JailContainment : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) {
      return;
    }
    ::setenv("CELLGATE_GATEWAY_SECRET", kCanaryValue, 1);
    jail::JailSpec spec;
    spec.memory_bytes = 512ull << 20;
    spec.pids = 64;
    spec.tmp_bytes = 8ull << 20;
    auto k = start_jailed(spec);
    ASSERT_TRUE(k) << k.error().describe();
    kernel_ = new Jailed(std::move(k).value());
  }
  static void TearDownTestSuite() {
    delete kernel_;
    kernel_ = nullptr;
  }
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "the jail needs root";
    }
    ASSERT_NE(kernel_, nullptr);
  }
  KernelClient& client() { return *kernel_->client; }
  static Jailed* kernel_;
};
Jailed* JailContainment::kernel_ = nullptr;

TEST_F(JailContainment, RunsAsAnUnprivilegedUidWithNoCapabilities) {
  std::string out = run(client(),
                        "import os\n"
                        "status = open('/proc/self/status').read().splitlines()\n"
                        "f = {l.split(':')[0]: l.split(':')[1].strip() for l in status}\n"
                        "print(os.getuid(), os.getgid(), os.getgroups(), f['CapEff'], f['CapBnd'],"
                        " f['NoNewPrivs'], f['Seccomp'])");
  std::istringstream in(out);
  long uid = 0, gid = 0;
  std::string groups, cap_eff, cap_bnd, nnp, seccomp;
  in >> uid >> gid >> groups >> cap_eff >> cap_bnd >> nnp >> seccomp;
  EXPECT_GE(uid, 1000000) << out;
  EXPECT_GE(gid, 1000000) << out;
  EXPECT_EQ(groups, "[]") << out;
  EXPECT_EQ(cap_eff, "0000000000000000") << out;
  EXPECT_EQ(cap_bnd, "0000000000000000") << out;
  EXPECT_EQ(nnp, "1") << out;
  EXPECT_EQ(seccomp, "2") << out;
}

TEST_F(JailContainment, NetworkSocketsFail) {
  std::string out = run(client(),
                        "import socket, errno\n"
                        "for name in ['AF_INET', 'AF_INET6', 'AF_PACKET', 'AF_NETLINK']:\n"
                        "    try:\n"
                        "        socket.socket(getattr(socket, name), socket.SOCK_RAW if name in"
                        " ('AF_PACKET', 'AF_NETLINK') else socket.SOCK_STREAM).close()\n"
                        "        print(name, 'OPEN')\n"
                        "    except OSError as e:\n"
                        "        # ENOTSUP and EOPNOTSUPP are one number on Linux\n"
                        "        print(name, 'EOPNOTSUPP' if e.errno == errno.EOPNOTSUPP else"
                        " errno.errorcode[e.errno])\n"
                        "socket.socket(socket.AF_UNIX).close(); print('AF_UNIX ok')\n");
  EXPECT_NE(out.find("AF_INET EPERM"), std::string::npos) << out;
  EXPECT_NE(out.find("AF_INET6 EPERM"), std::string::npos) << out;
  EXPECT_NE(out.find("AF_PACKET EPERM"), std::string::npos) << out;
  EXPECT_NE(out.find("AF_NETLINK EOPNOTSUPP"), std::string::npos) << out;
  EXPECT_NE(out.find("AF_UNIX ok"), std::string::npos) << out;
  EXPECT_EQ(out.find("OPEN"), std::string::npos) << out;
}

TEST_F(JailContainment, SecretsInTheEnvironmentAreUnreadable) {
  std::string out = run(client(),
                        "import os\n"
                        "seen = []\n"
                        "for path in ['/proc/self/environ', '/proc/1/environ', '/proc/1/cmdline']:\n"
                        "    try:\n"
                        "        seen.append(open(path, 'rb').read().decode(errors='replace'))\n"
                        "    except OSError as e:\n"
                        "        print(path, type(e).__name__)\n"
                        "import ctypes; ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\n"  // DUMPABLE=1
                        "seen.append(open('/proc/self/environ', 'rb').read().decode())\n"
                        "print('LEAK' if any('" + std::string(kCanaryValue) +
                            "' in s for s in seen + list(os.environ.values())) else 'clean')\n"
                        "print(sorted(os.environ))\n");
  EXPECT_NE(out.find("clean"), std::string::npos) << out;
  EXPECT_EQ(out.find("LEAK"), std::string::npos) << out;
  EXPECT_EQ(out.find("CELLGATE_"), std::string::npos) << out;
}

TEST_F(JailContainment, HostFilesAreAbsentAndTheRootIsReadOnly) {
  const std::string canary = "/root/.cellgate-canary-" + std::to_string(::getpid());
  std::ofstream(canary) << kCanaryValue;
  std::string out = run(client(),
                        "import os, errno\n"
                        "for path in ['/etc/shadow', '" + canary + "', '/root', '/sys/kernel',"
                        " '/home/kernel/../../root', '/var/lib']:\n"
                        "    print(path, os.path.exists(path))\n"
                        "for path in ['/x', '/usr/x', '/etc/x', '/bin/x', '/run/x', '/proc/sys/kernel/hostname']:\n"
                        "    try:\n"
                        "        open(path, 'w').write('x'); print(path, 'WRITTEN')\n"
                        "    except OSError as e:\n"
                        "        print(path, errno.errorcode[e.errno])\n"
                        "for path in ['/tmp/ok', '/home/kernel/ok']:\n"
                        "    open(path, 'w').write('x'); print(path, 'ok')\n");
  ::unlink(canary.c_str());
  EXPECT_NE(out.find("/etc/shadow False"), std::string::npos) << out;
  EXPECT_NE(out.find(canary + " False"), std::string::npos) << out;
  EXPECT_NE(out.find("/root False"), std::string::npos) << out;
  EXPECT_NE(out.find("/sys/kernel False"), std::string::npos) << out;
  EXPECT_EQ(out.find("WRITTEN"), std::string::npos) << out;
  EXPECT_NE(out.find("/tmp/ok ok"), std::string::npos) << out;
  EXPECT_NE(out.find("/home/kernel/ok ok"), std::string::npos) << out;
}

TEST_F(JailContainment, HostProcessesAreInvisible) {
  std::string out = run(client(),
                        "import os\n"
                        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
                        "print(len(pids), pids[:3], open('/proc/1/comm').read().strip(),"
                        " os.uname().nodename)\n");
  std::istringstream in(out);
  int count = 0;
  in >> count;
  EXPECT_GT(count, 0) << out;
  EXPECT_LE(count, 8) << "more processes than a jail holds: " << out;
  EXPECT_NE(out.find("jail"), std::string::npos) << out;
  // The test's own pid is not visible in there.
  EXPECT_EQ(run(client(), "import os; print(os.path.exists('/proc/" + std::to_string(::getpid()) +
                              "/status') and " + std::to_string(::getpid()) + " > 8)"),
            "False\n");
}

TEST_F(JailContainment, PrivilegeEscalationFails) {
  std::string out = run(
      client(),
      "import os, ctypes, errno\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "def check(name, rc):\n"
      "    print(name, 'SUCCEEDED' if rc == 0 else errno.errorcode[ctypes.get_errno()])\n"
      "try:\n"
      "    os.setuid(0); print('setuid SUCCEEDED')\n"
      "except PermissionError:\n"
      "    print('setuid EPERM')\n"
      "check('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n"
      "check('unshare', libc.unshare(0x10000000))\n"      // CLONE_NEWUSER
      "check('unshare_ns', libc.unshare(0x00020000))\n"   // CLONE_NEWNS
      "check('ptrace', libc.ptrace(0, 0, None, None))\n"  // PTRACE_TRACEME
      "check('chroot', libc.chroot(b'/tmp'))\n");
  EXPECT_EQ(out.find("SUCCEEDED"), std::string::npos) << out;
  for (const char* name : {"setuid EPERM", "mount EPERM", "unshare EPERM", "unshare_ns EPERM",
                           "ptrace EPERM", "chroot EPERM"}) {
    EXPECT_NE(out.find(name), std::string::npos) << name << " in\n" << out;
  }
}

TEST_F(JailContainment, FillingTmpStopsAtTheCap) {
  std::string out = run(client(),
                        "import errno\n"
                        "written = 0\n"
                        "try:\n"
                        "    with open('/tmp/fill', 'wb') as f:\n"
                        "        for _ in range(64):\n"
                        "            f.write(b'x' * (1 << 20)); f.flush(); written += 1\n"
                        "    print('NO LIMIT', written)\n"
                        "except OSError as e:\n"
                        "    print(errno.errorcode[e.errno], written)\n"
                        "import os; os.remove('/tmp/fill')\n");
  std::istringstream in(out);
  std::string code;
  int written = 0;
  in >> code >> written;
  EXPECT_EQ(code, "ENOSPC") << out;
  EXPECT_GE(written, 6) << out;   // 8 MiB cap
  EXPECT_LE(written, 8) << out;
}

TEST_F(JailContainment, AForkBombStopsAtPidsMax) {
  std::string out = run(client(),
                        "import os, time, signal\n"
                        "children = []\n"
                        "try:\n"
                        "    for _ in range(500):\n"
                        "        pid = os.fork()\n"
                        "        if pid == 0:\n"
                        "            time.sleep(30); os._exit(0)\n"
                        "        children.append(pid)\n"
                        "    print('UNLIMITED', len(children))\n"
                        "except BlockingIOError:\n"
                        "    print('EAGAIN', len(children))\n"
                        "for pid in children:\n"
                        "    os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)\n",
                        120s);
  std::istringstream in(out);
  std::string verdict;
  int forked = 0;
  in >> verdict >> forked;
  EXPECT_EQ(verdict, "EAGAIN") << out;
  EXPECT_LT(forked, 64) << out;
  // The kernel survives and can fork again once its children are gone.
  EXPECT_EQ(run(client(), "import subprocess; print(subprocess.run(['true']).returncode)"), "0\n");
}

TEST(JailLimits, AllocatingTwiceTheMemoryLimitEndsOnlyThatKernel) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "the jail needs root";
  }
  jail::JailSpec small;
  small.memory_bytes = 256ull << 20;
  auto victim = start_jailed(small);
  ASSERT_TRUE(victim) << victim.error().describe();
  auto bystander = start_jailed(jail::JailSpec{});
  ASSERT_TRUE(bystander) << bystander.error().describe();
  run(*bystander->client, "x = 'kept'");

  auto r = victim->client->request(Channel::kShell, "execute_request",
                                   execute_content("b = bytearray(512 << 20)"), 60s);
  auto ended = victim->process->wait_exit(30s);
  ASSERT_TRUE(ended) << "the kernel did not end";
  EXPECT_EQ(ended->reason, launcher::ExitReason::kOom) << ended->message;
  EXPECT_GE(ended->oom_kills, 1u);
  EXPECT_EQ(run(*bystander->client, "print(x)"), "kept\n");
}

TEST(JailLimits, ABusyLoopGetsAboutItsCpuQuota) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "the jail needs root";
  }
  jail::JailSpec spec;
  spec.cpus = 0.5;
  auto k = start_jailed(spec);
  ASSERT_TRUE(k) << k.error().describe();
  std::string out = run(*k->client,
                        "import time, resource\n"
                        "t0, c0 = time.monotonic(), time.process_time()\n"
                        "while time.monotonic() - t0 < 3: pass\n"
                        "print(round((time.process_time() - c0) / (time.monotonic() - t0), 2))\n");
  double share = std::atof(out.c_str());
  EXPECT_GT(share, 0.3) << out;
  EXPECT_LT(share, 0.7) << out;
}

TEST(JailLimits, AnInvalidSpecStopsTheStartWithAReason) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "the jail needs root";
  }
  jail::JailSpec spec;
  spec.cgroup_group = "../escape";  // not below our cgroup: must be refused, not created
  auto k = start_jailed(spec);
  ASSERT_FALSE(k);
  EXPECT_EQ(k.error().reason, "kernel_setup_error") << k.error().describe();
  EXPECT_NE(k.error().message.find("cgroup_group"), std::string::npos) << k.error().describe();
}

}  // namespace
}  // namespace cellgate::kernel
