// CpuBudget and DiskLimit: each tenant's CPU-seconds per window, from its kernels' cumulative
// cgroup readings (deltas, a lower reading a new cgroup), refusal and throttling past the budget,
// release in the next window, one-shot charges, and the file a restarted gateway reads back (and a
// damaged one); a tenant's disk room.
#include "cellgate/tenants/cpu_budget.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cellgate/tenants/disk_limit.hpp"

namespace cellgate::tenants {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using TimePoint = CpuBudget::TimePoint;

// Kernels, their tenants and readings the test sets; what was throttled.
struct FakeKernels {
  std::map<std::string, std::string> tenant_of;
  std::map<std::string, std::uint64_t> usec;
  std::set<std::string> throttled;
  std::set<std::string> cannot_throttle;
  int throttle_calls = 0;

  CpuBudgetHooks hooks() {
    CpuBudgetHooks h;
    h.owned = [this] {
      std::vector<CpuBudgetHooks::Owned> out;
      for (const auto& [k, t] : tenant_of) {
        out.push_back({k, t});
      }
      return out;
    };
    h.cpu_usec = [this](const std::string& id) -> std::optional<std::uint64_t> {
      auto it = usec.find(id);
      if (it == usec.end()) {
        return std::nullopt;
      }
      return it->second;
    };
    h.throttle = [this](const std::string& id, bool on) -> Result<void> {
      ++throttle_calls;
      if (cannot_throttle.count(id) != 0) {
        return make_error(ErrorCode::kFailedPrecondition, "no", "cannot");
      }
      if (on) {
        throttled.insert(id);
      } else {
        throttled.erase(id);
      }
      return ok_result();
    };
    return h;
  }
};

constexpr std::uint64_t kSecond = 1000000;

// A time in the window [3600 k, 3600 (k + 1)) of the Unix epoch, `into` seconds into it.
TimePoint at(std::int64_t window, std::int64_t into = 10) {
  return TimePoint(seconds(window * 3600 + into));
}

class CpuBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-cpu-budget-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  CpuBudgetOptions options(double max_seconds = 10) const {
    CpuBudgetOptions o;
    o.max_cpu_seconds = max_seconds;
    o.window = seconds(3600);
    o.file = dir_ + "/tenant-cpu.json";
    return o;
  }
  std::string dir_;
};

TEST_F(CpuBudgetTest, ReadingsAddUpAsDeltasPerTenantAndALowerReadingIsANewCgroup) {
  FakeKernels k;
  k.tenant_of = {{"a1", "alice"}, {"a2", "alice"}, {"b1", "bob"}};
  k.usec = {{"a1", 1 * kSecond}, {"a2", 2 * kSecond}, {"b1", 500000}};
  CpuBudget budget(options(), k.hooks());
  budget.sample(at(5));
  EXPECT_DOUBLE_EQ(budget.used_seconds("alice", at(5)), 3.0);  // all they used since they began
  EXPECT_DOUBLE_EQ(budget.used_seconds("bob", at(5)), 0.5);
  k.usec["a1"] = 4 * kSecond;  // +3
  k.usec["a2"] = 1 * kSecond;  // lower: restarted, a new cgroup, +1
  budget.sample(at(5, 20));
  EXPECT_DOUBLE_EQ(budget.used_seconds("alice", at(5, 20)), 7.0);
  EXPECT_DOUBLE_EQ(budget.used_seconds("bob", at(5, 20)), 0.5);
  // A kernel that cannot be read now (hibernated) keeps its last reading: nothing counted twice.
  k.usec.erase("a1");
  budget.sample(at(5, 30));
  k.usec["a1"] = 4 * kSecond + 250000;
  budget.sample(at(5, 40));
  EXPECT_DOUBLE_EQ(budget.used_seconds("alice", at(5, 40)), 7.25);
  EXPECT_FALSE(budget.refusal("alice", at(5, 40)));
  EXPECT_TRUE(k.throttled.empty());
}

TEST_F(CpuBudgetTest, PastTheBudgetItsKernelsAreThrottledAndStartsRefusedUntilTheNextWindow) {
  FakeKernels k;
  k.tenant_of = {{"a1", "alice"}, {"a2", "alice"}, {"b1", "bob"}};
  k.usec = {{"a1", 6 * kSecond}, {"a2", 4 * kSecond}, {"b1", 9 * kSecond}};
  CpuBudget budget(options(10), k.hooks());
  budget.sample(at(7));
  EXPECT_EQ(k.throttled, (std::set<std::string>{"a1", "a2"}));
  EXPECT_EQ(budget.throttled(), (std::set<std::string>{"a1", "a2"}));
  auto why = budget.refusal("alice", at(7, 11));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("--tenant-max-cpu-seconds"), std::string::npos) << *why;
  EXPECT_NE(why->find("1970-01-01T08:00:00Z"), std::string::npos) << *why;  // window 8 begins
  EXPECT_FALSE(budget.refusal("bob", at(7, 11)));
  EXPECT_FALSE(budget.refusal("carol", at(7, 11)));
  // A kernel gone meanwhile is forgotten, not released.
  k.tenant_of.erase("a2");
  k.usec.erase("a2");
  k.usec["a1"] = 6 * kSecond + 1000;
  budget.sample(at(7, 20));
  EXPECT_EQ(budget.throttled(), (std::set<std::string>{"a1"}));
  // The next window: nothing used yet, everyone released.
  EXPECT_FALSE(budget.refusal("alice", at(8, 0)));
  k.usec["a1"] = 6 * kSecond + 2000;
  budget.sample(at(8, 1));
  EXPECT_EQ(k.throttled, (std::set<std::string>{"a2"}));  // a2 was gone: nothing to give back
  EXPECT_TRUE(budget.throttled().empty());
  EXPECT_DOUBLE_EQ(budget.used_seconds("alice", at(8, 1)), 0.001);  // only what came after
}

TEST_F(CpuBudgetTest, AKernelThatCannotBeThrottledIsTriedAgainEachPass) {
  FakeKernels k;
  k.tenant_of = {{"a1", "alice"}};
  k.usec = {{"a1", 11 * kSecond}};
  k.cannot_throttle = {"a1"};
  CpuBudget budget(options(10), k.hooks());
  budget.sample(at(1));
  budget.sample(at(1, 12));
  EXPECT_EQ(k.throttle_calls, 2);
  EXPECT_TRUE(budget.throttled().empty());
  EXPECT_TRUE(budget.refusal("alice", at(1, 13)));  // starts are refused all the same
}

TEST_F(CpuBudgetTest, AHibernatedKernelIsNotThrottledAndItsNewCgroupIsAfterItsRestore) {
  FakeKernels k;
  k.tenant_of = {{"a1", "alice"}, {"a2", "alice"}};
  k.usec = {{"a1", 11 * kSecond}};  // a2 is hibernated: no cgroup to read or throttle
  CpuBudget budget(options(10), k.hooks());
  budget.sample(at(1));
  EXPECT_EQ(k.throttled, (std::set<std::string>{"a1"}));
  EXPECT_EQ(k.throttle_calls, 1);
  k.usec["a2"] = 100000;  // resumed, in a new cgroup
  budget.sample(at(1, 20));
  EXPECT_EQ(k.throttled, (std::set<std::string>{"a1", "a2"}));
}

TEST_F(CpuBudgetTest, OneShotChargesCountAndAreKept) {
  FakeKernels k;
  CpuBudget budget(options(10), k.hooks());
  budget.charge("alice", 9 * kSecond, at(3));
  EXPECT_FALSE(budget.refusal("alice", at(3)));
  budget.charge("alice", kSecond, at(3, 1));
  EXPECT_TRUE(budget.refusal("alice", at(3, 2)));
  budget.sample(at(3, 3));  // writes the file
  CpuBudget again(options(10), k.hooks());
  EXPECT_TRUE(again.refusal("alice", at(3, 4)));
  EXPECT_FALSE(again.refusal("alice", at(4)));
}

TEST_F(CpuBudgetTest, ARestartedGatewayNeitherForgetsNorCountsTwice) {
  FakeKernels k;
  k.tenant_of = {{"a1", "alice"}};
  k.usec = {{"a1", 4 * kSecond}};
  {
    CpuBudget budget(options(10), k.hooks());
    budget.sample(at(2));
  }
  k.usec["a1"] = 5 * kSecond;
  CpuBudget restarted(options(10), k.hooks());
  EXPECT_DOUBLE_EQ(restarted.used_seconds("alice", at(2, 30)), 4.0);
  restarted.sample(at(2, 30));
  EXPECT_DOUBLE_EQ(restarted.used_seconds("alice", at(2, 30)), 5.0);  // +1, not +5
  // Another window length reads nothing back.
  CpuBudgetOptions other = options(10);
  other.window = seconds(60);
  CpuBudget shorter(other, k.hooks());
  EXPECT_DOUBLE_EQ(shorter.used_seconds("alice", at(2, 30)), 0.0);
}

TEST_F(CpuBudgetTest, ADamagedFileStartsAfresh) {
  FakeKernels k;
  for (const std::string text :
       {"not json", "[]", R"({"window": "x", "window_seconds": 3600})",
        R"({"window": 2, "window_seconds": 3600, "used_usec": {"alice": -5}, "kernels": {}})",
        R"({"window": 2, "window_seconds": 3600, "used_usec": {}, "kernels": {"k": 1}})"}) {
    {
      std::ofstream f(options().file);
      f << text;
    }
    CpuBudget budget(options(10), k.hooks());
    EXPECT_DOUBLE_EQ(budget.used_seconds("alice", at(2)), 0.0) << text;
  }
}

TEST_F(CpuBudgetTest, NoBudgetCountsAndRefusesNothing) {
  FakeKernels k;
  k.tenant_of = {{"a1", "alice"}};
  k.usec = {{"a1", 100 * kSecond}};
  CpuBudget budget(options(0), k.hooks());
  budget.sample(at(1));
  EXPECT_FALSE(budget.refusal("alice", at(1)));
  EXPECT_EQ(k.throttle_calls, 0);
  EXPECT_FALSE(fs::exists(options().file));
}

TEST_F(CpuBudgetTest, ItSamplesOnTheLoopUntilStopped) {
  FakeKernels k;
  k.tenant_of = {{"a1", "alice"}};
  k.usec = {{"a1", 20 * kSecond}};
  util::ManualLoop loop;
  CpuBudget budget(options(10), k.hooks());
  budget.start(
      loop, [](std::function<void()> fn) { fn(); }, std::chrono::milliseconds(2000));
  EXPECT_EQ(k.throttle_calls, 0);
  loop.advance(std::chrono::milliseconds(2000));
  EXPECT_EQ(k.throttle_calls, 1);
  loop.advance(std::chrono::milliseconds(2000));
  EXPECT_EQ(k.throttle_calls, 2);
  budget.stop();
  loop.advance(std::chrono::milliseconds(10000));
  EXPECT_EQ(k.throttle_calls, 2);
  EXPECT_EQ(loop.pending_timers(), 0u);
}

TEST(DiskLimitTest, RoomIsWhatTheTenantHoldsPlusWhatItAddsWithinTheLimit) {
  std::map<std::string, std::uint64_t> held = {{"alice", 60u << 20}, {"bob", 120u << 20}};
  DiskLimit disk(100u << 20, [&](const std::string& t) { return held[t]; });
  EXPECT_TRUE(disk.room("alice", 40u << 20).ok());
  auto refused = disk.room("alice", (40u << 20) + 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(refused.error().reason, "tenant_disk");
  EXPECT_NE(refused.error().message.find("hold 60 MiB of its 100 MiB"), std::string::npos)
      << refused.error().message;
  EXPECT_FALSE(disk.room("bob", 0).ok());  // past it already (a pause grew its image)
  EXPECT_TRUE(disk.room("carol", 100u << 20).ok());
  // No overflow: an addition near the top of the range is refused, not wrapped.
  EXPECT_FALSE(disk.room("alice", ~std::uint64_t{0}).ok());
  EXPECT_TRUE(DiskLimit(0, nullptr).room("alice", ~std::uint64_t{0}).ok());  // no limit
}

}  // namespace
}  // namespace cellgate::tenants
