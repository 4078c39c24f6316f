#include "cellgate/launcher/status.hpp"

#include <gtest/gtest.h>

#include <csignal>

namespace cellgate::launcher {
namespace {

TEST(StatusLine, StartedRoundTrips) {
  StatusEvent ev;
  ev.kind = StatusEvent::Kind::kStarted;
  ev.pid = 4242;
  const std::string line = ev.to_line();
  EXPECT_EQ(line, "{\"event\":\"started\",\"pid\":4242}\n");
  auto parsed = StatusEvent::parse_line(line.substr(0, line.size() - 1));
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->kind, StatusEvent::Kind::kStarted);
  EXPECT_EQ(parsed->pid, 4242);
}

TEST(StatusLine, SignaledNamesTheSignal) {
  StatusEvent ev;
  ev.kind = StatusEvent::Kind::kExited;
  ev.reason = ExitReason::kSignaled;
  ev.signal = SIGKILL;
  ev.pid = 7;
  const std::string line = ev.to_line();
  EXPECT_NE(line.find("\"signal_name\":\"SIGKILL\""), std::string::npos) << line;
  auto parsed = StatusEvent::parse_line(line);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->reason, ExitReason::kSignaled);
  EXPECT_EQ(parsed->signal, SIGKILL);
}

TEST(StatusLine, EveryReasonRoundTrips) {
  for (auto reason : {ExitReason::kOk, ExitReason::kSignaled, ExitReason::kOom,
                      ExitReason::kTimeout, ExitReason::kViolation, ExitReason::kSetupError}) {
    StatusEvent ev;
    ev.kind = StatusEvent::Kind::kExited;
    ev.reason = reason;
    ev.message = "details";
    auto parsed = StatusEvent::parse_line(ev.to_line());
    ASSERT_TRUE(parsed) << to_string(reason);
    EXPECT_EQ(parsed->reason, reason);
    EXPECT_EQ(parsed->message, "details");
  }
}

TEST(StatusLine, UnknownFieldsAreIgnored) {
  auto parsed = StatusEvent::parse_line(R"({"event":"exited","reason":"oom","pid":3,"x":[1]})");
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->reason, ExitReason::kOom);
}

TEST(StatusLine, GarbageIsAnErrorNotACrash) {
  for (const char* bad :
       {"", "{", "[]", "42", R"({"event":"nope"})", R"({"event":"exited","reason":"exploded"})",
        R"({"event":"exited","reason":"ok","exit_code":"zero"})",
        R"({"event":"started","pid":"x"})"}) {
    auto parsed = StatusEvent::parse_line(bad);
    EXPECT_FALSE(parsed) << bad;
    if (!parsed) {
      EXPECT_EQ(parsed.error().reason, "bad_status_line");
    }
  }
}

TEST(StatusEvent, StartedSaysWhetherTheZygoteForkedTheKernel) {
  StatusEvent ev;
  ev.kind = StatusEvent::Kind::kStarted;
  ev.pid = 42;
  EXPECT_EQ(ev.to_line().find("zygote"), std::string::npos);  // cold: nothing added
  ev.zygote = true;
  auto parsed = StatusEvent::parse_line(ev.to_line());
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->zygote);
  auto older = StatusEvent::parse_line(R"({"event":"started","pid":7})");
  ASSERT_TRUE(older.ok());
  EXPECT_FALSE(older->zygote);  // a launcher of an earlier version: cold
}

}  // namespace
}  // namespace cellgate::launcher
