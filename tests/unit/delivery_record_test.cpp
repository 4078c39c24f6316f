// The delivery record (gateway/kernels/src/delivery_record.hpp): the last msg_id each session was
// sent, read back by a new record on the same file (a gateway after a kill -9), a torn write
// leaving the other copy, and the slot written longest ago given up past kSlots sessions.
#include "delivery_record.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;

class DeliveryRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-delivered-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    path_ = dir_ + "/delivered";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_, path_;
};

TEST_F(DeliveryRecordTest, ANewRecordOnTheFileReadsEachSessionsLastMessage) {
  {
    DeliveryRecord r(path_);
    for (int i = 0; i < 5; ++i) {
      r.delivered("a", "a" + std::to_string(i));
      r.delivered("b", "b" + std::to_string(i));
    }
  }
  DeliveryRecord again(path_);
  auto last = again.read();
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last["a"].msg_id, "a4");
  EXPECT_EQ(last["b"].msg_id, "b4");
  EXPECT_GT(last["b"].generation, last["a"].generation);
  // It goes on writing where the old one left off: both copies of a slot are used in turn.
  again.delivered("a", "a5");
  again.delivered("a", "a6");
  EXPECT_EQ(DeliveryRecord(path_).read()["a"].msg_id, "a6");
}

TEST_F(DeliveryRecordTest, ATornWriteLeavesThePreviousMessage) {
  {
    DeliveryRecord r(path_);
    r.delivered("s", "first");
    r.delivered("s", "second");
  }
  // Garble the copy holding "second" (a kill mid-write): "first" is read.
  std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto at = bytes.find("second");
  ASSERT_NE(at, std::string::npos);
  f.seekp(static_cast<std::streamoff>(at));
  f.write("SECOND", 6);
  f.close();
  EXPECT_EQ(DeliveryRecord(path_).read()["s"].msg_id, "first");
}

TEST_F(DeliveryRecordTest, PastItsSlotsTheSessionWrittenLongestAgoGoes) {
  DeliveryRecord r(path_);
  for (std::size_t i = 0; i <= DeliveryRecord::kSlots; ++i) {
    r.delivered("s" + std::to_string(i), "m");
  }
  auto last = DeliveryRecord(path_).read();
  EXPECT_EQ(last.size(), DeliveryRecord::kSlots);
  EXPECT_EQ(last.count("s0"), 0u);
  EXPECT_EQ(last.count("s1"), 1u);
  // Ids longer than a slot holds are not recorded.
  r.delivered(std::string(DeliveryRecord::kMaxSessionBytes + 1, 'x'), "m");
  EXPECT_EQ(DeliveryRecord(path_).read().size(), DeliveryRecord::kSlots);
}

}  // namespace
}  // namespace cellgate::kernels
