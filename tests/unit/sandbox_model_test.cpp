// The E2B control plane's pure parts: NewSandbox bodies, the list's filters (metadata as the SDK
// encodes it, state, template, startedAfter), its order and its pages (X-Next-Token), records.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "cellgate/sandboxes/model.hpp"
#include "cellgate/sandboxes/webhooks.hpp"

namespace cellgate::sandboxes {
namespace {

using std::chrono::seconds;

Sandbox make(std::uint64_t seq, std::map<std::string, std::string> metadata,
             State state = State::kRunning, std::string tmpl = "base") {
  Sandbox s;
  s.id = "sb" + std::to_string(seq);
  s.seq = seq;
  s.metadata = std::move(metadata);
  s.state = state;
  s.template_id = std::move(tmpl);
  s.started_at = SystemTime(seconds(1700000000 + seq));
  return s;
}

std::vector<std::string> ids(const Page& page) {
  std::vector<std::string> out;
  for (const auto& s : page.items) {
    out.push_back(s.id);
  }
  return out;
}

TEST(SandboxModel, CreateRequestDefaultsAndRefusals) {
  auto empty = parse_create_request("");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->template_id, "base");
  EXPECT_EQ(empty->timeout_seconds, 300);
  EXPECT_TRUE(empty->secure);
  auto full = parse_create_request(
      R"({"templateID": "python3", "timeout": 15, "secure": false, "metadata": {"a": "1"},
          "envVars": {"X": "y"}, "autoPause": true, "autoResume": {"enabled": true},
          "allow_internet_access": true, "network": {}})");
  ASSERT_TRUE(full) << full.error().message;
  EXPECT_EQ(full->template_id, "python3");
  EXPECT_EQ(full->timeout_seconds, 15);
  EXPECT_FALSE(full->secure);
  EXPECT_EQ(full->metadata.at("a"), "1");
  EXPECT_EQ(full->env_vars.at("X"), "y");
  EXPECT_TRUE(full->auto_pause && full->auto_resume);
  for (const char* bad :
       {R"({"timeout": -1})", R"({"timeout": 86401})", R"({"timeout": "1"})",
        R"({"metadata": {"a": 1}})", R"({"envVars": {"A=B": "x"}})", R"({"templateID": ""})",
        R"([])", R"({"secure": "yes"})", R"({"mcp": {"x": {}}})"}) {
    auto r = parse_create_request(bad);
    EXPECT_FALSE(r) << bad;
    if (!r) {
      EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << bad;
    }
  }
  std::string deep(1000, '[');
  EXPECT_FALSE(parse_create_request(deep));
}

TEST(SandboxModel, ListFiltersAsTheSdkEncodesThem) {
  std::vector<Sandbox> all = {make(1, {{"k", "a b"}, {"n", "1"}}),
                              make(2, {{"k", "a b"}}, State::kPaused),
                              make(3, {{"k", "other"}}, State::kRunning, "snap")};
  // The SDK: URLSearchParams of encodeURIComponent'd pairs, sent as one query parameter
  // (http::Target decodes the parameter once).
  auto q = parse_list_query({{"metadata", "k=a%2520b"}});
  ASSERT_TRUE(q) << q.error().message;
  EXPECT_EQ(ids(list_page(all, *q)), (std::vector<std::string>{"sb2", "sb1"}));
  q = parse_list_query({{"metadata", "k=a%2520b&n=1"}});
  ASSERT_TRUE(q);
  EXPECT_EQ(ids(list_page(all, *q)), (std::vector<std::string>{"sb1"}));
  q = parse_list_query({{"state", "paused"}});
  ASSERT_TRUE(q);
  EXPECT_EQ(ids(list_page(all, *q)), (std::vector<std::string>{"sb2"}));
  q = parse_list_query({{"state", "running,paused"}, {"order", "asc"}});
  ASSERT_TRUE(q);
  EXPECT_EQ(ids(list_page(all, *q)), (std::vector<std::string>{"sb1", "sb2", "sb3"}));
  q = parse_list_query({{"template", "snap"}});
  ASSERT_TRUE(q);
  EXPECT_EQ(ids(list_page(all, *q)), (std::vector<std::string>{"sb3"}));
  q = parse_list_query({{"startedAfter", iso8601(SystemTime(seconds(1700000002)))}});
  ASSERT_TRUE(q);
  EXPECT_EQ(ids(list_page(all, *q)), (std::vector<std::string>{"sb3", "sb2"}));
  for (auto bad :
       std::vector<std::map<std::string, std::string>>{{{"state", "dead"}},
                                                       {{"order", "up"}},
                                                       {{"limit", "0"}},
                                                       {{"limit", "101"}},
                                                       {{"limit", "x"}},
                                                       {{"nextToken", "-1"}},
                                                       {{"startedAfter", "yesterday"}}}) {
    EXPECT_FALSE(parse_list_query(bad)) << bad.begin()->first << "=" << bad.begin()->second;
  }
}

TEST(SandboxModel, PagesFollowTheirTokens) {
  std::vector<Sandbox> all;
  for (std::uint64_t i = 1; i <= 5; ++i) {
    all.push_back(make(i, {}));
  }
  for (bool asc : {false, true}) {
    std::map<std::string, std::string> query{{"limit", "2"}, {"order", asc ? "asc" : "desc"}};
    std::vector<std::string> seen;
    int pages = 0;
    for (;;) {
      auto q = parse_list_query(query);
      ASSERT_TRUE(q);
      Page page = list_page(all, *q);
      ++pages;
      for (auto& id : ids(page)) {
        seen.push_back(id);
      }
      if (page.next_token.empty()) {
        break;
      }
      query["nextToken"] = page.next_token;
      ASSERT_LT(pages, 10);
    }
    EXPECT_EQ(pages, 3);
    EXPECT_EQ(seen, asc ? (std::vector<std::string>{"sb1", "sb2", "sb3", "sb4", "sb5"})
                        : (std::vector<std::string>{"sb5", "sb4", "sb3", "sb2", "sb1"}));
  }
  // Exactly one page: no token.
  auto q = parse_list_query({{"limit", "5"}});
  ASSERT_TRUE(q);
  EXPECT_TRUE(list_page(all, *q).next_token.empty());
}

TEST(SandboxModel, RecordsRoundTripAndShapes) {
  Sandbox s = make(7, {{"a", "b"}}, State::kPaused);
  s.tenant = "alice";
  s.kernel_id = "k1";
  s.envd_access_token = "tok";
  s.end_at = s.started_at + seconds(60);
  s.on_timeout = OnTimeout::kPause;
  auto back = Sandbox::from_record(s.to_record());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->id, s.id);
  EXPECT_EQ(back->tenant, "alice");
  EXPECT_EQ(back->end_at, s.end_at);
  EXPECT_EQ(back->on_timeout, OnTimeout::kPause);
  EXPECT_FALSE(Sandbox::from_record(nlohmann::json{{"id", 1}}));
  Shape shape;
  auto detail = detail_json(s, shape);
  EXPECT_EQ(detail["state"], "paused");
  EXPECT_EQ(detail["envdAccessToken"], "tok");
  EXPECT_EQ(detail["lifecycle"]["onTimeout"], "pause");
  EXPECT_EQ(detail["endAt"], "2023-11-14T22:14:27.000Z");
  EXPECT_EQ(parse_iso8601("2023-11-14T22:14:27.000Z"), s.end_at);
  EXPECT_EQ(parse_iso8601("2023-11-14T22:14:27Z"), s.end_at);
  EXPECT_FALSE(parse_iso8601("2023-11-14"));
  EXPECT_EQ(sandbox_json(s, shape)["envdVersion"], std::string(kEnvdVersion));
}

}  // namespace
}  // namespace cellgate::sandboxes

namespace cellgate::sandboxes {
namespace {

TEST(SandboxWebhooks, RefusedWithoutASecretOrAnHttpUrl) {
  auto offload = [](std::function<void()> fn) { fn(); };
  EXPECT_FALSE(Webhooks::create({.urls = {"http://127.0.0.1:1/x"}, .secret = "short"}, offload));
  EXPECT_FALSE(Webhooks::create({.urls = {"ftp://h/x"}, .secret = std::string(16, 's')}, offload));
  auto hooks =
      Webhooks::create({.urls = {"http://127.0.0.1:1/x"}, .secret = std::string(16, 's')}, offload);
  ASSERT_TRUE(hooks) << hooks.error().message;
  Sandbox s = make(1, {{"k", "v"}});
  s.tenant = "alice";
  auto body = nlohmann::json::parse(Webhooks::body("killed", s));
  EXPECT_EQ(body["type"], "sandbox.lifecycle.killed");
  EXPECT_EQ(body["eventLabel"], "killed");
  EXPECT_EQ(body["sandboxId"], "sb1");
  EXPECT_EQ(body["sandboxTeamId"], "alice");
  EXPECT_EQ(body["sandboxMetadata"]["k"], "v");
  const std::string sig = (*hooks)->signature("payload");
  EXPECT_EQ(sig.rfind("sha256=", 0), 0u);
  EXPECT_EQ(sig.size(), 7u + 64u);
  EXPECT_EQ(sig, (*hooks)->signature("payload"));
  EXPECT_NE(sig, (*hooks)->signature("payload2"));
  // E2B's e2b-signature: base64(SHA-256(secret ‖ body)) without padding (Python's hashlib).
  EXPECT_EQ((*hooks)->e2b_signature("payload"), "6C4xKVuumFQDzs0kz7f7QUqoL/gYzomIy9hNSYL7wQ0");
}

}  // namespace
}  // namespace cellgate::sandboxes
