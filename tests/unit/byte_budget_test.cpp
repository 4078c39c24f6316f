// ByteBudget: the process-wide cap on bytes held for WebSocket clients. Over the limit it sheds
// the largest holders (the slowest reader), never the one that merely added the last byte.
#include "cellgate/http/byte_budget.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace cellgate::http {
namespace {

TEST(ByteBudget, CountsEveryAccountAndGivesBackOnClose) {
  auto budget = std::make_shared<ByteBudget>(1000);
  auto a = budget->open(nullptr);
  auto b = budget->open(nullptr);
  a->set(300);
  b->set(400);
  EXPECT_EQ(budget->used(), 700u);
  a->set(100);  // a new total, not a delta
  EXPECT_EQ(budget->used(), 500u);
  b.reset();
  EXPECT_EQ(budget->used(), 100u);
  EXPECT_EQ(budget->peak(), 700u);
  EXPECT_EQ(budget->shed_count(), 0u);
}

TEST(ByteBudget, ShedsTheLargestHolderNotTheOneThatAddedLast) {
  auto budget = std::make_shared<ByteBudget>(1000);
  std::vector<int> shed;
  auto slow = budget->open([&] { shed.push_back(0); });
  auto fast = budget->open([&] { shed.push_back(1); });
  slow->set(900);
  fast->set(50);
  EXPECT_TRUE(shed.empty());
  fast->set(150);  // the fast reader's frame takes the total over: the slow reader goes
  ASSERT_EQ(shed, std::vector<int>{0});
  EXPECT_TRUE(slow->shed());
  EXPECT_FALSE(fast->shed());
  // A shed account's bytes no longer count against the limit while it lets go.
  fast->set(500);
  EXPECT_EQ(shed.size(), 1u);
  slow->set(0);
  EXPECT_EQ(budget->used(), 500u);
}

TEST(ByteBudget, ShedsAsManyAsNeededOnceEach) {
  auto budget = std::make_shared<ByteBudget>(100);
  int calls[3] = {0, 0, 0};
  auto a = budget->open([&] { ++calls[0]; });
  auto b = budget->open([&] { ++calls[1]; });
  auto c = budget->open([&] { ++calls[2]; });
  a->set(60);
  b->set(50);  // 110: a (largest) is shed
  c->set(70);  // b + c = 120: c (largest of the rest) is shed
  a->set(80);  // a, already shed, is not called again
  EXPECT_EQ(calls[0], 1);
  EXPECT_EQ(calls[1], 0);
  EXPECT_EQ(calls[2], 1);
  EXPECT_EQ(budget->shed_count(), 2u);
}

TEST(ByteBudget, ZeroMeansNoLimit) {
  auto budget = std::make_shared<ByteBudget>(0);
  bool shed = false;
  auto a = budget->open([&] { shed = true; });
  a->set(std::size_t{1} << 40);
  EXPECT_FALSE(shed);
  EXPECT_EQ(budget->used(), std::size_t{1} << 40);
}

}  // namespace
}  // namespace cellgate::http
