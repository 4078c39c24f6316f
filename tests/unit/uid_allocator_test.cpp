// UidAllocator: disjoint ranges per allocator (in one process and across processes), the lease
// freed when its holder dies, uids with live processes skipped, exhaustion an error, and the
// fallback lease dir.
#include "cellgate/kernels/uid_allocator.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class UidAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-uids-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    root_ = dir;
    base_ = 3100000 + static_cast<uid_t>(::getpid() % 1000) * 100;  // fixed before any fork
  }
  void TearDown() override {
    for (pid_t pid : children_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // Ranges unlikely to hold anyone's processes, so only the test's own children make uids busy.
  UidRangeOptions options(uid_t range_size = 10, std::size_t ranges = 4) const {
    UidRangeOptions o;
    o.base = base_;
    o.range_size = range_size;
    o.ranges = ranges;
    o.lease_dir = root_ + "/leases";
    return o;
  }

  // A child whose uids are (real, effective, saved) = the arguments (-1: unchanged), sleeping
  // until killed; returns once the change is made.
  pid_t child_as(uid_t ruid, uid_t euid, uid_t suid) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      const char ok = ::setresuid(ruid, euid, suid) == 0 ? 'y' : 'n';
      (void)::write(ready[1], &ok, 1);
      for (;;) {
        ::pause();
      }
    }
    ::close(ready[1]);
    char ok = 0;
    EXPECT_EQ(::read(ready[0], &ok, 1), 1);
    ::close(ready[0]);
    EXPECT_EQ(ok, 'y');
    children_.push_back(pid);
    return pid;
  }

  void end_child(pid_t pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    std::erase(children_, pid);
  }

  std::string root_;
  uid_t base_ = 0;
  std::vector<pid_t> children_;
};

TEST_F(UidAllocatorTest, TwoAllocatorsTakeDisjointRanges) {
  UidAllocator a(options());
  UidAllocator b(options());
  auto ua = a.allocate();
  auto ub = b.allocate();
  ASSERT_TRUE(ua.ok()) << ua.error().describe();
  ASSERT_TRUE(ub.ok()) << ub.error().describe();
  const auto ra = a.range().value();
  const auto rb = b.range().value();
  EXPECT_TRUE(ra.last < rb.first || rb.last < ra.first) << ra.first << " vs " << rb.first;
  EXPECT_NE(*ua, *ub);
  EXPECT_EQ(*ua, ra.first);
  EXPECT_EQ(*ub, rb.first);
}

TEST_F(UidAllocatorTest, TwoProcessesTakeDisjointRangesAndADeadHoldersRangeIsFreeAgain) {
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(report[0]);
    UidAllocator mine(options());
    auto uid = mine.allocate();
    const uid_t first = uid.ok() ? mine.range()->first : 0;
    (void)::write(report[1], &first, sizeof first);
    for (;;) {
      ::pause();  // holds the lease until killed, like a gateway until kill -9
    }
  }
  children_.push_back(pid);
  ::close(report[1]);
  uid_t child_first = 0;
  ASSERT_EQ(::read(report[0], &child_first, sizeof child_first),
            static_cast<ssize_t>(sizeof child_first));
  ::close(report[0]);
  ASSERT_EQ(child_first, options().base);  // the first range: the test's dir is fresh

  {
    UidAllocator ours(options());
    ASSERT_TRUE(ours.lease().ok());
    EXPECT_NE(ours.range()->first, child_first);
  }
  end_child(pid);  // the lock dies with it
  UidAllocator next(options());
  ASSERT_TRUE(next.lease().ok());
  EXPECT_EQ(next.range()->first, child_first);
}

TEST_F(UidAllocatorTest, UidWithALiveProcessIsSkippedUntilItEnds) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to run a child as another uid";
  }
  const uid_t candidate = options().base;
  const pid_t orphan = child_as(candidate, candidate, candidate);
  {
    UidAllocator a(options());
    auto uid = a.allocate();
    ASSERT_TRUE(uid.ok()) << uid.error().describe();
    EXPECT_EQ(*uid, candidate + 1);
  }
  end_child(orphan);
  UidAllocator b(options());
  auto uid = b.allocate();
  ASSERT_TRUE(uid.ok()) << uid.error().describe();
  EXPECT_EQ(*uid, candidate);
}

TEST_F(UidAllocatorTest, SavedOrEffectiveUidAloneMakesAUidBusy) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to run a child as another uid";
  }
  const uid_t base = options().base;
  child_as(static_cast<uid_t>(-1), static_cast<uid_t>(-1), base);      // saved only
  child_as(static_cast<uid_t>(-1), base + 1, static_cast<uid_t>(-1));  // effective only
  UidAllocator a(options());
  auto uid = a.allocate();
  ASSERT_TRUE(uid.ok()) << uid.error().describe();
  EXPECT_EQ(*uid, base + 2);
}

// A gateway restarted on a state dir (after kill -9, or stopped with kernels hibernated) must get
// back the range its kernels run as: CRIU restores a hibernated kernel as the uid it dumped.
TEST_F(UidAllocatorTest, TheRangeOfTheWantedUidsIsTakenFirstWhenFree) {
  UidRangeOptions o = options(10, 4);
  UidAllocator holder(o);
  ASSERT_TRUE(holder.lease().ok());
  ASSERT_EQ(holder.range()->first, o.base);
  {
    // One uid in range 1, two in range 3 (and one beyond every range, ignored): range 3 first.
    UidAllocator restarted(o);
    ASSERT_TRUE(restarted.lease({o.base + 12, o.base + 31, o.base + 35, o.base + 1000}).ok());
    EXPECT_EQ(restarted.range()->first, o.base + 30);
    EXPECT_TRUE(restarted.reserve(o.base + 31).ok());
  }
  // Range 3 is free again but range 1 is the only wanted one now.
  UidAllocator again(o);
  ASSERT_TRUE(again.lease({o.base + 12}).ok());
  EXPECT_EQ(again.range()->first, o.base + 10);
  // A wanted range another gateway holds is not waited for: the next free one is taken.
  UidAllocator other(o);
  ASSERT_TRUE(other.lease({o.base + 12}).ok());
  EXPECT_EQ(other.range()->first, o.base + 20);
}

TEST_F(UidAllocatorTest, AFreeRangeAnotherStateDirStillKeepsIsTakenOnlyWhenNoOtherIsFree) {
  std::set<std::string> keeping = {"/state/a"};
  auto owned = [&](const std::string& owner, std::size_t ranges) {
    UidRangeOptions o = options(10, ranges);
    o.owner = owner;
    o.owner_keeps = [&keeping](const std::string& other) { return keeping.count(other) > 0; };
    return o;
  };
  {
    UidAllocator a(owned("/state/a", 2));  // killed with kernels left in its state dir
    ASSERT_TRUE(a.lease().ok());
    ASSERT_EQ(a.range()->first, options().base);
    std::ifstream lease(a.range()->lease_file);
    const std::string text((std::istreambuf_iterator<char>(lease)), {});
    EXPECT_NE(text.find("\nstate_dir /state/a\n"), std::string::npos) << text;
  }
  {
    UidAllocator b(owned("/state/b", 2));
    ASSERT_TRUE(b.lease().ok());
    EXPECT_EQ(b.range()->first, options().base + 10);  // range 0 is a's
    UidAllocator c(owned("/state/c", 2));
    ASSERT_TRUE(c.lease().ok());  // nothing else free: a's range, with a warning
    EXPECT_EQ(c.range()->first, options().base);
  }
  // c held range 0 last and keeps nothing: free for anyone again.
  UidAllocator d(owned("/state/d", 2));
  ASSERT_TRUE(d.lease().ok());
  EXPECT_EQ(d.range()->first, options().base);
}

TEST_F(UidAllocatorTest, ItsOwnStateDirsRangeAndOneWhoseOwnerKeepsNothingAreTaken) {
  std::set<std::string> keeping = {"/state/a"};
  UidRangeOptions o = options(10, 3);
  o.owner_keeps = [&keeping](const std::string& other) { return keeping.count(other) > 0; };
  o.owner = "/state/a";
  { ASSERT_TRUE(UidAllocator(o).lease().ok()); }
  {
    // The same state dir again, with no kernel uids to want: its own range 0.
    UidAllocator a(o);
    ASSERT_TRUE(a.lease().ok());
    EXPECT_EQ(a.range()->first, o.base);
  }
  keeping.clear();  // a's kernels are gone: its range is anyone's
  o.owner = "/state/z";
  UidAllocator z(o);
  ASSERT_TRUE(z.lease().ok());
  EXPECT_EQ(z.range()->first, o.base);
}

TEST_F(UidAllocatorTest, AHostileLeaseFileNamesNoOwner) {
  UidRangeOptions o = options(10, 2);
  fs::create_directories(o.lease_dir);
  {
    // A line never finished, longer than what is read: no owner to trust.
    std::ofstream f(o.lease_dir + "/range-0");
    f << "pid 1\nstate_dir /state/a" << std::string(10000, 'x');
  }
  o.owner = "/state/b";
  o.owner_keeps = [](const std::string&) { return true; };
  UidAllocator b(o);
  ASSERT_TRUE(b.lease().ok());
  EXPECT_EQ(b.range()->first, o.base);
}

TEST_F(UidAllocatorTest, AllRangesLeasedIsAnError) {
  UidAllocator a(options(10, 2));
  UidAllocator b(options(10, 2));
  ASSERT_TRUE(a.lease().ok());
  ASSERT_TRUE(b.lease().ok());
  UidAllocator c(options(10, 2));
  auto uid = c.allocate();
  ASSERT_FALSE(uid.ok());
  EXPECT_EQ(uid.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(uid.error().reason, "uid_ranges_exhausted");
  EXPECT_NE(uid.error().message.find("--kernel-uid-ranges"), std::string::npos);
  EXPECT_FALSE(c.range());
}

TEST_F(UidAllocatorTest, AllUidsOfTheRangeTakenIsAnErrorUntilOneIsReleased) {
  UidAllocator a(options(2, 1));
  auto u1 = a.allocate();
  auto u2 = a.allocate();
  ASSERT_TRUE(u1.ok());
  ASSERT_TRUE(u2.ok());
  EXPECT_NE(*u1, *u2);
  auto u3 = a.allocate();
  ASSERT_FALSE(u3.ok());
  EXPECT_EQ(u3.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(u3.error().reason, "uids_exhausted");
  a.release(*u1);
  auto again = a.allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *u1);
}

// A hibernated kernel of an earlier gateway has no process to keep allocate() off its uid: its
// adoption reserves it, and only a uid of our range that no kernel holds.
TEST_F(UidAllocatorTest, AReservedUidIsNotAllocatedAndOnlyOurFreeUidsCanBeReserved) {
  UidAllocator a(options(3, 1));
  ASSERT_TRUE(a.lease().ok());
  const auto range = a.range();
  ASSERT_TRUE(range);
  ASSERT_TRUE(a.reserve(range->first + 1).ok());
  auto first = a.allocate();
  auto second = a.allocate();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, range->first);
  EXPECT_EQ(*second, range->first + 2) << "the reserved uid was handed out";
  auto taken = a.reserve(range->first);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.error().reason, "uid_in_use");
  auto outside = a.reserve(range->last + 1);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.error().reason, "uid_outside_range");
  a.release(range->first + 1);
  EXPECT_TRUE(a.reserve(range->first + 1).ok());
}

TEST_F(UidAllocatorTest, UnusableLeaseDirFallsBackOrFails) {
  std::ofstream(root_ + "/file") << "not a dir";
  UidRangeOptions o = options();
  o.lease_dir = root_ + "/file/leases";
  {
    UidAllocator none(o);
    auto r = none.lease();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().reason, "uid_lease_dir");
  }
  o.fallback_lease_dir = root_ + "/state/uid-ranges";
  UidAllocator fallback(o);
  ASSERT_TRUE(fallback.lease().ok());
  EXPECT_EQ(fallback.range()->lease_file, root_ + "/state/uid-ranges/range-0");
}

TEST_F(UidAllocatorTest, BadRangesAreRefused) {
  UidRangeOptions o = options();
  o.base = 4294000000u;
  o.ranges = 100000;  // 1,000,000 uids: past the last one
  UidAllocator a(o);
  auto r = a.allocate();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
}

TEST(LiveUids, OurOwnUidIsLive) {
  EXPECT_EQ(uids_with_live_processes().count(::geteuid()), 1u);
  EXPECT_TRUE(uids_with_live_processes("/nonexistent").empty());
}

}  // namespace
}  // namespace cellgate::kernels
