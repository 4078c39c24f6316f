// Unit tests of the ids that carry their node (cellgate/protocol/node_ids.hpp): their shape, the
// stamp read back, an id of a lost boot, and an id that moved to another node.
#include "cellgate/protocol/node_ids.hpp"

#include <gtest/gtest.h>

#include <string>

namespace cellgate::protocol {
namespace {

Error not_found(const std::string& id) {
  return make_error(ErrorCode::kNotFound, "no_such_kernel", "Kernel does not exist: " + id);
}

TEST(NodeIds, CarryTheTagAndEpochAndStayUuidShaped) {
  set_node(0x0003, 0xa71c);
  const std::string id = new_node_id();
  ASSERT_EQ(id.size(), 36u);
  EXPECT_EQ(id.substr(0, 8), "0003a71c");
  EXPECT_EQ(id[8], '-');
  EXPECT_EQ(id[14], '4');  // version 4 kept
  auto stamp = stamp_of(id);
  ASSERT_TRUE(stamp.has_value());
  EXPECT_EQ(stamp->tag, 0x0003);
  EXPECT_EQ(stamp->epoch, 0xa71c);
  EXPECT_EQ(new_node_hex_id().substr(0, 8), "0003a71c");
  EXPECT_FALSE(from_lost_boot(id));
  EXPECT_TRUE(from_lost_boot("00030001-0000-4000-8000-000000000000"));
  EXPECT_FALSE(from_lost_boot("00040001-0000-4000-8000-000000000000"));  // another node's
}

TEST(NodeIds, UnknownIdsAreNotFoundGoneOrMoved) {
  set_node(0x0003, 0xa71c);
  const std::string live = "0003a71c-1111-4000-8000-000000000000";
  EXPECT_EQ(unknown_id(live, not_found(live)).reason, "no_such_kernel");
  const std::string lost = "00030001-1111-4000-8000-000000000000";
  EXPECT_EQ(unknown_id(lost, not_found(lost)).reason, "node-restarted");

  const std::string moved = "0003a71c-2222-4000-8000-000000000000";
  note_moved(moved, "node 0005");
  const Error e = unknown_id(moved, not_found(moved));
  EXPECT_EQ(e.code, ErrorCode::kUnavailable);
  EXPECT_EQ(e.reason, "kernel_moved");
  EXPECT_NE(e.message.find("node 0005"), std::string::npos) << e.message;
}

TEST(NodeIds, MovedIdsAreBounded) {
  set_node(0x0003, 0xa71c);
  const std::string first = "0003a71c-3333-4000-8000-000000000000";
  note_moved(first, "node 0001");
  for (int i = 0; i < 5000; ++i) {
    note_moved("0003a71c-4444-4000-8000-" + std::to_string(100000000000 + i), "node 0001");
  }
  // The oldest fell out: its id is an ordinary unknown one again.
  EXPECT_EQ(unknown_id(first, not_found(first)).reason, "no_such_kernel");
  const std::string last = "0003a71c-4444-4000-8000-" + std::to_string(100000000000 + 4999);
  EXPECT_EQ(unknown_id(last, not_found(last)).reason, "kernel_moved");
}

}  // namespace
}  // namespace cellgate::protocol
