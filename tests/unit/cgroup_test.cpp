// CgroupHost / Cgroup against fake cgroupfs trees in a temp dir. The fake plays the kernel's part
// through CgroupTestPeer: it fills each new directory with the control files a kernel would (v2:
// by the parent's cgroup.subtree_control), and empties a directory before it is removed (a real
// cgroupfs rmdir takes its control files along; a plain directory with files would not go). So
// removal is tested here too, on the fake tree; tests/jail/cgroup_test.cpp does it for real.
#include "cellgate/jail/cgroup.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/unique_fd.hpp"

namespace cellgate::jail {

// The seam into CgroupHost's private hooks (declared a friend in cgroup.hpp).
class CgroupTestPeer {
 public:
  static void set_fake_kernel(CgroupHost& host, std::function<void(const std::string&)> mkdir,
                              std::function<void(const std::string&)> rmdir) {
    host.after_mkdir_ = std::move(mkdir);
    host.before_rmdir_ = std::move(rmdir);
  }
  static void set_settle_timeout(CgroupHost& host, std::chrono::milliseconds t) {
    host.settle_timeout_ = t;
  }
};

namespace {

namespace fs = std::filesystem;
using Files = std::map<std::string, std::string>;

constexpr std::uint64_t k64MiB = 64ull << 20;

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Regular files of `dir` and their contents.
Files snapshot(const std::string& dir) {
  Files out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) {
      out[e.path().filename().string()] = read_text(e.path().string());
    }
  }
  return out;
}

std::vector<std::string> split_ws(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string t; in >> t;) {
    out.push_back(t[0] == '+' ? t.substr(1) : t);
  }
  return out;
}

// --- sample /proc/self texts -----------------------------------------------------------------

// This build machine: v1 memory/pids/cpu (cpuacct apart), an unused v2 hierarchy with hugetlb.
constexpr const char* kHybridCgroup =
    "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n"
    "4:memory:/process_api/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";
constexpr const char* kHybridMountinfo =
    "22 1 8:1 / / rw,relatime - ext4 /dev/vda rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

// A systemd v2 host; the gateway runs in its own delegated service cgroup.
constexpr const char* kV2Cgroup = "0::/system.slice/cellgate.service\n";
constexpr const char* kV2Mountinfo =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
constexpr const char* kV2Own = "/sys/fs/cgroup/system.slice/cellgate.service";

// --- the fake cgroupfs ---------------------------------------------------------------------------

class FakeCgroupFs {
 public:
  FakeCgroupFs() {
    char tmpl[] = "/tmp/cellgate-cgroup-test-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    inotify_ = UniqueFd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    v1_files_["memory"] = {{"cgroup.procs", ""},
                           {"tasks", ""},
                           {"memory.limit_in_bytes", "9223372036854771712\n"},
                           {"memory.memsw.limit_in_bytes", "9223372036854771712\n"},
                           {"memory.use_hierarchy", "1\n"},
                           {"memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"},
                           {"memory.usage_in_bytes", "0\n"},
                           {"memory.max_usage_in_bytes", "0\n"}};
    v1_files_["pids"] = {{"cgroup.procs", ""},
                         {"tasks", ""},
                         {"pids.max", "max\n"},
                         {"pids.current", "0\n"},
                         {"pids.events", "max 0\n"}};
    v1_files_["cpu"] = {{"cgroup.procs", ""},
                        {"tasks", ""},
                        {"cpu.cfs_period_us", "100000\n"},
                        {"cpu.cfs_quota_us", "-1\n"},
                        {"cpu.shares", "1024\n"}};
    v2_core_ = {{"cgroup.procs", ""},
                {"cgroup.subtree_control", ""},
                {"cgroup.events", "populated 0\nfrozen 0\n"},
                {"cgroup.kill", ""},
                {"cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"}};
    v2_files_["memory"] = {{"memory.max", "max\n"},
                           {"memory.swap.max", "max\n"},
                           {"memory.current", "0\n"},
                           {"memory.peak", "0\n"},
                           {"memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"}};
    v2_files_["pids"] = {
        {"pids.max", "max\n"}, {"pids.current", "0\n"}, {"pids.events", "max 0\n"}};
    v2_files_["cpu"] = {{"cpu.max", "max 100000\n"}, {"cpu.weight", "100\n"}};
  }
  ~FakeCgroupFs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  const std::string& root() const { return root_; }
  std::string at(const std::string& path) const { return root_ + path; }

  // A v1 hierarchy of `kind` ("memory", "pids", "cpu", or "" for one we never use) mounted at
  // `mount`, with our own cgroup at `own` in it.
  void add_v1(const std::string& mount, const std::string& kind, const std::string& own) {
    mounts_.push_back({at(mount), kind, false});
    make_cgroup_dir(at(mount) + (own == "/" ? "" : own), false);
  }
  void add_v2(const std::string& mount, const std::string& own, const std::string& controllers,
              const std::string& subtree_control) {
    mounts_.push_back({at(mount), "", true});
    const std::string dir = at(mount) + (own == "/" ? "" : own);
    fs::create_directories(dir);
    write_text(dir + "/cgroup.procs", std::to_string(::getpid()) + "\n");
    write_text(dir + "/cgroup.controllers", controllers);
    write_text(dir + "/cgroup.subtree_control", subtree_control);
    watch(dir);
  }

  // Like this build machine (see kHybridCgroup).
  void build_hybrid() {
    add_v1("/sys/fs/cgroup/memory", "memory", "/process_api/abc");
    add_v1("/sys/fs/cgroup/pids", "pids", "/");
    add_v1("/sys/fs/cgroup/cpu", "cpu", "/");
    add_v1("/sys/fs/cgroup/cpuacct", "", "/");
    add_v2("/sys/fs/cgroup/unified", "/", "hugetlb\n", "");
  }
  void build_v2(const std::string& subtree_control = "cpu memory pids\n") {
    add_v2("/sys/fs/cgroup", "/system.slice/cellgate.service",
           "cpuset cpu io memory hugetlb pids rdma misc\n", subtree_control);
  }

  Result<CgroupHost> detect(const std::string& cgroup, const std::string& mountinfo) {
    auto host = CgroupHost::detect(cgroup, mountinfo, root_);
    if (host) {
      CgroupTestPeer::set_fake_kernel(
          *host, [this](const std::string& d) { on_mkdir(d); },
          [this](const std::string& d) { on_rmdir(d); });
      CgroupTestPeer::set_settle_timeout(*host, std::chrono::milliseconds(100));
    }
    return host;
  }

  // Template files of new cgroups; tests drop some to play an older or smaller kernel.
  std::map<std::string, Files>& v1_files() { return v1_files_; }
  std::map<std::string, Files>& v2_files() { return v2_files_; }
  Files& v2_core() { return v2_core_; }
  // Names listed here become directories in new cgroups, so that writing them fails (EISDIR).
  std::vector<std::string>& broken_files() { return broken_; }

  // What the kernel does on mkdir, for code that makes directories without a CgroupHost.
  void kernel_mkdir(const std::string& dir) { on_mkdir(dir); }

  const std::vector<std::string>& made() const { return made_; }
  const std::vector<std::string>& removed() const { return removed_; }

  // Files opened for writing and closed, in order, since the last call (inotify on every
  // cgroup directory the fake made, and on our own cgroups).
  std::vector<std::string> writes() {
    std::vector<std::string> out;
    alignas(inotify_event) char buf[8192];
    while (true) {
      const ssize_t n = ::read(inotify_.get(), buf, sizeof buf);
      if (n <= 0) {
        return out;
      }
      for (ssize_t off = 0; off < n;) {
        inotify_event ev{};
        std::memcpy(&ev, buf + off, sizeof ev);
        const char* name = buf + off + sizeof(inotify_event);
        if ((ev.mask & IN_CLOSE_WRITE) != 0 && ev.len > 0) {
          out.push_back(watched_[ev.wd] + "/" + std::string(name));
        }
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev.len);
      }
    }
  }

 private:
  struct MountInfo {
    std::string dir;
    std::string kind;
    bool v2;
  };

  const MountInfo* mount_of(const std::string& dir) const {
    const MountInfo* best = nullptr;
    for (const auto& m : mounts_) {
      if (dir.compare(0, m.dir.size(), m.dir) == 0 &&
          (best == nullptr || m.dir.size() > best->dir.size())) {
        best = &m;
      }
    }
    return best;
  }

  void watch(const std::string& dir) {
    const int wd = ::inotify_add_watch(inotify_.get(), dir.c_str(), IN_CLOSE_WRITE);
    if (wd >= 0) {
      watched_[wd] = dir;
    }
  }

  void make_cgroup_dir(const std::string& dir, bool /*made_by_code*/) {
    fs::create_directories(dir);
    const MountInfo* m = mount_of(dir);
    ASSERT_NE(m, nullptr) << dir;
    Files files;
    if (m->v2) {
      const auto enabled =
          split_ws(read_text(fs::path(dir).parent_path().string() + "/cgroup.subtree_control"));
      files = v2_core_;
      std::string controllers;
      for (const auto& c : enabled) {
        controllers += (controllers.empty() ? "" : " ") + c;
        const auto& more = v2_files_[c];
        files.insert(more.begin(), more.end());
      }
      files["cgroup.controllers"] = controllers + "\n";
    } else if (!m->kind.empty()) {
      files = v1_files_[m->kind];
    } else {
      files = {{"cgroup.procs", ""}};
    }
    for (const auto& [name, text] : files) {
      if (std::find(broken_.begin(), broken_.end(), name) != broken_.end()) {
        fs::create_directory(dir + "/" + name);
      } else {
        write_text(dir + "/" + name, text);
      }
    }
    watch(dir);
  }

  void on_mkdir(const std::string& dir) {
    ASSERT_EQ(dir.compare(0, root_.size() + 1, root_ + "/"), 0)
        << "mkdir outside the fake: " << dir;
    made_.push_back(dir);
    make_cgroup_dir(dir, true);
  }

  // The kernel removes a cgroup's control files with it, if it has no child cgroups (else rmdir
  // fails with EBUSY, and the files stay).
  void on_rmdir(const std::string& dir) {
    ASSERT_EQ(dir.compare(0, root_.size() + 1, root_ + "/"), 0)
        << "rmdir outside the fake: " << dir;
    auto is_control = [&](const fs::directory_entry& e) {
      return e.is_regular_file() ||
             std::find(broken_.begin(), broken_.end(), e.path().filename()) != broken_.end();
    };
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!is_control(e)) {
        return;
      }
    }
    removed_.push_back(dir);
    for (const auto& e : fs::directory_iterator(dir)) {
      fs::remove_all(e.path());
    }
  }

  std::string root_;
  UniqueFd inotify_;
  std::map<int, std::string> watched_;
  std::vector<MountInfo> mounts_;
  std::map<std::string, Files> v1_files_;
  std::map<std::string, Files> v2_files_;
  Files v2_core_;
  std::vector<std::string> broken_;
  std::vector<std::string> made_;
  std::vector<std::string> removed_;
};

// Limits with only the given fields set (designated initializers would trip
// -Wmissing-field-initializers).
CgroupLimits limits_of(std::optional<std::uint64_t> memory, std::optional<std::int64_t> pids,
                       std::optional<double> cpus) {
  CgroupLimits l;
  l.memory_bytes = memory;
  l.pids = pids;
  l.cpus = cpus;
  return l;
}

CgroupLimits standard_limits() {
  return CgroupLimits{.memory_bytes = k64MiB, .swap_off = true, .pids = 16, .cpus = 0.5};
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A child that waits until killed; reaped by the caller.
pid_t spawn_sleeper() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    while (true) {
      ::pause();
    }
  }
  return pid;
}

// --- detection -----------------------------------------------------------------------------------

TEST(CgroupDetect, HybridHostIsV1WithEachControllerInItsHierarchy) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host) << host.error().describe();
  EXPECT_EQ(host->version(), CgroupVersion::kV1);
  EXPECT_TRUE(host->has_controller("memory"));
  EXPECT_TRUE(host->has_controller("pids"));
  EXPECT_TRUE(host->has_controller("cpu"));
  EXPECT_FALSE(host->has_controller("hugetlb"));
  const std::string d = host->describe();
  EXPECT_TRUE(has(d, "cgroup v1: ")) << d;
  EXPECT_TRUE(has(d, "memory at " + fake.at("/sys/fs/cgroup/memory/process_api/abc"))) << d;
  EXPECT_TRUE(has(d, "pids at " + fake.at("/sys/fs/cgroup/pids") + ",")) << d;
  EXPECT_TRUE(has(d, "cpu at " + fake.at("/sys/fs/cgroup/cpu"))) << d;
  EXPECT_TRUE(has(d, "v2 hierarchy at " + fake.at("/sys/fs/cgroup/unified") + " is not used")) << d;
}

TEST(CgroupDetect, UnifiedHostIsV2WithDelegatedControllers) {
  FakeCgroupFs fake;
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host) << host.error().describe();
  EXPECT_EQ(host->version(), CgroupVersion::kV2);
  for (const char* c : {"memory", "pids", "cpu"}) {
    EXPECT_TRUE(host->has_controller(c)) << c;
  }
  EXPECT_EQ(host->describe(), "cgroup v2 at " + fake.at(kV2Own) + ": memory, pids, cpu delegated");
}

TEST(CgroupDetect, V2ControllerOfferedButNotDelegatedIsMissing) {
  FakeCgroupFs fake;
  fake.build_v2("memory\n");
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host) << host.error().describe();
  EXPECT_TRUE(host->has_controller("memory"));
  EXPECT_FALSE(host->has_controller("pids"));
  EXPECT_FALSE(host->has_controller("cpu"));
  EXPECT_TRUE(has(host->describe(), "pids unavailable: the pids controller is not delegated"))
      << host->describe();
}

TEST(CgroupDetect, ContainerMountRootIsStrippedFromOwnPath) {
  FakeCgroupFs fake;
  // Inside a container the hierarchy's subtree /docker/xyz is mounted at /sys/fs/cgroup/memory.
  fake.add_v1("/sys/fs/cgroup/memory", "memory", "/kernels");
  auto host = fake.detect("4:memory:/docker/xyz/kernels\n",
                          "35 31 0:32 /docker/xyz /sys/fs/cgroup/memory rw - cgroup cgroup "
                          "rw,memory\n");
  ASSERT_TRUE(host) << host.error().describe();
  EXPECT_TRUE(host->has_controller("memory"));
  EXPECT_TRUE(has(host->describe(), "memory at " + fake.at("/sys/fs/cgroup/memory/kernels")))
      << host->describe();
}

TEST(CgroupDetect, CoMountedCpuCpuacctAndEscapedMountPoint) {
  FakeCgroupFs fake;
  fake.add_v1("/sys/fs/cgroup/cpu,cpuacct", "cpu", "/");
  fake.add_v1("/sys/fs/cgroup/my mem", "memory", "/");
  auto host = fake.detect("3:cpu,cpuacct:/\n4:memory:/\n",
                          "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup "
                          "rw,cpu,cpuacct\n"
                          "35 31 0:32 / /sys/fs/cgroup/my\\040mem rw - cgroup cgroup rw,memory\n");
  ASSERT_TRUE(host) << host.error().describe();
  EXPECT_TRUE(host->has_controller("cpu"));
  EXPECT_TRUE(has(host->describe(), "memory at " + fake.at("/sys/fs/cgroup/my mem")))
      << host->describe();
  EXPECT_FALSE(host->has_controller("pids"));
  EXPECT_TRUE(has(host->describe(), "pids unavailable: no cgroup v1 pids hierarchy"))
      << host->describe();
}

TEST(CgroupDetect, ControllerListedButNotMountedIsMissing) {
  FakeCgroupFs fake;
  fake.add_v1("/sys/fs/cgroup/memory", "memory", "/");
  auto host = fake.detect("8:pids:/\n4:memory:/\n",
                          "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  ASSERT_TRUE(host) << host.error().describe();
  EXPECT_TRUE(host->has_controller("memory"));
  EXPECT_FALSE(host->has_controller("pids"));
  EXPECT_TRUE(has(host->describe(), "no mount of the cgroup v1 pids hierarchy"))
      << host->describe();
}

TEST(CgroupDetect, OwnPathOutsideTheMountOrWithDotDotIsNotUsed) {
  FakeCgroupFs fake;
  fake.add_v1("/sys/fs/cgroup/memory", "memory", "/");
  const std::string mi = "35 31 0:32 /a /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
  for (const char* cg :
       {"4:memory:/b\n", "4:memory:/a/../b\n", "4:memory:/..\n", "4:memory:relative\n"}) {
    auto host = fake.detect(cg, mi);
    ASSERT_TRUE(host) << cg;
    EXPECT_FALSE(host->has_controller("memory")) << cg;
  }
}

TEST(CgroupDetect, NoCgroupFilesystemIsAnError) {
  FakeCgroupFs fake;
  for (auto [cg, mi] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"0::/\n", "22 1 8:1 / / rw - ext4 /dev/vda rw\n"}}) {
    auto host = fake.detect(cg, mi);
    ASSERT_FALSE(host);
    EXPECT_EQ(host.error().code, ErrorCode::kFailedPrecondition);
    EXPECT_EQ(host.error().reason, "cgroup_unavailable");
  }
}

TEST(CgroupDetect, GarbageNeverCrashes) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  const std::vector<std::string> junk = {":::\n::\n:\n",
                                         "0\n1:\n2::\n",
                                         std::string("4:memory:\0/x\n", 13),
                                         "4:memory:/process_api/abc",
                                         "- - - - - -\n",
                                         "1 2 3 4 5 6 - cgroup\n",
                                         std::string(3000, ':'),
                                         "\\\\\\0\\777 \\1"};
  auto check = [](const Result<CgroupHost>& host) {
    if (host) {
      EXPECT_FALSE(host->describe().empty());
    } else {
      EXPECT_EQ(host.error().reason, "cgroup_unavailable");
    }
  };
  for (const auto& a : junk) {
    for (const auto& b : junk) {
      check(fake.detect(a, b));
    }
    check(fake.detect(a, kHybridMountinfo));
    check(fake.detect(kHybridCgroup, a));
  }
}

// --- create, v1 ----------------------------------------------------------------------------------

TEST(CgroupCreateV1, WritesEachLimitBelowOwnCgroupInOrder) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  const std::string own_mem = fake.at("/sys/fs/cgroup/memory/process_api/abc");
  const Files own_before = snapshot(own_mem);
  const Files pids_root_before = snapshot(fake.at("/sys/fs/cgroup/pids"));
  fake.writes();
  std::vector<std::string> warnings;
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, &warnings);
  ASSERT_TRUE(cg) << cg.error().describe();
  EXPECT_TRUE(warnings.empty());

  const std::string mem = own_mem + "/cellgate/k1";
  const std::string pids = fake.at("/sys/fs/cgroup/pids/cellgate/k1");
  const std::string cpu = fake.at("/sys/fs/cgroup/cpu/cellgate/k1");
  EXPECT_EQ((*cg)->paths(), (std::vector<std::string>{mem, pids, cpu}));
  EXPECT_EQ(read_text(mem + "/memory.limit_in_bytes"), "67108864");
  EXPECT_EQ(read_text(mem + "/memory.memsw.limit_in_bytes"), "67108864");
  EXPECT_EQ(read_text(pids + "/pids.max"), "16");
  EXPECT_EQ(read_text(cpu + "/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(read_text(cpu + "/cpu.cfs_quota_us"), "50000");
  // memsw after memory (the kernel keeps memsw >= memory); nothing written outside the leaves
  // (memory.use_hierarchy is already 1, so the group is not written either).
  EXPECT_EQ(fake.writes(),
            (std::vector<std::string>{mem + "/memory.limit_in_bytes",
                                      mem + "/memory.memsw.limit_in_bytes", pids + "/pids.max",
                                      cpu + "/cpu.cfs_period_us", cpu + "/cpu.cfs_quota_us"}));
  EXPECT_EQ(snapshot(own_mem), own_before);
  EXPECT_EQ(snapshot(fake.at("/sys/fs/cgroup/pids")), pids_root_before);
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/cpuacct/cellgate")));
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/unified/cellgate")));
}

TEST(CgroupCreateV1, SetsUseHierarchyOnlyOnTheGroupItMade) {
  FakeCgroupFs fake;
  fake.v1_files()["memory"]["memory.use_hierarchy"] = "0\n";
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  const std::string own = fake.at("/sys/fs/cgroup/memory/process_api/abc");
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg) << cg.error().describe();
  EXPECT_EQ(read_text(own + "/cellgate/memory.use_hierarchy"), "1");
  EXPECT_EQ(read_text(own + "/memory.use_hierarchy"), "0\n");
}

TEST(CgroupCreateV1, SwapWithoutAccountingFailsClosedAndLeavesNothing) {
  FakeCgroupFs fake;
  fake.v1_files()["memory"].erase("memory.memsw.limit_in_bytes");
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_FALSE(cg);
  EXPECT_EQ(cg.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(cg.error().reason, "limit_unavailable");
  const std::string& m = cg.error().message;
  EXPECT_TRUE(has(m, "swap limit unavailable")) << m;
  EXPECT_TRUE(has(m, "memory.memsw.limit_in_bytes")) << m;
  EXPECT_TRUE(has(m, "swapaccount=1")) << m;
  EXPECT_FALSE(has(m, "memory limit unavailable")) << m;
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/memory/process_api/abc/cellgate")));
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/pids/cellgate")));
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/cpu/cellgate")));
  EXPECT_EQ(fake.made().size(), 6u);  // group and leaf in three hierarchies, all removed again
  EXPECT_EQ(fake.removed().size(), 6u);
}

TEST(CgroupCreateV1, OptionalSwapIsSkippedWithAWarning) {
  FakeCgroupFs fake;
  fake.v1_files()["memory"].erase("memory.memsw.limit_in_bytes");
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  std::vector<std::string> warnings;
  auto cg = host->create("cellgate", "k1", standard_limits(), {"swap"}, &warnings);
  ASSERT_TRUE(cg) << cg.error().describe();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(has(warnings[0], "'swap' is not enforced")) << warnings[0];
  EXPECT_TRUE(has(warnings[0], "memory.memsw.limit_in_bytes")) << warnings[0];
  EXPECT_EQ(read_text((*cg)->paths()[0] + "/memory.limit_in_bytes"), "67108864");
  EXPECT_FALSE(fs::exists((*cg)->paths()[0] + "/memory.memsw.limit_in_bytes"));
}

TEST(CgroupCreateV1, SwapAllowedLeavesMemswAlone) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  CgroupLimits limits = standard_limits();
  limits.swap_off = false;
  auto cg = host->create("cellgate", "k1", limits, {}, nullptr);
  ASSERT_TRUE(cg) << cg.error().describe();
  EXPECT_EQ(read_text((*cg)->paths()[0] + "/memory.memsw.limit_in_bytes"), "9223372036854771712\n");
}

TEST(CgroupCreateV1, MissingControllersFailClosedBeforeTouchingAnything) {
  FakeCgroupFs fake;
  fake.add_v1("/sys/fs/cgroup/memory", "memory", "/");
  auto host = fake.detect("4:memory:/\n",
                          "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_FALSE(cg);
  EXPECT_EQ(cg.error().reason, "limit_unavailable");
  EXPECT_TRUE(has(cg.error().message, "pids limit unavailable: no cgroup v1 pids hierarchy"))
      << cg.error().message;
  EXPECT_TRUE(has(cg.error().message, "cpu limit unavailable: no cgroup v1 cpu hierarchy"))
      << cg.error().message;
  EXPECT_TRUE(fake.made().empty());
}

TEST(CgroupCreateV1, OptionalMissingControllersWarnAndCreateTheRest) {
  FakeCgroupFs fake;
  fake.add_v1("/sys/fs/cgroup/memory", "memory", "/");
  auto host = fake.detect("4:memory:/\n",
                          "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  ASSERT_TRUE(host);
  std::vector<std::string> warnings;
  auto cg = host->create("cellgate", "k1", standard_limits(), {"pids", "cpu"}, &warnings);
  ASSERT_TRUE(cg) << cg.error().describe();
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_TRUE(has(warnings[0], "'pids' is not enforced")) << warnings[0];
  EXPECT_TRUE(has(warnings[1], "'cpu' is not enforced")) << warnings[1];
  EXPECT_EQ((*cg)->paths(), std::vector<std::string>{fake.at("/sys/fs/cgroup/memory/cellgate/k1")});
}

TEST(CgroupCreateV1, MissingCpuQuotaFileFailsClosed) {
  FakeCgroupFs fake;
  fake.v1_files()["cpu"].erase("cpu.cfs_quota_us");
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_FALSE(cg);
  EXPECT_TRUE(has(cg.error().message, "cpu limit unavailable")) << cg.error().message;
  EXPECT_TRUE(has(cg.error().message, "CONFIG_CFS_BANDWIDTH")) << cg.error().message;
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/cpu/cellgate")));
}

TEST(CgroupCreateV1, WriteErrorNamesFileValueAndErrno) {
  FakeCgroupFs fake;
  fake.broken_files().push_back("pids.max");
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_FALSE(cg);
  EXPECT_EQ(cg.error().message, "write('" + fake.at("/sys/fs/cgroup/pids/cellgate/k1/pids.max") +
                                    "', '16'): EISDIR (Is a directory)");
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/pids/cellgate")));
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/memory/process_api/abc/cellgate")));
}

TEST(CgroupCreateV1, RejectsNamesThatCouldEscapeOrCollide) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  for (const char* bad :
       {"", "..", ".", "a/b", "../x", "cgroup.procs", "memory.max", "a b", "x\n"}) {
    auto cg = host->create("cellgate", bad, standard_limits(), {}, nullptr);
    ASSERT_FALSE(cg) << bad;
    EXPECT_EQ(cg.error().code, ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(cg.error().reason, "bad_cgroup_name");
    auto cg2 = host->create(bad, "k1", standard_limits(), {}, nullptr);
    ASSERT_FALSE(cg2) << bad;
    EXPECT_EQ(cg2.error().reason, "bad_cgroup_name");
  }
  EXPECT_TRUE(fake.made().empty());
}

TEST(CgroupCreateV1, RejectsBadLimits) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  std::vector<CgroupLimits> bad = {limits_of(0, {}, {}),
                                   limits_of({}, 0, {}),
                                   limits_of({}, -3, {}),
                                   limits_of({}, {}, 0.0),
                                   limits_of({}, {}, -1.0),
                                   limits_of({}, {}, 0.001),
                                   limits_of({}, {}, std::numeric_limits<double>::quiet_NaN()),
                                   limits_of({}, {}, std::numeric_limits<double>::infinity())};
  for (const auto& limits : bad) {
    auto cg = host->create("cellgate", "k1", limits, {}, nullptr);
    ASSERT_FALSE(cg);
    EXPECT_EQ(cg.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(cg.error().reason, "bad_limit");
  }
  EXPECT_TRUE(fake.made().empty());
}

TEST(CgroupCreateV1, ExistingLeafIsNotTouched) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto first = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(first);
  const std::string mem = (*first)->paths()[0];
  write_text(mem + "/memory.limit_in_bytes", "1234");
  auto second = host->create("cellgate", "k1", limits_of(1 << 20, {}, {}), {}, nullptr);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().reason, "cgroup_exists");
  EXPECT_TRUE(has(second.error().message, "EEXIST")) << second.error().message;
  EXPECT_EQ(read_text(mem + "/memory.limit_in_bytes"), "1234");
  EXPECT_TRUE(fs::exists(mem));
}

TEST(CgroupCreateV1, GroupStaysWhileASiblingKernelIsInIt) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto a = host->create("cellgate", "a", standard_limits(), {}, nullptr);
  auto b = host->create("cellgate", "b", standard_limits(), {}, nullptr);
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  const std::string group = fake.at("/sys/fs/cgroup/pids/cellgate");
  a.value().reset();
  EXPECT_FALSE(fs::exists(group + "/a"));
  EXPECT_TRUE(fs::exists(group + "/b"));
  b.value().reset();
  EXPECT_FALSE(fs::exists(group));
  EXPECT_TRUE(fs::exists(fake.at("/sys/fs/cgroup/pids/cgroup.procs")));
  EXPECT_TRUE(fs::exists(fake.at("/sys/fs/cgroup/memory/process_api/abc/memory.oom_control")));
}

// --- create, v2 ----------------------------------------------------------------------------------

TEST(CgroupCreateV2, EnablesControllersInTheGroupAndWritesLimits) {
  FakeCgroupFs fake;
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  const std::string own = fake.at(kV2Own);
  const Files own_before = snapshot(own);
  fake.writes();
  CgroupLimits limits = standard_limits();
  limits.cpus = 1.0;
  auto cg = host->create("cellgate", "k1", limits, {}, nullptr);
  ASSERT_TRUE(cg) << cg.error().describe();
  const std::string leaf = own + "/cellgate/k1";
  EXPECT_EQ((*cg)->paths(), std::vector<std::string>{leaf});
  EXPECT_EQ(read_text(own + "/cellgate/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(read_text(leaf + "/memory.max"), "67108864");
  EXPECT_EQ(read_text(leaf + "/memory.swap.max"), "0");
  EXPECT_EQ(read_text(leaf + "/pids.max"), "16");
  EXPECT_EQ(read_text(leaf + "/cpu.max"), "100000 100000");
  EXPECT_EQ(fake.writes(), (std::vector<std::string>{
                               own + "/cellgate/cgroup.subtree_control", leaf + "/memory.max",
                               leaf + "/memory.swap.max", leaf + "/pids.max", leaf + "/cpu.max"}));
  EXPECT_EQ(snapshot(own), own_before);
}

TEST(CgroupCreateV2, HalfACpu) {
  FakeCgroupFs fake;
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", limits_of({}, {}, 0.5), {}, nullptr);
  ASSERT_TRUE(cg) << cg.error().describe();
  EXPECT_EQ(read_text((*cg)->paths()[0] + "/cpu.max"), "50000 100000");
  EXPECT_EQ(read_text((*cg)->paths()[0] + "/memory.max"), "max\n");
}

TEST(CgroupCreateV2, UndelegatedControllerFailsClosedTellingToDelegate) {
  FakeCgroupFs fake;
  fake.build_v2("memory\n");
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  const Files own_before = snapshot(fake.at(kV2Own));
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_FALSE(cg);
  EXPECT_EQ(cg.error().reason, "limit_unavailable");
  const std::string& m = cg.error().message;
  EXPECT_TRUE(has(m, "pids limit unavailable: the pids controller is not delegated")) << m;
  EXPECT_TRUE(has(m, fake.at(kV2Own) + "/cgroup.subtree_control lacks it")) << m;
  EXPECT_TRUE(has(m, "Delegate=yes")) << m;
  EXPECT_TRUE(has(m, "cpu limit unavailable")) << m;
  EXPECT_EQ(snapshot(fake.at(kV2Own)), own_before);
  EXPECT_TRUE(fake.made().empty());
}

TEST(CgroupCreateV2, ControllerNotOfferedSaysWhatTheHostHas) {
  FakeCgroupFs fake;
  fake.add_v2("/sys/fs/cgroup", "/", "cpu io\n", "cpu io\n");
  auto host = fake.detect("0::/\n", kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", limits_of(k64MiB, {}, {}), {}, nullptr);
  ASSERT_FALSE(cg);
  EXPECT_TRUE(has(cg.error().message,
                  "memory limit unavailable: the cgroup v2 hierarchy does not offer the memory "
                  "controller (" +
                      fake.at("/sys/fs/cgroup") + "/cgroup.controllers: 'cpu io')"))
      << cg.error().message;
  EXPECT_TRUE(has(cg.error().message, "swap limit unavailable")) << cg.error().message;
}

TEST(CgroupCreateV2, OptionalCpuEnablesOnlyTheRest) {
  FakeCgroupFs fake;
  fake.build_v2("memory pids\n");
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  std::vector<std::string> warnings;
  auto cg = host->create("cellgate", "k1", standard_limits(), {"cpu"}, &warnings);
  ASSERT_TRUE(cg) << cg.error().describe();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(has(warnings[0], "Delegate=yes")) << warnings[0];
  EXPECT_EQ(read_text(fake.at(kV2Own) + "/cellgate/cgroup.subtree_control"), "+memory +pids");
  EXPECT_FALSE(fs::exists((*cg)->paths()[0] + "/cpu.max"));
  EXPECT_EQ(read_text((*cg)->paths()[0] + "/pids.max"), "16");
}

TEST(CgroupCreateV2, ExistingGroupGetsOnlyWhatItLacks) {
  FakeCgroupFs fake;
  fake.build_v2();
  const std::string group = fake.at(kV2Own) + "/cellgate";
  fs::create_directory(group);
  write_text(group + "/cgroup.procs", "");
  write_text(group + "/cgroup.subtree_control", "memory\n");
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", limits_of({}, 16, 0.5), {}, nullptr);
  ASSERT_TRUE(cg) << cg.error().describe();
  EXPECT_EQ(read_text(group + "/cgroup.subtree_control"), "+pids +cpu");
  EXPECT_EQ(read_text((*cg)->paths()[0] + "/pids.max"), "16");
}

TEST(CgroupCreateV2, MissingSwapMaxFailsClosed) {
  FakeCgroupFs fake;
  fake.v2_files()["memory"].erase("memory.swap.max");
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_FALSE(cg);
  EXPECT_TRUE(has(cg.error().message, "swap limit unavailable: the host lacks"))
      << cg.error().message;
  EXPECT_TRUE(has(cg.error().message, "memory.swap.max")) << cg.error().message;
  EXPECT_FALSE(fs::exists(fake.at(kV2Own) + "/cellgate"));
}

// --- processes, stats, kill, removal
// --------------------------------------------------------------

TEST(CgroupProcs, AddProcessWritesThePidInEveryHierarchy) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  // A pid that cannot be running: the fake's cgroup.procs never empties, and the destructor's
  // kill_all() must not hit a real process. pid_max is at most 2^22.
  constexpr pid_t kNotAPid = 1 << 23;
  ASSERT_TRUE((*cg)->add_process(kNotAPid));
  for (const auto& p : (*cg)->paths()) {
    EXPECT_EQ(read_text(p + "/cgroup.procs"), std::to_string(kNotAPid)) << p;
  }
  EXPECT_EQ((*cg)->add_process(0).error().reason, "bad_pid");
  EXPECT_EQ((*cg)->add_process(-1).error().reason, "bad_pid");
  for (const auto& p : (*cg)->paths()) {
    write_text(p + "/cgroup.procs", "");
  }
}

TEST(CgroupProcs, AddProcessErrorNamesTheFile) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  const std::string procs = (*cg)->paths()[0] + "/cgroup.procs";
  fs::remove(procs);
  auto r = (*cg)->add_process(4242);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message,
            "write('" + procs + "', '4242'): ENOENT (No such file or directory)");
}

TEST(CgroupStats, V1ReadsOomKillPeakAndPidsEvents) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  const auto& p = (*cg)->paths();
  write_text(p[0] + "/memory.oom_control", "oom_kill_disable 0\nunder_oom 1\noom_kill 3\n");
  write_text(p[0] + "/memory.usage_in_bytes", "1234\n");
  write_text(p[0] + "/memory.max_usage_in_bytes", "67108864\n");
  write_text(p[1] + "/pids.current", "7\n");
  write_text(p[1] + "/pids.events", "max 2\n");
  auto s = (*cg)->stats();
  ASSERT_TRUE(s) << s.error().describe();
  EXPECT_EQ(s->oom_kills, 3u);
  EXPECT_EQ(s->memory_current_bytes, 1234u);
  EXPECT_EQ(s->memory_peak_bytes, 67108864u);
  EXPECT_EQ(s->pids_current, 7);
  EXPECT_EQ(s->pids_limit_hits, 2u);
  EXPECT_EQ(s->cpu_usage_usec, 0u);  // cpuacct is not co-mounted with cpu here
}

TEST(CgroupStats, V1CoMountedCpuacctGivesCpuUsage) {
  FakeCgroupFs fake;
  fake.v1_files()["cpu"]["cpuacct.usage"] = "2500000\n";
  fake.add_v1("/sys/fs/cgroup/cpu,cpuacct", "cpu", "/");
  auto host = fake.detect("3:cpu,cpuacct:/\n",
                          "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup "
                          "rw,cpu,cpuacct\n");
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", limits_of({}, {}, 2.0), {}, nullptr);
  ASSERT_TRUE(cg) << cg.error().describe();
  EXPECT_EQ(read_text((*cg)->paths()[0] + "/cpu.cfs_quota_us"), "200000");
  auto s = (*cg)->stats();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->cpu_usage_usec, 2500u);
}

TEST(CgroupStats, V1OldKernelWithoutOomKillLineReportsZero) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  write_text((*cg)->paths()[0] + "/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n");
  auto s = (*cg)->stats();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->oom_kills, 0u);
}

TEST(CgroupStats, V2ReadsMemoryEventsPeakPidsAndCpu) {
  FakeCgroupFs fake;
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  const std::string leaf = (*cg)->paths()[0];
  write_text(leaf + "/memory.events", "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n");
  write_text(leaf + "/memory.current", "4096\n");
  write_text(leaf + "/memory.peak", "65536\n");
  write_text(leaf + "/pids.current", "3\n");
  write_text(leaf + "/pids.events", "max 5\n");
  write_text(leaf + "/cpu.stat", "usage_usec 42\nuser_usec 40\nsystem_usec 2\n");
  auto s = (*cg)->stats();
  ASSERT_TRUE(s) << s.error().describe();
  EXPECT_EQ(s->oom_kills, 2u);
  EXPECT_EQ(s->memory_current_bytes, 4096u);
  EXPECT_EQ(s->memory_peak_bytes, 65536u);
  EXPECT_EQ(s->pids_current, 3);
  EXPECT_EQ(s->pids_limit_hits, 5u);
  EXPECT_EQ(s->cpu_usage_usec, 42u);
}

// cpu.stat's throttling figures: what tells a kernel starved at its quota from a hung one.
TEST(CgroupStats, ThrottlingFromCpuStatV1NanosecondsAndV2Microseconds) {
  FakeCgroupFs v1;
  v1.build_hybrid();
  auto host1 = v1.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host1);
  auto cg1 = host1->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg1);
  const auto& p = (*cg1)->paths();
  const std::string cpu_dir = p.back();  // memory, pids, cpu
  write_text(cpu_dir + "/cpu.stat", "nr_periods 50\nnr_throttled 12\nthrottled_time 3000000\n");
  auto s1 = (*cg1)->stats();
  ASSERT_TRUE(s1) << s1.error().describe();
  EXPECT_EQ(s1->cpu_nr_throttled, 12u);
  EXPECT_EQ(s1->cpu_throttled_usec, 3000u);
  // The gateway's reader of a launcher's cgroup (dirs in any order, cpu.stat in one of them).
  auto r1 = read_cgroup_stats(CgroupVersion::kV1, p);
  ASSERT_TRUE(r1) << r1.error().describe();
  EXPECT_EQ(r1->cpu_nr_throttled, 12u);
  EXPECT_EQ(r1->cpu_throttled_usec, 3000u);

  FakeCgroupFs v2;
  v2.build_v2();
  auto host2 = v2.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host2);
  auto cg2 = host2->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg2);
  write_text((*cg2)->paths()[0] + "/cpu.stat",
             "usage_usec 9\nnr_periods 8\nnr_throttled 7\nthrottled_usec 6\n");
  auto r2 = read_cgroup_stats(CgroupVersion::kV2, (*cg2)->paths());
  ASSERT_TRUE(r2) << r2.error().describe();
  EXPECT_EQ(r2->cpu_usage_usec, 9u);
  EXPECT_EQ(r2->cpu_nr_throttled, 7u);
  EXPECT_EQ(r2->cpu_throttled_usec, 6u);
}

TEST(CgroupStats, V2WithoutMemoryPeakReportsZero) {
  FakeCgroupFs fake;
  fake.v2_files()["memory"].erase("memory.peak");
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  write_text((*cg)->paths()[0] + "/memory.current", "4096\n");
  auto s = (*cg)->stats();
  ASSERT_TRUE(s) << s.error().describe();
  EXPECT_EQ(s->memory_peak_bytes, 0u);
  EXPECT_EQ(s->memory_current_bytes, 4096u);
}

TEST(CgroupStats, OddContentsParseAsZero) {
  FakeCgroupFs fake;
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  const std::string leaf = (*cg)->paths()[0];
  write_text(leaf + "/memory.events", "oom_kill banana\noom_kill\n\n\n");
  write_text(leaf + "/memory.current", "-5\n");
  write_text(leaf + "/memory.peak", "99999999999999999999999999\n");
  write_text(leaf + "/pids.current", std::string("\0\x01\xff", 3));
  write_text(leaf + "/pids.events", "max");
  write_text(leaf + "/cpu.stat", std::string(100000, 'x'));
  auto s = (*cg)->stats();
  ASSERT_TRUE(s) << s.error().describe();
  EXPECT_EQ(s->oom_kills, 0u);
  EXPECT_EQ(s->memory_current_bytes, 0u);
  EXPECT_EQ(s->memory_peak_bytes, 0u);
  EXPECT_EQ(s->pids_current, 0);
  EXPECT_EQ(s->pids_limit_hits, 0u);
  EXPECT_EQ(s->cpu_usage_usec, 0u);
}

TEST(CgroupKill, V1KillsEveryListedPidIncludingSubCgroups) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  CgroupTestPeer::set_settle_timeout(*host, std::chrono::milliseconds(5000));
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  const pid_t a = spawn_sleeper();
  const pid_t b = spawn_sleeper();
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  ASSERT_TRUE((*cg)->add_process(a));
  const std::string sub = (*cg)->paths()[1] + "/nested";
  write_text(sub + "/cgroup.procs", std::to_string(b) + "\n");
  // The fake kernel: once a child is dead (not yet reaped, so its pid cannot be reused), it
  // leaves cgroup.procs.
  std::thread kernel([&] {
    for (const pid_t pid : {a, b}) {
      siginfo_t info{};
      ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT);
    }
    for (const auto& p : (*cg)->paths()) {
      write_text(p + "/cgroup.procs", "");
    }
    write_text(sub + "/cgroup.procs", "");
  });
  auto r = (*cg)->kill_all();
  kernel.join();
  EXPECT_TRUE(r) << r.error().describe();
  for (const pid_t pid : {a, b}) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  }
  cg.value().reset();
  EXPECT_FALSE(fs::exists(fake.at("/sys/fs/cgroup/pids/cellgate")));
}

TEST(CgroupKill, GivesUpAfterTheSettleTimeout) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  const pid_t a = spawn_sleeper();
  ASSERT_GT(a, 0);
  ASSERT_TRUE((*cg)->add_process(a));
  auto r = (*cg)->kill_all();  // the fake never empties cgroup.procs
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, "cgroup_busy");
  EXPECT_TRUE(has(r.error().message, std::to_string(a))) << r.error().message;
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(a), &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(info.si_status, SIGKILL);
  for (const auto& p : (*cg)->paths()) {
    write_text(p + "/cgroup.procs", "");
  }
  ::waitpid(a, nullptr, 0);
}

TEST(CgroupKill, NeverKillsItself) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  write_text((*cg)->paths()[0] + "/cgroup.procs", std::to_string(::getpid()) + "\n");
  auto r = (*cg)->kill_all();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, "cgroup_holds_self");
  write_text((*cg)->paths()[0] + "/cgroup.procs", "");
}

TEST(CgroupKill, V2WritesCgroupKill) {
  FakeCgroupFs fake;
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  ASSERT_TRUE((*cg)->kill_all());
  EXPECT_EQ(read_text((*cg)->paths()[0] + "/cgroup.kill"), "1");
}

TEST(CgroupKill, V2WithoutCgroupKillFallsBackToSignals) {
  FakeCgroupFs fake;
  fake.v2_core().erase("cgroup.kill");
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  const pid_t a = spawn_sleeper();
  ASSERT_GT(a, 0);
  ASSERT_TRUE((*cg)->add_process(a));
  std::thread kernel([&] {
    siginfo_t info{};
    ::waitid(P_PID, static_cast<id_t>(a), &info, WEXITED | WNOWAIT);
    write_text((*cg)->paths()[0] + "/cgroup.procs", "");
  });
  auto r = (*cg)->kill_all();
  kernel.join();
  EXPECT_TRUE(r) << r.error().describe();
  int status = 0;
  ASSERT_EQ(::waitpid(a, &status, 0), a);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_FALSE(fs::exists((*cg)->paths()[0] + "/cgroup.kill"));
}

TEST(CgroupRemove, RemovesLeafNestedCgroupsAndEmptyGroupOnly) {
  FakeCgroupFs fake;
  fake.build_v2();
  auto host = fake.detect(kV2Cgroup, kV2Mountinfo);
  ASSERT_TRUE(host);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg);
  const std::string leaf = (*cg)->paths()[0];
  write_text(leaf + "/inner/deeper/cgroup.procs", "");  // a kernel's own sub-cgroups
  ASSERT_TRUE((*cg)->remove());
  EXPECT_FALSE(fs::exists(fake.at(kV2Own) + "/cellgate"));
  EXPECT_TRUE(fs::exists(fake.at(kV2Own) + "/cgroup.subtree_control"));
  EXPECT_EQ((*cg)->paths(), std::vector<std::string>{leaf});
  // Removed: the path may be a new kernel's cgroup now, so nothing more touches it.
  EXPECT_EQ((*cg)->add_process(4242).error().reason, "cgroup_removed");
  EXPECT_EQ((*cg)->stats().error().reason, "cgroup_removed");
  EXPECT_TRUE((*cg)->kill_all());
  EXPECT_TRUE((*cg)->remove());
}

TEST(CgroupRemove, RmdirFailureNamesTheDirectory) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  auto host = fake.detect(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(host);
  CgroupTestPeer::set_fake_kernel(
      *host, [&](const std::string&) {}, nullptr);
  auto cg = host->create("cellgate", "k1", {}, {}, nullptr);
  ASSERT_TRUE(cg) << cg.error().describe();
  write_text((*cg)->paths()[0] + "/stray", "x");  // a plain directory with a file will not go
  auto r = (*cg)->remove();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message,
            "rmdir('" + (*cg)->paths()[0] + "'): ENOTEMPTY (Directory not empty)");
  fs::remove((*cg)->paths()[0] + "/stray");
}

// --- placement of kernels' cgroups (v2 delegation) ----------------------------------------------

// The system as place_kernel_cgroups sees it, on the fake tree; `delegated` plays systemd's xattr.
CgroupSystemView view_of(FakeCgroupFs& fake, const std::string& cgroup, bool delegated,
                         uid_t euid = 0) {
  CgroupSystemView v;
  v.proc_self_cgroup = cgroup;
  v.mountinfo = kV2Mountinfo;
  v.root_prefix = fake.root();
  v.self = ::getpid();
  v.euid = euid;
  v.delegated = [delegated](const std::string&) { return delegated; };
  v.after_mkdir = [&fake](const std::string& d) { fake.kernel_mkdir(d); };
  return v;
}

CgroupPlacementRequest serve_request(std::string parent = "") {
  CgroupPlacementRequest r;
  r.requested_parent = std::move(parent);
  r.command_line = "cellgate serve --port 8888";
  return r;
}

TEST(CgroupPlacement, V1HostKeepsEachLaunchersOwnCgroup) {
  FakeCgroupFs fake;
  fake.build_hybrid();
  CgroupSystemView v = view_of(fake, kHybridCgroup, true);
  v.mountinfo = kHybridMountinfo;
  fake.writes();
  auto placed = place_kernel_cgroups(serve_request(), v);
  ASSERT_TRUE(placed) << placed.error().describe();
  EXPECT_EQ(placed->parent, "");
  EXPECT_TRUE(has(placed->summary, "cgroup v1")) << placed->summary;
  EXPECT_TRUE(fake.made().empty());
  EXPECT_TRUE(fake.writes().empty());
}

TEST(CgroupPlacement, V2CgroupThatAlreadyEnablesEveryControllerIsLeftAlone) {
  FakeCgroupFs fake;
  fake.build_v2("cpu memory pids\n");
  fake.writes();
  auto placed = place_kernel_cgroups(serve_request(), view_of(fake, kV2Cgroup, true));
  ASSERT_TRUE(placed) << placed.error().describe();
  EXPECT_EQ(placed->parent, "");
  EXPECT_TRUE(fake.made().empty());
  EXPECT_TRUE(fake.writes().empty());
}

TEST(CgroupPlacement, DelegatedServiceMovesEveryProcessIntoALeafAndEnablesControllers) {
  FakeCgroupFs fake;
  fake.build_v2("");
  const std::string own = fake.at(kV2Own);
  // The unit's other process (a wrapper script, say) is moved too.
  write_text(own + "/cgroup.procs", std::to_string(::getpid()) + "\n4242\n");
  fake.writes();
  auto placed = place_kernel_cgroups(serve_request(), view_of(fake, kV2Cgroup, true));
  ASSERT_TRUE(placed) << placed.error().describe();
  EXPECT_EQ(placed->parent, "/system.slice/cellgate.service");
  EXPECT_TRUE(has(placed->summary, own + "/gateway")) << placed->summary;
  EXPECT_EQ(fake.made(), std::vector<std::string>{own + "/gateway"});
  EXPECT_EQ(read_text(own + "/cgroup.subtree_control"), "+memory +pids +cpu");
  // The processes first (ourselves, then the rest: the last write is 4242; inotify folds the
  // repeated writes to one file into one event), then the enable.
  EXPECT_EQ(fake.writes(), (std::vector<std::string>{own + "/gateway/cgroup.procs",
                                                     own + "/cgroup.subtree_control"}));
  EXPECT_EQ(read_text(own + "/gateway/cgroup.procs"), "4242");

  // A launcher in the leaf, given the parent, makes the kernel's cgroup beside the gateway.
  write_text(own + "/cgroup.subtree_control", "cpu memory pids\n");  // as the kernel shows it
  auto host = CgroupHost::detect("0::/system.slice/cellgate.service/gateway\n", kV2Mountinfo,
                                 fake.root(), placed->parent);
  ASSERT_TRUE(host) << host.error().describe();
  EXPECT_EQ(host->base_dirs(), std::vector<std::string>{own});
  EXPECT_TRUE(host->has_controller("memory") && host->has_controller("pids") &&
              host->has_controller("cpu"))
      << host->describe();
  CgroupTestPeer::set_fake_kernel(
      *host, [&](const std::string& d) { fake.kernel_mkdir(d); }, nullptr);
  auto cg = host->create("cellgate", "k1", standard_limits(), {}, nullptr);
  ASSERT_TRUE(cg) << cg.error().describe();
  EXPECT_EQ((*cg)->paths(), std::vector<std::string>{own + "/cellgate/k1"});
  EXPECT_EQ(read_text(own + "/cellgate/k1/pids.max"), "16");
}

TEST(CgroupPlacement, LoginSessionIsRefusedNamingTheCommandToRun) {
  FakeCgroupFs fake;
  const std::string session = "/user.slice/user-0.slice/session-3.scope";
  fake.add_v2("/sys/fs/cgroup", session, "cpu memory pids\n", "");
  fake.writes();
  auto placed = place_kernel_cgroups(serve_request(), view_of(fake, "0::" + session + "\n", false));
  ASSERT_FALSE(placed);
  EXPECT_EQ(placed.error().reason, "cgroup_not_delegated");
  EXPECT_EQ(placed.error().code, ErrorCode::kFailedPrecondition);
  const std::string& m = placed.error().message;
  EXPECT_TRUE(has(m, session + " is not delegated")) << m;
  EXPECT_TRUE(has(m, "Started from a login shell")) << m;
  EXPECT_TRUE(has(m, "systemd-run --scope -p Delegate=yes --quiet -- cellgate serve --port 8888"))
      << m;
  EXPECT_TRUE(fake.made().empty());
  EXPECT_TRUE(fake.writes().empty());

  // Not root: the user's own manager delegates.
  auto as_user =
      place_kernel_cgroups(serve_request(), view_of(fake, "0::" + session + "\n", false, 1000));
  ASSERT_FALSE(as_user);
  EXPECT_TRUE(has(as_user.error().message, "systemd-run --user --scope -p Delegate=yes"))
      << as_user.error().message;
}

TEST(CgroupPlacement, ServiceWithoutDelegateIsToldToAddIt) {
  FakeCgroupFs fake;
  fake.build_v2("");
  auto placed = place_kernel_cgroups(serve_request(), view_of(fake, kV2Cgroup, false));
  ASSERT_FALSE(placed);
  EXPECT_TRUE(has(placed.error().message, "Add Delegate=yes to the unit"))
      << placed.error().message;
  EXPECT_TRUE(fake.made().empty());
}

TEST(CgroupPlacement, CgroupOwnedByTheUserIsDelegatedToIt) {
  // systemd-run --user --scope -p Delegate=yes: the scope belongs to the user.
  FakeCgroupFs fake;
  const std::string scope = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-u7.scope";
  fake.add_v2("/sys/fs/cgroup", scope, "cpu memory pids\n", "");
  const std::string dir = fake.at("/sys/fs/cgroup" + scope);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/cgroup.procs").c_str(), &st), 0);
  auto placed = place_kernel_cgroups(
      serve_request(), view_of(fake, "0::" + scope + "\n", false, st.st_uid == 0 ? 1 : st.st_uid));
  if (st.st_uid == 0) {
    // Owned by root here: a user who does not own it is refused.
    ASSERT_FALSE(placed);
    ASSERT_EQ(::chown((dir + "/cgroup.procs").c_str(), 1, 1), 0);
    placed = place_kernel_cgroups(serve_request(), view_of(fake, "0::" + scope + "\n", false, 1));
  }
  ASSERT_TRUE(placed) << placed.error().describe();
  EXPECT_EQ(placed->parent, scope);
  EXPECT_EQ(read_text(dir + "/cgroup.subtree_control"), "+memory +pids +cpu");
}

TEST(CgroupPlacement, ContainerNamespaceRootCountsAsDelegated) {
  FakeCgroupFs fake;
  fake.add_v2("/sys/fs/cgroup", "/", "cpu memory pids\n", "");
  write_text(fake.at("/sys/fs/cgroup/cgroup.type"), "domain\n");  // not the hierarchy's root
  auto placed = place_kernel_cgroups(serve_request(), view_of(fake, "0::/\n", false));
  ASSERT_TRUE(placed) << placed.error().describe();
  EXPECT_EQ(placed->parent, "/");
  EXPECT_EQ(fake.made(), std::vector<std::string>{fake.at("/sys/fs/cgroup/gateway")});
  EXPECT_EQ(read_text(fake.at("/sys/fs/cgroup/cgroup.subtree_control")), "+memory +pids +cpu");
}

TEST(CgroupPlacement, HierarchyRootEnablesWithoutMovingAnything) {
  FakeCgroupFs fake;
  fake.add_v2("/sys/fs/cgroup", "/", "cpu io memory pids\n", "io\n");  // no cgroup.type: the root
  auto placed = place_kernel_cgroups(serve_request(), view_of(fake, "0::/\n", false));
  ASSERT_TRUE(placed) << placed.error().describe();
  EXPECT_EQ(placed->parent, "");
  EXPECT_TRUE(fake.made().empty());
  EXPECT_EQ(read_text(fake.at("/sys/fs/cgroup/cgroup.subtree_control")), "+memory +pids +cpu");
}

TEST(CgroupPlacement, RequestedParentGetsTheControllersItLacks) {
  FakeCgroupFs fake;
  fake.build_v2("");
  fake.add_v2("/sys/fs/cgroup", "/cellgate.slice", "cpu memory pids\n", "pids\n");
  const Files own_before = snapshot(fake.at(kV2Own));
  auto placed =
      place_kernel_cgroups(serve_request("/cellgate.slice"), view_of(fake, kV2Cgroup, false));
  ASSERT_TRUE(placed) << placed.error().describe();
  EXPECT_EQ(placed->parent, "/cellgate.slice");
  EXPECT_EQ(read_text(fake.at("/sys/fs/cgroup/cellgate.slice/cgroup.subtree_control")),
            "+memory +cpu");
  EXPECT_TRUE(fake.made().empty());  // the gateway stays where it is
  EXPECT_EQ(snapshot(fake.at(kV2Own)), own_before);
}

TEST(CgroupPlacement, RequestedParentMustExistAndBeClean) {
  FakeCgroupFs fake;
  fake.build_v2("");
  auto missing =
      place_kernel_cgroups(serve_request("/nowhere.slice"), view_of(fake, kV2Cgroup, true));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().reason, "cgroup_unavailable") << missing.error().describe();
  auto climbing =
      place_kernel_cgroups(serve_request("/system.slice/../x"), view_of(fake, kV2Cgroup, true));
  ASSERT_FALSE(climbing);
  EXPECT_EQ(climbing.error().reason, "bad_cgroup_parent");
  EXPECT_TRUE(fake.made().empty());
}

TEST(CgroupPlacement, EnableFailureNamesTheProcessesLeft) {
  FakeCgroupFs fake;
  fake.build_v2("");
  const std::string own = fake.at(kV2Own);
  write_text(own + "/cgroup.procs", "4242\n");
  // A subtree_control that cannot be written (EISDIR), as EBUSY would on a real tree.
  fs::remove(own + "/cgroup.subtree_control");
  fs::create_directory(own + "/cgroup.subtree_control");
  auto placed = place_kernel_cgroups(serve_request(), view_of(fake, kV2Cgroup, true));
  ASSERT_FALSE(placed);
  EXPECT_EQ(placed.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(has(placed.error().message, "could not enable")) << placed.error().message;
}

}  // namespace
}  // namespace cellgate::jail
