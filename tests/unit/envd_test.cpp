// envd's Connect protocol and its refusals (gateway/envd), without a jail: unknown sandboxes,
// tokens, /health, malformed envelopes and messages. The commands themselves run in real jails
// in tests/js/e2b_envd.test.mjs and jail.Modes/JailExec.*.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/envd/connect.hpp"
#include "cellgate/envd/envd_api.hpp"

namespace cellgate::envd {
namespace {

using nlohmann::json;

TEST(EnvdConnect, EnvelopesRoundTrip) {
  const std::string e = envelope("{\"a\":1}");
  ASSERT_EQ(e.size(), 5u + 7u);
  EXPECT_EQ(e[0], '\0');
  EXPECT_EQ(e[4], '\x07');
  auto back = read_envelope(e);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, "{\"a\":1}");
  const std::string end = end_of_stream(ConnectError{"not_found", "gone"});
  EXPECT_EQ(static_cast<unsigned char>(end[0]), kEndStreamFlag);
  EXPECT_EQ(json::parse(end.substr(5)),
            (json{{"error", {{"code", "not_found"}, {"message", "gone"}}}}));
  EXPECT_EQ(end_of_stream(std::nullopt).substr(5), "{}");
}

TEST(EnvdConnect, RefusesWhatIsNotOneEnvelope) {
  EXPECT_FALSE(read_envelope(""));
  EXPECT_FALSE(read_envelope("{}"));
  std::string e = envelope("{}");
  EXPECT_FALSE(read_envelope(e + "x"));                               // trailing bytes
  EXPECT_FALSE(read_envelope(e.substr(0, e.size() - 1)));             // cut short
  EXPECT_FALSE(read_envelope(envelope("{}", 0x01)));                  // compressed
  EXPECT_FALSE(read_envelope(std::string("\0\xff\xff\xff\xff", 5)));  // a length from nowhere
}

TEST(EnvdConnect, CodesAndStatuses) {
  EXPECT_EQ(connect_error(make_error(ErrorCode::kNotFound, "x", "m")).code, "not_found");
  EXPECT_EQ(connect_error(make_error(ErrorCode::kUnauthenticated, "x", "m")).code,
            "unauthenticated");
  EXPECT_EQ(connect_error(make_error(ErrorCode::kDeadlineExceeded, "x", "m")).code,
            "deadline_exceeded");
  EXPECT_EQ(http_status("not_found"), 404);
  EXPECT_EQ(http_status("unauthenticated"), 401);
  EXPECT_EQ(http_status("invalid_argument"), 400);
  EXPECT_EQ(http_status("resource_exhausted"), 429);
  EXPECT_EQ(http_status("no such code"), 500);
}

class EnvdRefusals : public ::testing::Test {
 protected:
  EnvdRefusals() {
    EnvdOptions o;
    o.find = [](std::string_view id) -> std::optional<SandboxTarget> {
      if (id == "live" || id == "paused") {
        return SandboxTarget{std::string(id), "k-" + std::string(id), "sesame", "", id == "live"};
      }
      return std::nullopt;
    };
    o.jail_of = [](const std::string&) -> Result<kernel::JailTarget> {
      return make_error(ErrorCode::kFailedPrecondition, "no_jail", "no jail in a unit test");
    };
    o.offload = [](std::function<void()> f) { f(); };
    api_ = std::make_unique<EnvdApi>(std::move(o));
  }

  http::Response call(const std::string& target, const std::string& sandbox,
                      const std::string& body, const std::string& token = "sesame",
                      const std::string& content_type = "application/json") {
    http::Request req{http::Verb::post, target, 11};
    req.set("E2b-Sandbox-Id", sandbox);
    req.set("E2b-Sandbox-Port", "49983");
    req.set("X-Access-Token", token);
    req.set(http::Field::content_type, content_type);
    req.body() = body;
    req.prepare_payload();
    http::Response out;
    api_->handle(std::move(req), std::make_shared<http::LambdaExchange>(
                                     [&](http::Response r) { out = std::move(r); }));
    return out;
  }

  std::unique_ptr<EnvdApi> api_;
};

TEST_F(EnvdRefusals, UnknownSandboxAndWrongTokenAndHealth) {
  auto unknown = call("/process.Process/List", "nope", "{}");
  EXPECT_EQ(unknown.result_int(), 404);
  EXPECT_EQ(json::parse(unknown.body())["code"], "not_found");
  auto wrong = call("/process.Process/List", "live", "{}", "guess");
  EXPECT_EQ(wrong.result_int(), 401);
  EXPECT_EQ(json::parse(wrong.body())["code"], "unauthenticated");
  EXPECT_EQ(call("/health", "live", "").result_int(), 204);
  EXPECT_EQ(call("/health", "paused", "").result_int(), 502);
  EXPECT_EQ(call("/health", "nope", "").result_int(), 502);
  auto listed = call("/process.Process/List", "live", "{}");
  EXPECT_EQ(listed.result_int(), 200);
  EXPECT_EQ(json::parse(listed.body()), (json{{"processes", json::array()}}));
  EXPECT_EQ(call("/process.Process/Nothing", "live", "{}").result_int(), 404);
  EXPECT_EQ(call("/process.Process/List", "paused", "{}").result_int(), 503);
}

TEST_F(EnvdRefusals, StreamingErrorsEndTheStream) {
  auto end_error = [](const http::Response& r) {
    const std::string& b = r.body();
    EXPECT_EQ(r.result_int(), 200);
    EXPECT_GE(b.size(), 5u);
    EXPECT_EQ(static_cast<unsigned char>(b[0]), kEndStreamFlag);
    return json::parse(b.substr(5))["error"]["code"].get<std::string>();
  };
  const std::string ct = "application/connect+json";
  EXPECT_EQ(end_error(call("/process.Process/Start", "live", "{}", "sesame", ct)),
            "invalid_argument");  // not an envelope
  EXPECT_EQ(end_error(call("/process.Process/Start", "live", envelope("[1]"), "sesame", ct)),
            "invalid_argument");
  EXPECT_EQ(end_error(call("/process.Process/Start", "live", envelope(R"({"process":{"cmd":""}})"),
                           "sesame", ct)),
            "invalid_argument");
  EXPECT_EQ(end_error(call("/process.Process/Start", "live",
                           envelope(R"({"process":{"cmd":"/bin/true","envs":{"A=B":"x"}}})"),
                           "sesame", ct)),
            "invalid_argument");
  EXPECT_EQ(end_error(call("/process.Process/Start", "live",
                           envelope(R"({"process":{"cmd":"/bin/true"},"pty":{"size":{"cols":0}}})"),
                           "sesame", ct)),
            "invalid_argument");
  // A good request whose sandbox has no jail here: the jail's error, in the stream.
  EXPECT_EQ(end_error(call("/process.Process/Start", "live",
                           envelope(R"({"process":{"cmd":"/bin/true"}})"), "sesame", ct)),
            "failed_precondition");
  EXPECT_EQ(end_error(call("/process.Process/Connect", "live", envelope(R"({"process":{"pid":7}})"),
                           "sesame", ct)),
            "not_found");
  auto deep = std::string(300, '[') + std::string(300, ']');
  EXPECT_EQ(end_error(call("/process.Process/Start", "live", envelope(deep), "sesame", ct)),
            "invalid_argument");
}

TEST_F(EnvdRefusals, UnaryCallsForUnknownProcesses) {
  for (const char* method : {"SendInput", "CloseStdin", "SendSignal", "Update"}) {
    auto r = call(std::string("/process.Process/") + method, "live",
                  R"({"process":{"pid":12345},"signal":"SIGNAL_SIGKILL","input":{"stdin":""}})");
    EXPECT_EQ(r.result_int(), 404) << method;
    EXPECT_EQ(json::parse(r.body())["code"], "not_found") << method;
  }
  EXPECT_EQ(call("/process.Process/List", "live", "not json").result_int(), 400);
}

}  // namespace
}  // namespace cellgate::envd
