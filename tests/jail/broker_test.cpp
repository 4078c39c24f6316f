// The privileged broker of `serve --user` (kernel-launcher/broker/, broker.hpp), seen from where an
// attacker who took over the gateway would stand: a process running as the gateway's unprivileged
// uid, holding the broker's channel and writing raw requests on it. It must get jailed kernels of
// the configured policy only, be refused everything else with a reason, and be unable to signal any
// process but its own kernels (and those only through the broker).
#include "cellgate/broker/broker.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "cellgate/jail/jail.hpp"
#include "placement.hpp"

namespace cellgate::broker {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr uid_t kGatewayUid = 64123;
constexpr gid_t kGatewayGid = 64123;
constexpr uid_t kFirstUid = 2900000;
constexpr uid_t kLastUid = 2900009;

// The probe kernel: records what it is (uid, seccomp, no_new_privs, capabilities, network
// namespace) in its work dir, then waits to be signalled.
const char* kProbe =
    "import os, time\n"
    "status = open('/proc/self/status').read()\n"
    "net = os.readlink('/proc/self/ns/net')\n"
    "open('/home/kernel/probe.txt.tmp', 'w').write(status + 'NetNs:\\t' + net + '\\n')\n"
    "os.rename('/home/kernel/probe.txt.tmp', '/home/kernel/probe.txt')\n"
    "time.sleep(300)\n";

std::string field(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + ":", 0) == 0) {
      auto v = line.substr(name.size() + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  return "";
}

// One request, its reply (events before it are skipped).
json call(int fd, json request) {
  static std::uint64_t next_id = 1;
  const std::uint64_t id = next_id++;
  request["id"] = id;
  const std::string text = request.dump();
  if (::send(fd, text.data(), text.size(), MSG_NOSIGNAL) < 0) {
    return {{"ok", false}, {"message", "send failed"}};
  }
  return [&] {
    std::string buf(1 << 20, '\0');
    for (;;) {
      const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0) {
        return json{{"ok", false}, {"message", "the broker closed the channel"}};
      }
      json j = json::parse(buf.substr(0, static_cast<std::size_t>(n)), nullptr, false);
      if (j.is_object() && j.value("id", std::uint64_t{0}) == id) {
        return j;
      }
    }
  }();
}

// The next "exited" event within `timeout`; null when none.
json next_event(int fd, std::chrono::milliseconds timeout) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string buf(1 << 20, '\0');
  const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
  if (n <= 0) {
    return nullptr;
  }
  return json::parse(buf.substr(0, static_cast<std::size_t>(n)), nullptr, false);
}

class BrokerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0 || jail::testing::rootless()) {
      GTEST_SKIP() << "privilege separation is for a gateway started as real root";
    }
    char templ[] = "/tmp/cellgate-broker-test-XXXXXX";
    ASSERT_NE(::mkdtemp(templ), nullptr);
    state_dir_ = templ;
    ::chmod(state_dir_.c_str(), 0711);
    for (const char* sub : {"/run", "/work"}) {
      const std::string d = state_dir_ + sub;
      ASSERT_EQ(::mkdir(d.c_str(), 0710), 0);
      ASSERT_EQ(::chown(d.c_str(), 0, kGatewayGid), 0);
    }
    auto channel = broker_channel();
    ASSERT_TRUE(channel) << channel.error().message;
    BrokerPolicy policy;
    policy.state_dir = state_dir_;
    policy.jail.cgroup_parent = jail::testing::cgroup_parent();
    policy.first_uid = kFirstUid;
    policy.last_uid = kLastUid;
    policy.access_gid = kGatewayGid;
    policy.backend.launcher_path = cellgate::jail::testing::bin_dir() + "/cellgate-kernel";
    policy.find_kernelspec = [](const std::string& name) -> Result<kernel::KernelSpec> {
      if (name != "probe") {
        return make_error(ErrorCode::kNotFound, "no_such_kernelspec",
                          "no kernelspec named '" + name + "'");
      }
      kernel::KernelSpec spec;
      spec.name = "probe";
      spec.argv = {"/usr/bin/python3", "-c", kProbe};
      return spec;
    };
    broker_pid_ = ::fork();
    ASSERT_GE(broker_pid_, 0);
    if (broker_pid_ == 0) {
      channel->first.reset();
      ::_exit(serve_broker(std::move(channel->second), std::move(policy)));
    }
    channel->second.reset();
    gateway_end_ = std::move(channel->first);
  }

  void TearDown() override {
    gateway_end_.reset();
    if (broker_pid_ > 0) {
      int status = 0;
      ::waitpid(broker_pid_, &status, 0);
    }
    if (!state_dir_.empty()) {
      std::error_code ec;
      fs::remove_all(state_dir_, ec);
    }
  }

  // Runs `body` in a child that is the gateway's user (no capabilities, no_new_privs) holding
  // the channel; returns what it returned (or why it could not run).
  std::string as_gateway(const std::function<std::string(int fd)>& body) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      return "pipe failed";
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(out[0]);
      std::string result;
      auto dropped = jail::drop_privileges(kGatewayUid, kGatewayGid);
      if (!dropped || !jail::set_no_new_privs()) {
        result = "could not become the gateway user";
      } else {
        result = body(gateway_end_.get());
      }
      [[maybe_unused]] auto n = ::write(out[1], result.data(), result.size());
      ::_exit(0);
    }
    ::close(out[1]);
    std::string result;
    char buf[4096];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) {
      result.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return result;
  }

  // Kernel ids are made unique per test process: their cgroups are named after them.
  static std::string kid(const std::string& name) {
    return name + "-" + std::to_string(::getpid());
  }

  json launch_request(const std::string& kernel_id, uid_t uid) const {
    return {{"op", "launch"},
            {"kernel_id", kernel_id == "../../etc" ? kernel_id : kid(kernel_id)},
            {"kernelspec", "probe"},
            {"uid", uid},
            {"env", {{"PATH", "/usr/bin:/bin"}}}};
  }

  std::string state_dir_;
  pid_t broker_pid_ = -1;
  UniqueFd gateway_end_;
};

TEST_F(BrokerTest, RefusesEverythingOutsideItsPolicyWithAReason) {
  const std::string report = as_gateway([this](int fd) {
    json out = json::object();
    json weaker = launch_request("k1", kFirstUid);
    weaker["jail"] = {{"network", true}, {"seccomp", false}};
    out["weaker_jail"] = call(fd, weaker);
    json argv = launch_request("k1", kFirstUid);
    argv["argv"] = {"/bin/sh", "-c", "id"};
    out["other_binary"] = call(fd, argv);
    json spec = launch_request("k1", kFirstUid);
    spec["kernelspec"] = "/bin/sh";
    out["unknown_kernelspec"] = call(fd, spec);
    out["uid_root"] = call(fd, launch_request("k1", 0));
    out["uid_outside"] = call(fd, launch_request("k1", kLastUid + 1));
    out["gateway_uid"] = call(fd, launch_request("k1", kGatewayUid));
    out["path_id"] = call(fd, launch_request("../../etc", kFirstUid));
    json work = launch_request("k1", kFirstUid);
    work["work_dir"] = "/etc";
    out["work_dir"] = call(fd, work);
    out["signal_unknown"] = call(fd, {{"op", "signal"}, {"handle", 99}, {"signal", SIGKILL}});
    out["release_path"] = call(fd, {{"op", "release_work"}, {"kernel_id", ".."}});
    out["unknown_op"] = call(fd, {{"op", "exec"}, {"argv", {"/bin/sh"}}});
    const std::string junk = "{not json";
    ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    out["after_junk"] = call(fd, {{"op", "wait_fast"}, {"timeout_ms", 0}});
    return out.dump();
  });
  json r = json::parse(report, nullptr, false);
  ASSERT_TRUE(r.is_object()) << report;
  for (const char* refused :
       {"weaker_jail", "other_binary", "unknown_kernelspec", "uid_root", "uid_outside",
        "gateway_uid", "path_id", "work_dir", "signal_unknown", "release_path", "unknown_op"}) {
    SCOPED_TRACE(refused);
    EXPECT_FALSE(r[refused].value("ok", true)) << r[refused].dump();
    EXPECT_FALSE(r[refused].value("message", "").empty()) << r[refused].dump();
  }
  EXPECT_NE(r["weaker_jail"].value("message", "").find("unknown field 'jail'"), std::string::npos);
  EXPECT_NE(r["unknown_kernelspec"].value("message", "").find("no kernelspec"), std::string::npos);
  EXPECT_NE(r["uid_outside"].value("message", "").find("outside the kernels' range"),
            std::string::npos);
  // A malformed message is answered and changes nothing: the next request is served.
  EXPECT_TRUE(r["after_junk"].value("ok", false)) << r["after_junk"].dump();
  // Nothing of the refused launches was made.
  EXPECT_TRUE(fs::is_empty(state_dir_ + "/work"));
}

// The request parser (kernel-launcher/broker/src/request.cpp) from the attacker's seat: messages
// too large or too deep, fields of the wrong type, ops that do not exist and descriptors passed
// along are each refused with a reason, and the broker goes on serving.
TEST_F(BrokerTest, ItsParserRefusesOversizedMistypedAndUnknownRequests) {
  const std::string report = as_gateway([this](int fd) {
    json out = json::object();
    json uid_text = launch_request("k1", kFirstUid);
    uid_text["uid"] = std::to_string(kFirstUid);
    out["uid_as_text"] = call(fd, uid_text);
    json env_number = launch_request("k1", kFirstUid);
    env_number["env"] = {{"PATH", 7}};
    out["env_value_number"] = call(fd, env_number);
    json env_list = launch_request("k1", kFirstUid);
    env_list["env"] = json::array({"PATH=/bin"});
    out["env_as_list"] = call(fd, env_list);
    out["handle_as_text"] = call(fd, {{"op", "signal"}, {"handle", "1"}, {"signal", SIGTERM}});
    out["signal_missing"] = call(fd, {{"op", "signal"}, {"handle", 1}});
    out["timeout_as_text"] = call(fd, {{"op", "wait_fast"}, {"timeout_ms", "10"}});
    out["op_ptrace"] = call(fd, {{"op", "ptrace"}, {"pid", 1}});
    out["op_number"] = call(fd, {{"op", 3}});
    json deep = {{"op", "stop"}};
    json* at = &deep["handle"];
    for (int i = 0; i < 5000; ++i) {
      *at = json::array({nullptr});
      at = &(*at)[0];
    }
    out["deep"] = call(fd, deep);
    json long_spec = launch_request("k1", kFirstUid);
    long_spec["kernelspec"] = std::string(100000, 'p');
    out["long_kernelspec"] = call(fd, long_spec);
    // More than the channel's 4 MiB: the kernel may refuse to send it (EMSGSIZE, past the
    // socket's buffer) or the broker refuses it; either way nothing of it is taken.
    int sndbuf = 16 << 20;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    const std::string huge((4u << 20) + 16, ' ');
    out["huge_sent"] = ::send(fd, huge.data(), huge.size(), MSG_NOSIGNAL) >= 0;
    // A descriptor passed along with a request: the broker takes none.
    {
      const std::string text = json{{"op", "wait_fast"}, {"id", 777}, {"timeout_ms", 0}}.dump();
      iovec iov{const_cast<char*>(text.data()), text.size()};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      const int passed = 0;
      std::memcpy(CMSG_DATA(cm), &passed, sizeof passed);
      out["fd_sent"] = ::sendmsg(fd, &msg, MSG_NOSIGNAL) >= 0;
    }
    out["after"] = call(fd, {{"op", "wait_fast"}, {"timeout_ms", 0}});
    return out.dump();
  });
  json r = json::parse(report, nullptr, false);
  ASSERT_TRUE(r.is_object()) << report;
  for (const char* refused :
       {"uid_as_text", "env_value_number", "env_as_list", "handle_as_text", "signal_missing",
        "timeout_as_text", "op_ptrace", "op_number", "deep", "long_kernelspec"}) {
    SCOPED_TRACE(refused);
    EXPECT_FALSE(r[refused].value("ok", true)) << r[refused].dump();
    EXPECT_EQ(r[refused].value("reason", ""), "broker_refused") << r[refused].dump();
    EXPECT_FALSE(r[refused].value("message", "").empty()) << r[refused].dump();
  }
  EXPECT_NE(r["uid_as_text"].value("message", "").find("wrong type"), std::string::npos);
  EXPECT_NE(r["op_ptrace"].value("message", "").find("unknown op 'ptrace'"), std::string::npos);
  // The message with a descriptor was refused (its id unread: answered as 0), the next served.
  EXPECT_TRUE(r["fd_sent"].get<bool>());
  EXPECT_TRUE(r["after"].value("ok", false)) << r["after"].dump();
  EXPECT_TRUE(fs::is_empty(state_dir_ + "/work"));
}

TEST_F(BrokerTest, TheGatewayGetsAJailedKernelAndSignalsOnlyItsOwn) {
  const std::string report = as_gateway([this](int fd) {
    json out = json::object();
    json launched = call(fd, launch_request("k1", kFirstUid));
    out["launch"] = launched;
    if (!launched.value("ok", false)) {
      return out.dump();
    }
    // The kernel's own account of itself, in its work dir (the gateway reads it through its
    // group, as the files API does).
    const std::string probe = state_dir_ + "/work/" + kid("k1") + "/probe.txt";
    for (int i = 0; i < 300 && !fs::exists(probe); ++i) {
      std::this_thread::sleep_for(50ms);
    }
    std::ifstream in(probe);
    std::stringstream ss;
    ss << in.rdbuf();
    out["probe"] = ss.str();
    const pid_t kernel_pid = launched.value("pid", -1);
    // Directly, as the gateway's uid: no signal reaches the kernel, the broker or anything else.
    auto kill_errno = [](pid_t pid, int sig) { return ::kill(pid, sig) == 0 ? 0 : errno; };
    out["kill_kernel"] = kill_errno(kernel_pid, SIGKILL);
    out["kill_broker"] = kill_errno(::getppid(), SIGKILL);
    out["kill_init"] = kill_errno(1, SIGTERM);
    // Through the broker: only the signals a kernel is sent, only to its kernels.
    const auto handle = launched.value("handle", std::uint64_t{0});
    out["sigstop"] = call(fd, {{"op", "signal"}, {"handle", handle}, {"signal", SIGSTOP}});
    out["second_on_uid"] = call(fd, launch_request("k2", kFirstUid));
    out["sigterm"] = call(fd, {{"op", "signal"}, {"handle", handle}, {"signal", SIGTERM}});
    json ev = next_event(fd, 10s);
    out["event"] = ev;
    return out.dump();
  });
  json r = json::parse(report, nullptr, false);
  ASSERT_TRUE(r.is_object()) << report;
  ASSERT_TRUE(r["launch"].value("ok", false)) << r["launch"].dump();
  const std::string probe = r.value("probe", "");
  ASSERT_FALSE(probe.empty()) << "the probe kernel wrote nothing";
  EXPECT_EQ(field(probe, "Uid"), "2900000\t2900000\t2900000\t2900000");
  EXPECT_EQ(field(probe, "Seccomp"), "2");  // a filter
  EXPECT_EQ(field(probe, "NoNewPrivs"), "1");
  EXPECT_EQ(field(probe, "CapEff"), "0000000000000000");
  EXPECT_EQ(field(probe, "CapBnd"), "0000000000000000");
  EXPECT_NE(field(probe, "NetNs"), fs::read_symlink("/proc/self/ns/net").string())
      << "the kernel shares the host's network namespace";
  EXPECT_EQ(r["kill_kernel"].get<int>(), EPERM);
  EXPECT_EQ(r["kill_broker"].get<int>(), EPERM);
  EXPECT_EQ(r["kill_init"].get<int>(), EPERM);
  EXPECT_FALSE(r["sigstop"].value("ok", true)) << r["sigstop"].dump();
  EXPECT_FALSE(r["second_on_uid"].value("ok", true)) << r["second_on_uid"].dump();
  EXPECT_TRUE(r["sigterm"].value("ok", false)) << r["sigterm"].dump();
  ASSERT_TRUE(r["event"].is_object()) << "no exit reported after SIGTERM";
  EXPECT_EQ(r["event"].value("event", ""), "exited");
}

TEST_F(BrokerTest, ItsKernelsEndWhenTheGatewayGoes) {
  const std::string report =
      as_gateway([this](int fd) { return call(fd, launch_request("k1", kFirstUid)).dump(); });
  json launched = json::parse(report, nullptr, false);
  ASSERT_TRUE(launched.value("ok", false)) << report;
  const pid_t kernel_pid = launched.value("pid", -1);
  ASSERT_GT(kernel_pid, 0);
  EXPECT_EQ(::kill(kernel_pid, 0), 0) << "the kernel should run while its gateway does";
  gateway_end_.reset();  // the gateway (its last holder of the channel) is gone
  int status = 0;
  ASSERT_EQ(::waitpid(broker_pid_, &status, 0), broker_pid_);
  broker_pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = ::kill(kernel_pid, 0) != 0 && errno == ESRCH;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(gone) << "kernel pid " << kernel_pid << " outlived its broker";
  EXPECT_TRUE(fs::is_empty(state_dir_ + "/work"));
  EXPECT_TRUE(fs::is_empty(state_dir_ + "/run"));
}

}  // namespace
}  // namespace cellgate::broker
