// envd's Connect protocol and its refusals (gateway/envd), without a jail: unknown sandboxes,
// tokens, /health, malformed envelopes and messages; signed /files URLs; gzip's bounds. The
// commands themselves run in real jails in tests/js/e2b_envd.test.mjs and jail.Modes/JailExec.*.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/envd/connect.hpp"
#include "cellgate/envd/envd_api.hpp"
#include "cellgate/envd/gzip.hpp"
#include "cellgate/envd/signature.hpp"

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
      if (id == "other") {
        return SandboxTarget{"other", "k-other", "open-sesame", "", true};
      }
      return std::nullopt;
    };
    o.all = [] {
      return std::vector<SandboxTarget>{{"other", "k-other", "open-sesame", "", true},
                                        {"live", "k-live", "sesame", "", true}};
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

  // GET /files?… with no X-Access-Token (a signed URL fetched as it is), E2b-Sandbox-Id if any.
  http::Response get_files(const std::string& target, const std::string& sandbox = "") {
    http::Request req{http::Verb::get, target, 11};
    if (!sandbox.empty()) {
      req.set("E2b-Sandbox-Id", sandbox);
    }
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

TEST_F(EnvdRefusals, WatchDirRefusesABadPathInTheStream) {
  const std::string ct = "application/connect+json";
  auto r = call("/filesystem.Filesystem/WatchDir", "live", envelope(R"({"path":7})"), "sesame", ct);
  ASSERT_EQ(r.result_int(), 200);
  EXPECT_EQ(json::parse(r.body().substr(5))["error"]["code"], "invalid_argument");
  EXPECT_EQ(json::parse(call("/filesystem.Filesystem/WatchDir", "live", "{}", "sesame", ct)
                            .body()
                            .substr(5))["error"]["code"],
            "invalid_argument");  // not an envelope
}

// The 17th live WatchDir stream of a sandbox is refused; once streams end, their places free up.
// (The watchers here wait in jail_of, which then fails: no jail in a unit test.)
TEST(EnvdWatch, SixteenLiveWatchesASandbox) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  EnvdOptions o;
  o.find = [](std::string_view id) -> std::optional<SandboxTarget> {
    return SandboxTarget{std::string(id), "k-" + std::string(id), "", "", true};
  };
  o.jail_of = [&](const std::string&) -> Result<kernel::JailTarget> {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
    return make_error(ErrorCode::kFailedPrecondition, "no_jail", "no jail in a unit test");
  };
  o.offload = [](std::function<void()> f) { f(); };
  auto api = std::make_unique<EnvdApi>(std::move(o));
  std::atomic<int> ended{0};
  std::vector<std::string> codes(20);
  auto watch = [&](const std::string& sandbox, std::size_t slot) {
    http::Request req{http::Verb::post, "/filesystem.Filesystem/WatchDir", 11};
    req.set("E2b-Sandbox-Id", sandbox);
    req.body() = envelope(R"({"path":"/home/user"})");
    api->handle(std::move(req), std::make_shared<http::LambdaExchange>([&, slot](http::Response r) {
                  codes[slot] = json::parse(r.body().substr(5))["error"]["code"];
                  ++ended;
                }));
  };
  auto wait_ended = [&](int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (ended.load() < n) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << ended.load() << " of " << n;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  for (std::size_t i = 0; i < 16; ++i) {
    watch("a", i);
  }
  watch("a", 16);
  wait_ended(1);
  EXPECT_EQ(codes[16], "resource_exhausted");
  watch("b", 17);  // another sandbox has places of its own
  EXPECT_EQ(ended.load(), 1);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  wait_ended(18);
  EXPECT_EQ(codes[0], "failed_precondition");
  EXPECT_EQ(codes[17], "failed_precondition");
  // The ended streams leave (just after their last byte): sandbox a takes watches again.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int n = 19;; ++n) {
    watch("a", 18);
    wait_ended(n);
    if (codes[18] != "resource_exhausted") {
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the ended watches never left";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(codes[18], "failed_precondition");
}

// Known answers computed apart (Python's hashlib and base64), as the SDK's signature.ts forms them.
TEST(EnvdSignature, TheSdksString) {
  EXPECT_EQ(file_signature("/home/user/a.txt", "read", "", "sesame", std::nullopt),
            "v1_+2YwyGWlGDORZrqOG7uJMATdtj60JnFJFBhTw8vMuRg");
  EXPECT_EQ(file_signature("up/b.txt", "write", "user", "sesame", 1700000000),
            "v1_bXm7w0ouMpFWpCNrmPBn4wfm+MoEMyoqmdFARETdUxE");
}

TEST(EnvdSignature, ChecksOperationUserTokenAndTime) {
  auto parsed = parse_file_signature(
      http::Verb::post, {{"path", "up/b.txt"},
                         {"username", "user"},
                         {"signature", "v1_bXm7w0ouMpFWpCNrmPBn4wfm+MoEMyoqmdFARETdUxE"},
                         {"signature_expiration", "1700000000"}});
  ASSERT_TRUE(parsed);
  ASSERT_TRUE(parsed->has_value());
  FileSignature sig = **parsed;
  EXPECT_EQ(sig.operation, "write");
  EXPECT_EQ(check_file_signature(sig, "sesame", 1700000000), SignatureCheck::kValid);
  EXPECT_EQ(check_file_signature(sig, "sesame", 1700000001), SignatureCheck::kExpired);
  EXPECT_EQ(check_file_signature(sig, "other", 1), SignatureCheck::kWrong);
  EXPECT_EQ(check_file_signature(sig, "", 1), SignatureCheck::kWrong);
  FileSignature read = sig;
  read.operation = "read";  // a write signature does not read
  EXPECT_EQ(check_file_signature(read, "sesame", 1), SignatureCheck::kWrong);
  FileSignature later = sig;
  later.expiration = 1800000000;  // a moved expiration is another signature
  EXPECT_EQ(check_file_signature(later, "sesame", 1), SignatureCheck::kWrong);
  FileSignature other_user = sig;
  other_user.user = "";
  EXPECT_EQ(check_file_signature(other_user, "sesame", 1), SignatureCheck::kWrong);
  EXPECT_FALSE(*parse_file_signature(http::Verb::get, {{"path", "x"}}));  // unsigned
  EXPECT_FALSE(parse_file_signature(http::Verb::get,
                                    {{"signature", "v1_x"}, {"signature_expiration", "soon"}}));
  EXPECT_FALSE(parse_file_signature(http::Verb::get,
                                    {{"signature", "v1_x"}, {"signature_expiration", "-1"}}));
}

TEST_F(EnvdRefusals, SignedFileUrlsWithAndWithoutTheSandboxHeader) {
  const auto body = [](const http::Response& r) { return json::parse(r.body()); };
  const std::int64_t later = std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count() +
                             600;
  const std::string good = file_signature("a.txt", "read", "", "sesame", std::nullopt);
  auto url = [](const std::string& sig, const std::string& extra = "") {
    std::string enc;
    for (char c : sig) {
      enc += c == '+' ? "%2B" : c == '/' ? "%2F" : std::string(1, c);
    }
    return "/files?path=a.txt&signature=" + enc + extra;
  };
  // Right: past the auth to the jail (none here: 502), with the header and without it.
  EXPECT_EQ(get_files(url(good), "live").result_int(), 502);
  EXPECT_EQ(get_files(url(good)).result_int(), 502);
  // Another sandbox's signature, or a tampered one: 401.
  const std::string theirs = file_signature("a.txt", "read", "", "open-sesame", std::nullopt);
  EXPECT_EQ(get_files(url(theirs), "live").result_int(), 401);
  EXPECT_EQ(get_files(url(theirs)).result_int(), 502);  // without the header: it is other's
  std::string tampered = good;
  tampered[5] = tampered[5] == 'A' ? 'B' : 'A';
  auto wrong = get_files(url(tampered));
  EXPECT_EQ(wrong.result_int(), 401);
  EXPECT_EQ(body(wrong)["code"], 401);
  EXPECT_EQ(get_files("/files?path=b.txt&signature=" + good.substr(3)).result_int(), 401);
  // Expiration: in time, and past it (E2B's message).
  const std::string timed = file_signature("a.txt", "read", "", "sesame", later);
  EXPECT_EQ(get_files(url(timed, "&signature_expiration=" + std::to_string(later))).result_int(),
            502);
  const std::string old = file_signature("a.txt", "read", "", "sesame", 1000);
  auto expired = get_files(url(old, "&signature_expiration=1000"));
  EXPECT_EQ(expired.result_int(), 401);
  EXPECT_EQ(body(expired), (json{{"code", 401}, {"message", "signature is already expired"}}));
  // No signature and no token: the usual refusals.
  EXPECT_EQ(get_files("/files?path=a.txt", "live").result_int(), 401);
  EXPECT_EQ(get_files("/files?path=a.txt").result_int(), 404);
}

TEST(EnvdGzip, RoundTripsInChunks) {
  std::string plain;
  for (int i = 0; i < 200000; ++i) {
    plain += std::to_string(i * 7919 % 10007);
  }
  GzipWriter z;
  std::string gz;
  for (std::size_t at = 0; at < plain.size(); at += 65536) {
    gz += z.add(std::string_view(plain).substr(at, 65536));
  }
  gz += z.finish();
  ASSERT_EQ(gz.substr(0, 2), std::string("\x1f\x8b"));
  EXPECT_LT(gz.size(), plain.size());
  auto back = gunzip(gz, plain.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, plain);
  GzipWriter empty;
  auto none = gunzip(empty.finish(), 0);
  ASSERT_TRUE(none);
  EXPECT_EQ(*none, "");
}

TEST(EnvdGzip, ABombStopsAtTheLimitAndGarbageIsRefused) {
  GzipWriter z;
  std::string gz;
  const std::string zeros(1 << 20, '\0');
  for (int i = 0; i < 256; ++i) {  // 256 MiB of zeros in a few hundred KiB
    gz += z.add(zeros);
  }
  gz += z.finish();
  ASSERT_LT(gz.size(), 2u << 20);
  auto bomb = gunzip(gz, 16u << 20);
  ASSERT_FALSE(bomb);
  EXPECT_EQ(bomb.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(gunzip("not gzip at all", 1000).error().code, ErrorCode::kInvalidArgument);
  GzipWriter small;
  std::string ok = small.add("hello");  // two statements: the order of + is unspecified
  ok += small.finish();
  EXPECT_EQ(gunzip(ok.substr(0, ok.size() - 3), 1000).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(gunzip(ok + "trailing", 1000).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(gunzip(ok, 4).error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(*gunzip(ok, 5), "hello");
}

TEST(EnvdGzip, AcceptEncoding) {
  EXPECT_TRUE(accepts_gzip("gzip"));
  EXPECT_TRUE(accepts_gzip("gzip, deflate, br"));
  EXPECT_TRUE(accepts_gzip("br;q=1.0, GZip ; q=0.5"));
  EXPECT_FALSE(accepts_gzip("gzip;q=0"));
  EXPECT_FALSE(accepts_gzip("gzip; q=0.000"));
  EXPECT_FALSE(accepts_gzip("deflate, br, xgzip"));
  EXPECT_FALSE(accepts_gzip(""));
}

}  // namespace
}  // namespace cellgate::envd
