// Cgroups on the real host: limits written, processes moved, OOM kills and fork limits counted,
// kill_all() and removal. Needs root; skips with a reason otherwise. Every cgroup is made below
// this process's own as cellgate-test-<pid>/<test>, and removed by the Cgroup's destructor.
#include "cellgate/jail/cgroup.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/unique_fd.hpp"
#include "placement.hpp"

namespace cellgate::jail {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t k64MiB = 64ull << 20;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trimmed(const std::string& path) {
  std::string s = read_text(path);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
    s.pop_back();
  }
  return s;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) {
      out.push_back(line);
    }
  }
  return out;
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A forked child that blocks until go(), then runs `body` and exits with its return value.
class Child {
 public:
  template <typename Body>
  explicit Child(Body body) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      return;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[1]);
      char c = 0;
      if (::read(fds[0], &c, 1) != 1) {
        ::_exit(100);
      }
      ::_exit(body());
    }
    ::close(fds[0]);
    go_ = UniqueFd(fds[1]);
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  void go() {
    const char c = 'g';
    ASSERT_EQ(::write(go_.get(), &c, 1), 1);
  }
  // The wait status once it ended.
  int wait() {
    int status = 0;
    EXPECT_EQ(::waitpid(pid_, &status, 0), pid_);
    reaped_ = true;
    return status;
  }

 private:
  pid_t pid_ = -1;
  UniqueFd go_;
  bool reaped_ = false;
};

bool killed_by_sigkill(int status) {
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

CgroupLimits standard_limits() {
  CgroupLimits l;
  l.memory_bytes = k64MiB;
  l.swap_off = true;
  l.pids = 16;
  l.cpus = 0.5;
  return l;
}

class CgroupReal : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "cgroup tests need root to create cgroups (euid " << ::geteuid() << ")";
    }
    auto host = CgroupHost::detect_system(testing::cgroup_parent());
    ASSERT_TRUE(host) << host.error().describe();
    host_.emplace(std::move(host).value());
    if (!host_->has_controller("memory") || !host_->has_controller("pids")) {
      GTEST_SKIP() << "no usable memory and pids controllers here: " << host_->describe();
    }
  }

  std::unique_ptr<Cgroup> create(const CgroupLimits& limits) {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::vector<std::string> warnings;
    // swap is optional: a host without swap accounting still runs the rest (checked below).
    auto cg = host_->create(group_, name, limits, {"swap"}, &warnings);
    EXPECT_TRUE(cg) << cg.error().describe();
    swap_warned_ = !warnings.empty();
    if (!cg) {
      return nullptr;
    }
    return std::move(cg).value();
  }

  const std::string group_ = "cellgate-test-" + std::to_string(::getpid());
  std::optional<CgroupHost> host_;
  bool swap_warned_ = false;
};

// Independently of cgroup.cpp: is the memory controller on a v1 hierarchy here?
bool memory_on_v1() {
  for (const auto& line : lines_of(read_text("/proc/self/mountinfo"))) {
    const auto dash = line.find(" - ");
    if (dash != std::string::npos && line.compare(dash + 3, 7, "cgroup ") == 0 &&
        (has(line.substr(dash), ",memory") || has(line.substr(dash), " memory"))) {
      return true;
    }
  }
  return false;
}

TEST(CgroupHostReal, DetectSystemDescribesThisHost) {
  auto host = CgroupHost::detect_system(testing::cgroup_parent());
  ASSERT_TRUE(host) << host.error().describe();
  const std::string d = host->describe();
  if (memory_on_v1()) {
    EXPECT_EQ(host->version(), CgroupVersion::kV1) << d;
    EXPECT_EQ(d.rfind("cgroup v1: ", 0), 0u) << d;
    EXPECT_TRUE(has(d, "memory at /sys/fs/cgroup/")) << d;
  } else {
    EXPECT_EQ(host->version(), CgroupVersion::kV2) << d;
    EXPECT_EQ(d.rfind("cgroup v2 at ", 0), 0u) << d;
  }
  std::cout << "[ host     ] " << d << "\n";
}

TEST_F(CgroupReal, CreateWritesLimitsBelowOwnCgroup) {
  auto cg = create(standard_limits());
  ASSERT_TRUE(cg);
  ASSERT_FALSE(cg->paths().empty());
  const std::string own_cgroups = read_text("/proc/self/cgroup");
  for (const auto& p : cg->paths()) {
    const std::string suffix = "/" + group_ + "/CreateWritesLimitsBelowOwnCgroup";
    EXPECT_EQ(p.compare(p.size() - suffix.size(), suffix.size(), suffix), 0) << p;
    EXPECT_TRUE(fs::is_directory(p)) << p;
  }
  if (host_->version() == CgroupVersion::kV1) {
    std::string mem;
    std::string pids;
    std::string cpu;
    for (const auto& p : cg->paths()) {
      if (fs::exists(p + "/memory.limit_in_bytes")) {
        mem = p;
      }
      if (fs::exists(p + "/pids.max")) {
        pids = p;
      }
      if (fs::exists(p + "/cpu.cfs_quota_us")) {
        cpu = p;
      }
    }
    ASSERT_FALSE(mem.empty());
    ASSERT_FALSE(pids.empty());
    EXPECT_EQ(trimmed(mem + "/memory.limit_in_bytes"), "67108864");
    if (!swap_warned_) {
      EXPECT_EQ(trimmed(mem + "/memory.memsw.limit_in_bytes"), "67108864");
    }
    EXPECT_EQ(trimmed(pids + "/pids.max"), "16");
    if (host_->has_controller("cpu")) {
      ASSERT_FALSE(cpu.empty());
      EXPECT_EQ(trimmed(cpu + "/cpu.cfs_period_us"), "100000");
      EXPECT_EQ(trimmed(cpu + "/cpu.cfs_quota_us"), "50000");
    }
  } else {
    const std::string leaf = cg->paths().front();
    EXPECT_EQ(trimmed(leaf + "/memory.max"), "67108864");
    if (!swap_warned_) {
      EXPECT_EQ(trimmed(leaf + "/memory.swap.max"), "0");
    }
    EXPECT_EQ(trimmed(leaf + "/pids.max"), "16");
    if (host_->has_controller("cpu")) {
      EXPECT_EQ(trimmed(leaf + "/cpu.max"), "50000 100000");
    }
  }
  EXPECT_EQ(read_text("/proc/self/cgroup"), own_cgroups);  // we did not move ourselves
}

TEST_F(CgroupReal, ChildIsInProcsAndCountedInStats) {
  auto cg = create(standard_limits());
  ASSERT_TRUE(cg);
  Child child([] {
    ::pause();
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(cg->add_process(child.pid()));
  for (const auto& p : cg->paths()) {
    EXPECT_EQ(lines_of(read_text(p + "/cgroup.procs")),
              std::vector<std::string>{std::to_string(child.pid())})
        << p;
  }
  EXPECT_TRUE(has(read_text("/proc/" + std::to_string(child.pid()) + "/cgroup"),
                  "/" + group_ + "/ChildIsInProcsAndCountedInStats"));
  auto s = cg->stats();
  ASSERT_TRUE(s) << s.error().describe();
  EXPECT_EQ(s->pids_current, 1);
  EXPECT_EQ(s->oom_kills, 0u);
  EXPECT_EQ(s->pids_limit_hits, 0u);
  ASSERT_TRUE(cg->kill_all());
  EXPECT_TRUE(killed_by_sigkill(child.wait()));
}

TEST_F(CgroupReal, ChildTouching256MiBIsOomKilled) {
  auto cg = create(standard_limits());
  ASSERT_TRUE(cg);
  if (swap_warned_) {
    GTEST_SKIP() << "no swap accounting here: the child could swap instead of being OOM-killed";
  }
  Child child([] {
    constexpr std::size_t kSize = std::size_t{256} << 20;
    void* p = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return 2;
    }
    auto* bytes = static_cast<volatile char*>(p);
    for (std::size_t i = 0; i < kSize; i += 4096) {
      bytes[i] = 1;
    }
    return 0;  // survived: the limit did not hold
  });
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(cg->add_process(child.pid()));
  child.go();
  const int status = child.wait();
  EXPECT_TRUE(killed_by_sigkill(status)) << "wait status " << status;
  auto s = cg->stats();
  ASSERT_TRUE(s) << s.error().describe();
  EXPECT_GE(s->oom_kills, 1u);
  EXPECT_GT(s->memory_peak_bytes, k64MiB / 2);
  EXPECT_LE(s->memory_peak_bytes, k64MiB);
}

TEST_F(CgroupReal, ForkLoopStopsAtPidsMax) {
  auto cg = create(standard_limits());
  ASSERT_TRUE(cg);
  // Grandchildren are reparented to us when the child dies, so that we can reap them.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  struct SubreaperOff {
    ~SubreaperOff() { ::prctl(PR_SET_CHILD_SUBREAPER, 0); }
  } subreaper_off;
  int result[2];
  ASSERT_EQ(::pipe2(result, O_CLOEXEC), 0);
  UniqueFd result_read(result[0]);
  UniqueFd result_write(result[1]);
  const int result_fd = result_write.get();
  Child child([result_fd] {
    int forked = 0;
    for (int i = 0; i < 1000; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        while (true) {
          ::pause();
        }
      }
      if (pid < 0) {
        break;  // EAGAIN at pids.max
      }
      ++forked;
    }
    if (::write(result_fd, &forked, sizeof forked) != static_cast<ssize_t>(sizeof forked)) {
      return 3;
    }
    while (true) {
      ::pause();
    }
  });
  result_write.reset();
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(cg->add_process(child.pid()));
  child.go();
  int forked = -1;
  ASSERT_EQ(::read(result_read.get(), &forked, sizeof forked), static_cast<ssize_t>(sizeof forked));
  EXPECT_EQ(forked, 15);  // 16 with the child itself
  auto s = cg->stats();
  ASSERT_TRUE(s) << s.error().describe();
  EXPECT_EQ(s->pids_current, 16);
  EXPECT_GT(s->pids_limit_hits, 0u);

  auto killed = cg->kill_all();
  EXPECT_TRUE(killed) << killed.error().describe();
  for (const auto& p : cg->paths()) {
    EXPECT_EQ(read_text(p + "/cgroup.procs"), "") << p;
  }
  EXPECT_TRUE(killed_by_sigkill(child.wait()));
  // The killed grandchildren, reparented to us as zombies.
  int reaped = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (reaped < forked && std::chrono::steady_clock::now() < deadline) {
    const pid_t pid = ::waitpid(-1, nullptr, WNOHANG);
    if (pid > 0) {
      ++reaped;
    } else if (pid == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } else {
      break;
    }
  }
  EXPECT_EQ(reaped, forked);
}

TEST_F(CgroupReal, KillAllEmptiesIt) {
  auto cg = create(standard_limits());
  ASSERT_TRUE(cg);
  std::vector<std::unique_ptr<Child>> children;
  for (int i = 0; i < 3; ++i) {
    children.push_back(std::make_unique<Child>([] {
      ::pause();
      return 0;
    }));
    ASSERT_GT(children.back()->pid(), 0);
    ASSERT_TRUE(cg->add_process(children.back()->pid()));
  }
  for (auto& c : children) {
    c->go();  // they pause() in the cgroup now
  }
  EXPECT_EQ(lines_of(read_text(cg->paths().front() + "/cgroup.procs")).size(), 3u);
  auto killed = cg->kill_all();
  ASSERT_TRUE(killed) << killed.error().describe();
  for (const auto& p : cg->paths()) {
    EXPECT_EQ(read_text(p + "/cgroup.procs"), "") << p;
  }
  for (auto& c : children) {
    EXPECT_TRUE(killed_by_sigkill(c->wait()));
  }
}

TEST_F(CgroupReal, DestructorKillsAndRemovesEveryDirectory) {
  auto cg = create(standard_limits());
  ASSERT_TRUE(cg);
  const std::vector<std::string> leaves = cg->paths();
  Child child([] {
    ::pause();
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(cg->add_process(child.pid()));
  cg.reset();
  EXPECT_TRUE(killed_by_sigkill(child.wait()));
  for (const auto& leaf : leaves) {
    EXPECT_FALSE(fs::exists(leaf)) << leaf;
    const std::string group = fs::path(leaf).parent_path().string();
    EXPECT_FALSE(fs::exists(group)) << group;
    EXPECT_TRUE(fs::exists(fs::path(group).parent_path() / "cgroup.procs"));  // own is intact
  }
}

// The v2 hierarchy alone, even where v1 holds the controllers (hybrid hosts): runs for real
// where memory and pids are delegated to our v2 cgroup.
TEST(CgroupV2Real, LimitsAndCgroupKillWhereDelegated) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "cgroup tests need root to create cgroups (euid " << ::geteuid() << ")";
  }
  std::string cgroup;
  for (const auto& line : lines_of(read_text("/proc/self/cgroup"))) {
    if (line.rfind("0::", 0) == 0) {
      cgroup += line + "\n";
    }
  }
  std::string mountinfo;
  for (const auto& line : lines_of(read_text("/proc/self/mountinfo"))) {
    if (has(line, " - cgroup2 ")) {
      mountinfo += line + "\n";
    }
  }
  auto host = CgroupHost::detect(cgroup, mountinfo, "", testing::cgroup_parent());
  if (!host) {
    GTEST_SKIP() << "no cgroup v2 controllers here: " << host.error().describe();
  }
  ASSERT_EQ(host->version(), CgroupVersion::kV2);
  if (!host->has_controller("memory") || !host->has_controller("pids")) {
    GTEST_SKIP() << "no cgroup v2 controllers here: " << host->describe();
  }
  std::vector<std::string> warnings;
  auto cg = host->create("cellgate-test-" + std::to_string(::getpid()), "v2", standard_limits(),
                         {"swap", "cpu"}, &warnings);
  ASSERT_TRUE(cg) << cg.error().describe();
  const std::string leaf = (*cg)->paths().front();
  EXPECT_EQ(trimmed(leaf + "/memory.max"), "67108864");
  EXPECT_EQ(trimmed(leaf + "/pids.max"), "16");
  if (host->has_controller("cpu")) {
    EXPECT_EQ(trimmed(leaf + "/cpu.max"), "50000 100000");
  }
  Child child([] {
    ::pause();
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE((*cg)->add_process(child.pid()));
  ASSERT_TRUE((*cg)->kill_all());
  EXPECT_EQ(read_text(leaf + "/cgroup.procs"), "");
  EXPECT_TRUE(killed_by_sigkill(child.wait()));
  cg.value().reset();
  EXPECT_FALSE(fs::exists(leaf));
}

}  // namespace
}  // namespace cellgate::jail
