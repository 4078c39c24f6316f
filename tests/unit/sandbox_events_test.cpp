// EventLog (E2B's events API): tenants see their own events, pages and order, type filters,
// retention and the cap, the file read back by the next gateway (damaged lines skipped) and
// rewritten when it holds twice what is kept.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cellgate/sandboxes/events.hpp"

namespace cellgate::sandboxes {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json event(const std::string& sandbox, const std::string& label, SystemTime at) {
  return json{
      {"version", "v1"},     {"id", sandbox + "-" + label}, {"type", "sandbox.lifecycle." + label},
      {"eventLabel", label}, {"sandboxId", sandbox},        {"timestamp", iso8601(at)}};
}

std::vector<std::string> ids(const json& page) {
  std::vector<std::string> out;
  for (const auto& e : page) {
    out.push_back(e["id"].get<std::string>());
  }
  return out;
}

class SandboxEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-events-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  EventLogOptions options() const { return {.file = dir_ + "/events.ndjson"}; }
  std::string dir_;
  SystemTime now_ = std::chrono::system_clock::now();
};

TEST_F(SandboxEventsTest, EachTenantSeesItsOwnPagedFilteredAndOrdered) {
  EventLog log(options());
  log.add("alice", event("a1", "created", now_ - std::chrono::seconds(30)));
  log.add("bob", event("b1", "created", now_ - std::chrono::seconds(20)));
  log.add("alice", event("a1", "paused", now_ - std::chrono::seconds(10)));
  log.add("alice", event("a1", "killed", now_));
  const Caller alice{"alice", false};
  EXPECT_EQ(ids(log.query(alice, {}, now_)),
            (std::vector<std::string>{"a1-killed", "a1-paused", "a1-created"}));
  EXPECT_EQ(ids(log.query({"bob", false}, {}, now_)), (std::vector<std::string>{"b1-created"}));
  EXPECT_EQ(ids(log.query({"", true}, {.limit = 100}, now_)).size(), 4u);  // the operator
  EXPECT_EQ(ids(log.query(alice, {.sandbox_id = "b1"}, now_)), std::vector<std::string>{});
  EXPECT_EQ(ids(log.query(alice, {.offset = 1, .limit = 1}, now_)),
            (std::vector<std::string>{"a1-paused"}));
  EXPECT_EQ(ids(log.query(alice, {.limit = 2, .ascending = true}, now_)),
            (std::vector<std::string>{"a1-created", "a1-paused"}));
  EXPECT_EQ(ids(log.query(
                alice, {.types = {"sandbox.lifecycle.killed", "sandbox.lifecycle.created"}}, now_)),
            (std::vector<std::string>{"a1-killed", "a1-created"}));
  EXPECT_EQ(ids(log.query(alice, {.offset = 9}, now_)), std::vector<std::string>{});
}

TEST_F(SandboxEventsTest, OldEventsAndThoseOverTheCapGo) {
  EventLogOptions o = options();
  o.max_events = 3;
  EventLog log(o);
  log.add("alice", event("old", "created", now_ - std::chrono::hours(24 * 8)));
  for (int i = 0; i < 4; ++i) {
    log.add("alice", event("s" + std::to_string(i), "created", now_));
  }
  EXPECT_EQ(log.size(), 3u);
  EXPECT_EQ(ids(log.query({"alice", false}, {.ascending = true}, now_)),
            (std::vector<std::string>{"s1-created", "s2-created", "s3-created"}));
  // Past the retention when asked: not answered, though still held.
  EXPECT_EQ(ids(log.query({"alice", false}, {}, now_ + std::chrono::hours(24 * 8))).size(), 0u);
}

TEST_F(SandboxEventsTest, TheNextGatewayReadsTheFileBackSkippingDamagedLines) {
  {
    EventLog log(options());
    log.add("alice", event("a1", "created", now_));
    log.add("bob", event("b1", "created", now_));
  }
  {
    std::ofstream f(options().file, std::ios::app);
    f << "not json\n{\"tenant\": 5, \"event\": {}}\n{\"tenant\": \"eve\", \"event\": "
         "{\"sandboxId\": "
         "\"x\", \"type\": \"t\", \"timestamp\": \"yesterday\"}}\n{\"tenant\": \"alice\", \"ev";
  }
  EventLog again(options());
  EXPECT_EQ(again.size(), 2u);
  EXPECT_EQ(ids(again.query({"alice", false}, {}, now_)), (std::vector<std::string>{"a1-created"}));
  again.add("alice", event("a1", "killed", now_));  // appended after the cut-short line's end
  EventLog third(options());
  EXPECT_EQ(ids(third.query({"alice", false}, {}, now_)),
            (std::vector<std::string>{"a1-killed", "a1-created"}));
}

TEST_F(SandboxEventsTest, TheFileIsRewrittenWhenItHoldsTwiceWhatIsKept) {
  EventLogOptions o = options();
  o.max_events = 2;
  EventLog log(o);
  for (int i = 0; i < 9; ++i) {
    log.add("alice", event("s" + std::to_string(i), "created", now_));
  }
  std::ifstream f(o.file);
  std::size_t lines = 0;
  for (std::string line; std::getline(f, line);) {
    ++lines;
  }
  EXPECT_LE(lines, 4u);
  EventLog again(o);
  EXPECT_EQ(ids(again.query({"alice", false}, {}, now_)),
            (std::vector<std::string>{"s8-created", "s7-created"}));
}

}  // namespace
}  // namespace cellgate::sandboxes
