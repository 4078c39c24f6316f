// The HTTP session over Beast's in-memory test::stream: parsing, keep-alive, limits, auth and
// routing as a client on a socket sees them, without a socket.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/beast/_experimental/test/stream.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>

#include "cellgate/http/limits.hpp"
#include "cellgate/http/log_limiter.hpp"
#include "cellgate/testing/api_parts.hpp"
#include "sessions.hpp"

namespace cellgate::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using detail::HttpSession;
using TestStream = beast::test::stream;

class HttpSessionTest : public ::testing::Test {
 protected:
  HttpSessionTest() {
    std::string dir = (std::filesystem::temp_directory_path() / "cellgate-http-XXXXXX").string();
    state_dir_ = ::mkdtemp(dir.data());
    options_.max_body_bytes = 1024;
    options_.max_header_bytes = 1024;
    parts_ = std::make_unique<testing::ApiParts>(testing::ApiPartsOptions{
        .state_dir = state_dir_, .token = "secret", .allow_origins = {}, .base_url = "/"});
  }
  ~HttpSessionTest() override {
    parts_.reset();
    std::error_code ec;
    std::filesystem::remove_all(state_dir_, ec);
  }

  // Writes `request` (in pieces of `chunk` bytes as the server reads them) and returns what the
  // server wrote back once `until` appears in it (or after a deadline).
  std::string exchange(const std::string& request, const std::string& until, std::size_t chunk = 0,
                       std::chrono::milliseconds patience = std::chrono::seconds(5)) {
    TestStream client(ioc_);
    TestStream server(ioc_);
    client.connect(server);
    if (chunk > 0) {
      server.read_size(chunk);
    }
    std::make_shared<HttpSession<TestStream>>(parts_->api, options_, std::move(server))->run();
    net::write(client, net::buffer(request));
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (std::chrono::steady_clock::now() < deadline &&
           client.str().find(until) == std::string::npos) {
      ioc_.restart();
      ioc_.run_for(std::chrono::milliseconds(10));
    }
    ioc_.restart();
    ioc_.run_for(std::chrono::milliseconds(20));  // let anything after `until` arrive too
    return std::string(client.str());
  }

  static std::size_t count(const std::string& haystack, const std::string& needle) {
    std::size_t n = 0;
    for (auto pos = haystack.find(needle); pos != std::string::npos;
         pos = haystack.find(needle, pos + 1)) {
      ++n;
    }
    return n;
  }

  net::io_context ioc_;
  std::string state_dir_;
  HttpOptions options_;
  std::unique_ptr<testing::ApiParts> parts_;
};

TEST_F(HttpSessionTest, AnswersApiWithoutAToken) {
  auto out = exchange("GET /api HTTP/1.1\r\nHost: x\r\n\r\n", "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << out;
  EXPECT_NE(out.find("Content-Type: application/json"), std::string::npos) << out;
  EXPECT_NE(out.find("\"version\""), std::string::npos) << out;
}

TEST_F(HttpSessionTest, MissingAndWrongTokensAreRefused) {
  auto none = exchange("GET /api/kernels HTTP/1.1\r\nHost: x\r\n\r\n", "}");
  EXPECT_EQ(none.rfind("HTTP/1.1 401", 0), 0u) << none;
  EXPECT_NE(none.find("\"reason\":\"Unauthorized\""), std::string::npos) << none;
  auto wrong =
      exchange("GET /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token nope\r\n\r\n", "}");
  EXPECT_EQ(wrong.rfind("HTTP/1.1 403", 0), 0u) << wrong;
  auto right =
      exchange("GET /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token secret\r\n\r\n", "[]");
  EXPECT_EQ(right.rfind("HTTP/1.1 200", 0), 0u) << right;
  auto query =
      exchange("GET /api/kernels?token=secret&1712345678901 HTTP/1.1\r\nHost: x\r\n\r\n", "[]");
  EXPECT_EQ(query.rfind("HTTP/1.1 200", 0), 0u) << query;
}

TEST_F(HttpSessionTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  const std::string one = "GET /api HTTP/1.1\r\nHost: x\r\n\r\n";
  auto out = exchange(one + one + "GET /nope?token=secret HTTP/1.1\r\nHost: x\r\n\r\n", "404");
  EXPECT_EQ(count(out, "HTTP/1.1 200 OK"), 2u) << out;
  EXPECT_EQ(count(out, "HTTP/1.1 404 Not Found"), 1u) << out;
}

TEST_F(HttpSessionTest, ARequestArrivingByteByByteIsParsed) {
  auto out = exchange("GET /api HTTP/1.1\r\nHost: x\r\n\r\n", "}", 1);
  EXPECT_EQ(out.rfind("HTTP/1.1 200 OK", 0), 0u) << out;
}

TEST_F(HttpSessionTest, ABodyOverTheLimitIs413AndTheConnectionCloses) {
  const std::string body(4096, 'x');
  auto out = exchange(
      "POST /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token secret\r\n"
      "Content-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body,
      "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 413", 0), 0u) << out;
  EXPECT_NE(out.find("Connection: close"), std::string::npos) << out;
  EXPECT_TRUE(parts_->registry.list().empty());
}

TEST_F(HttpSessionTest, HeadersOverTheLimitAre431) {
  const std::string big(4096, 'a');
  auto out = exchange("GET /api HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n", "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 431", 0), 0u) << out;
}

TEST_F(HttpSessionTest, GarbageIs400AndChangesNothing) {
  auto out = exchange("\x16\x03\x01 this is not HTTP\r\n\r\n", "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  EXPECT_NE(out.find("Connection: close"), std::string::npos) << out;
  // The next connection is served normally.
  auto next = exchange("GET /api HTTP/1.1\r\nHost: x\r\n\r\n", "}");
  EXPECT_EQ(next.rfind("HTTP/1.1 200 OK", 0), 0u) << next;
}

// Bytes that cannot begin a request head are answered as they arrive, not once a CRLFCRLF they
// never send would complete it (over a socket: silence until the header deadline). The stream
// here has no deadline, so a session that waits answers nothing within the patience.
TEST_F(HttpSessionTest, BytesThatCannotStartARequestAre400AtOnce) {
  auto bytes_of = [](const auto& literal) { return std::string(literal, sizeof(literal) - 1); };
  const std::pair<const char*, std::string> cases[] = {
      {"a bare LF ending the request line", "GET /api HTTP/1.1\nHost: x\n\n"},
      {"a bare LF ending a header line", "GET /api HTTP/1.1\r\nHost: x\nX-A: y\r\n"},
      {"binary", bytes_of("\x8f\xff\x01\x02(garbage)\x7f")},
      {"a NUL in the target", bytes_of("GET /a\0pi HTTP/1.1\r\n")},
      {"HTTP/2's preface line", "PRI * HTTP/2.0\r\n"},
      {"a TLS ClientHello", bytes_of("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")},
  };
  for (const auto& [what, bytes] : cases) {
    for (std::size_t chunk : {std::size_t{0}, std::size_t{1}}) {  // at once, and byte by byte
      auto out = exchange(bytes, "}", chunk, std::chrono::seconds(2));
      EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << what << ", chunk " << chunk << ": " << out;
      EXPECT_NE(out.find("Connection: close"), std::string::npos) << what << ": " << out;
    }
  }
  auto tls = exchange(cases[5].second, "}");
  EXPECT_NE(tls.find("plain HTTP, not TLS"), std::string::npos) << tls;
  auto h2 = exchange(cases[4].second, "}");
  EXPECT_NE(h2.find("not HTTP/2"), std::string::npos) << h2;
  // What may still become a request is not refused early: the same request whole is served.
  auto out = exchange("GET /api HTTP/1.1\r\nHost: x\r\n\r\n", "}", 1);
  EXPECT_EQ(out.rfind("HTTP/1.1 200 OK", 0), 0u) << out;
}

TEST_F(HttpSessionTest, ARequestLineThatNeverEndsIs431AtTheLimit) {
  // 1 KiB header limit here: the answer comes with the first read past it, not at a deadline.
  auto out = exchange("GET /" + std::string(4096, 'a'), "}", 0, std::chrono::seconds(2));
  EXPECT_EQ(out.rfind("HTTP/1.1 431", 0), 0u) << out;
}

TEST_F(HttpSessionTest, AMalformedRequestLineIs400ThenClose) {
  auto out = exchange("GET\r\nHost: x\r\n\r\n", "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  EXPECT_NE(out.find("Connection: close"), std::string::npos) << out;
  out = exchange("GET /api HTTP/1.1 extra\r\nHost: x\r\n\r\n", "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
}

TEST_F(HttpSessionTest, AMalformedHeaderIs400ThenClose) {
  auto out = exchange("GET /api HTTP/1.1\r\nHost x\r\n\r\nGET /api HTTP/1.1\r\n\r\n", "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  EXPECT_EQ(count(out, "HTTP/1.1"), 1u) << out;  // nothing after it is read
}

TEST_F(HttpSessionTest, ObsFoldIs400) {
  for (const char* fold : {" ", "\t"}) {
    auto out = exchange(
        std::string("GET /api HTTP/1.1\r\nHost: x\r\nX-A: one\r\n") + fold + "two\r\n\r\n", "}");
    EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
    EXPECT_NE(out.find("folding"), std::string::npos) << out;
  }
  // A space inside a value is no fold.
  auto out = exchange("GET /api HTTP/1.1\r\nHost: x\r\nX-A: one two\r\n\r\n", "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 200 OK", 0), 0u) << out;
}

TEST_F(HttpSessionTest, ControlRoutesHaveTheSmallBodyLimit) {
  options_.max_control_body_bytes = 256;
  const std::string body = "{\"name\": \"" + std::string(500, 'x') + "\"}";
  auto post = [&](const std::string& path) {
    return exchange("POST " + path +
                        " HTTP/1.1\r\nHost: x\r\nAuthorization: token secret\r\n"
                        "Content-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body,
                    "}");
  };
  for (const char* path : {"/api/kernels", "/api/kernels/k1/restart", "/api/kernels/k1/interrupt",
                           "/api/sessions", "/api/sessions/s1"}) {
    auto out = post(path);
    EXPECT_EQ(out.rfind("HTTP/1.1 413", 0), 0u) << path << ": " << out;
    EXPECT_NE(out.find("limit of 256 bytes"), std::string::npos) << out;
  }
  // Execute keeps the large limit: the body is read and the route answers (no such kernel).
  auto out = post("/api/kernels/k1/execute");
  EXPECT_EQ(out.find("HTTP/1.1 413"), std::string::npos) << out;
  EXPECT_TRUE(parts_->registry.list().empty());
}

TEST_F(HttpSessionTest, DeeplyNestedJsonIs400BeforeItIsParsed) {
  const std::string body = "{\"env\": " + std::string(100, '[') + std::string(100, ']') + "}";
  auto out = exchange(
      "POST /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token secret\r\n"
      "Content-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body,
      "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  EXPECT_NE(out.find("deeper than 64"), std::string::npos) << out;
  EXPECT_TRUE(parts_->registry.list().empty());
}

TEST(HttpLimits, JsonDepthSkipsStringsAndCountsBothBrackets) {
  EXPECT_TRUE(check_json_depth(std::string(64, '[') + std::string(64, ']')));
  EXPECT_FALSE(check_json_depth(std::string(65, '[')));
  EXPECT_FALSE(check_json_depth("{\"a\":" + std::string(64, '{')));
  EXPECT_TRUE(check_json_depth("\"" + std::string(1000, '[') + "\""));
  EXPECT_TRUE(check_json_depth("[\"\\\"" + std::string(1000, '[') + "\"]"));
}

TEST(HttpLimits, RepeatedLogLinesAreHeldBackAndCounted) {
  LogLimiter limiter(3, std::chrono::seconds(10));
  const auto t0 = LogLimiter::Clock::now();
  int logged = 0;
  for (int i = 0; i < 1000; ++i) {
    logged += limiter.admit("bad_frame", t0 + std::chrono::milliseconds(i)).has_value() ? 1 : 0;
  }
  EXPECT_EQ(logged, 3);
  EXPECT_EQ(limiter.admit("other", t0), std::string());  // keys are counted apart
  auto next = limiter.admit("bad_frame", t0 + std::chrono::seconds(11));
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, " (997 more like this in the last 11 s)");
  EXPECT_EQ(limiter.admit("bad_frame", t0 + std::chrono::seconds(12)), std::string());
}

TEST(HttpLimits, BodyLimitsByRoute) {
  HttpOptions o;
  o.max_body_bytes = 1000;
  o.max_control_body_bytes = 10;
  EXPECT_EQ(body_limit_for(o, Verb::post, "/api/kernels"), 10u);
  EXPECT_EQ(body_limit_for(o, Verb::post, "/base/api/kernels?x=1"), 10u);
  EXPECT_EQ(body_limit_for(o, Verb::post, "/contexts/abc/restart"), 10u);
  EXPECT_EQ(body_limit_for(o, Verb::post, "/api/kernels/abc/execute"), 1000u);
  EXPECT_EQ(body_limit_for(o, Verb::post, "/execute"), 1000u);
  EXPECT_EQ(body_limit_for(o, Verb::put, "/api/kernels/abc/files/api/kernels"), 1000u);
}

TEST_F(HttpSessionTest, MalformedJsonIs400WithAReason) {
  const std::string body = "{\"name\": ";
  auto out = exchange(
      "POST /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token secret\r\n"
      "Content-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body,
      "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  EXPECT_NE(out.find("not valid JSON"), std::string::npos) << out;
}

TEST_F(HttpSessionTest, WebSocketUpgradesAreCheckedBeforeUpgrading) {
  const std::string upgrade =
      "Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
  auto no_token = exchange(
      "GET /api/kernels/4d6c3e0e-6c8e-4b4e-9c43-0f5d4c1e2a77/channels "
      "HTTP/1.1\r\n" +
          upgrade + "\r\n",
      "}");
  EXPECT_EQ(no_token.rfind("HTTP/1.1 401", 0), 0u) << no_token;
  auto unknown = exchange(
      "GET /api/kernels/4d6c3e0e-6c8e-4b4e-9c43-0f5d4c1e2a77/channels"
      "?token=secret HTTP/1.1\r\n" +
          upgrade + "\r\n",
      "}");
  EXPECT_EQ(unknown.rfind("HTTP/1.1 404", 0), 0u) << unknown;
  EXPECT_NE(unknown.find("Kernel does not exist"), std::string::npos) << unknown;
  auto other = exchange("GET /api/kernels?token=secret HTTP/1.1\r\n" + upgrade + "\r\n", "}");
  EXPECT_EQ(other.rfind("HTTP/1.1 404", 0), 0u) << other;
}

// A handler that answers /stream as a chunked stream of three pieces, /hang never (it only
// watches for the client leaving), and anything else with a small whole response.
class ScriptedHandler : public Handler {
 public:
  void handle(Request req, std::shared_ptr<Exchange> exchange) override {
    const std::string target(req.target());
    if (target == "/hang") {
      exchange->watch([this] { gone.store(true); });
      held = exchange;  // never answered
      return;
    }
    if (target == "/stream") {
      Response head{Status::ok, req.version()};
      head.set(Field::content_type, "application/x-ndjson");
      head.keep_alive(req.keep_alive());
      exchange->begin(std::move(head));
      for (const char* piece : {"{\"n\":1}\n", "{\"n\":2}\n", "{\"type\":\"end\"}\n"}) {
        exchange->write(piece);
      }
      exchange->end();
      return;
    }
    exchange->reply(json_response(req, Status::ok, nlohmann::json{{"t", target}}));
  }
  Upgrade upgrade(const Request& req) override {
    Upgrade u;
    u.refusal = json_response(req, Status::not_found, nlohmann::json::object());
    return u;
  }
  std::atomic<bool> gone{false};
  std::shared_ptr<Exchange> held;
};

class StreamingSessionTest : public ::testing::Test {
 protected:
  std::string run(TestStream& client, const std::string& until,
                  std::chrono::milliseconds patience = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (std::chrono::steady_clock::now() < deadline &&
           client.str().find(until) == std::string::npos) {
      ioc_.restart();
      ioc_.run_for(std::chrono::milliseconds(10));
    }
    return std::string(client.str());
  }

  net::io_context ioc_;
  HttpOptions options_;
  ScriptedHandler handler_;
};

TEST_F(StreamingSessionTest, AStreamIsChunkedAndTheConnectionServesTheNextRequest) {
  TestStream client(ioc_);
  TestStream server(ioc_);
  client.connect(server);
  std::make_shared<HttpSession<TestStream>>(handler_, options_, std::move(server))->run();
  net::write(client, net::buffer(std::string("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")));
  auto out = run(client, "0\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << out;
  EXPECT_NE(out.find("Transfer-Encoding: chunked"), std::string::npos) << out;
  // Each piece is its own chunk: size in hex, CRLF, the bytes, CRLF; then the last chunk.
  EXPECT_NE(out.find("\r\n\r\n8\r\n{\"n\":1}\n\r\n8\r\n{\"n\":2}\n\r\nf\r\n{\"type\":\"end\"}\n\r\n"
                     "0\r\n\r\n"),
            std::string::npos)
      << out;
  // Keep-alive: the watching read hands the next request over once the stream has ended.
  net::write(client, net::buffer(std::string("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")));
  out = run(client, "/after\"}");
  EXPECT_NE(out.find("{\"t\":\"/after\"}"), std::string::npos) << out;
}

TEST_F(StreamingSessionTest, AClientLeavingMidAnswerIsNoticed) {
  TestStream client(ioc_);
  TestStream server(ioc_);
  client.connect(server);
  std::make_shared<HttpSession<TestStream>>(handler_, options_, std::move(server))->run();
  net::write(client, net::buffer(std::string("GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")));
  run(client, "never", std::chrono::milliseconds(100));
  EXPECT_FALSE(handler_.gone.load()) << "the client is still there";
  client.close();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!handler_.gone.load() && std::chrono::steady_clock::now() < deadline) {
    ioc_.restart();
    ioc_.run_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(handler_.gone.load()) << "the handler was not told the client left";
  // Writing to a gone client is refused, so a producer knows to stop.
  EXPECT_FALSE(handler_.held->write("late"));
  handler_.held.reset();
}

TEST_F(StreamingSessionTest, PipelinedRequestsAreAnsweredInOrder) {
  TestStream client(ioc_);
  TestStream server(ioc_);
  client.connect(server);
  std::make_shared<HttpSession<TestStream>>(handler_, options_, std::move(server))->run();
  net::write(client, net::buffer(std::string("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"
                                             "GET /second HTTP/1.1\r\nHost: x\r\n\r\n")));
  auto out = run(client, "/second\"}");
  const auto end_of_stream = out.find("0\r\n\r\n");
  const auto second = out.find("{\"t\":\"/second\"}");
  ASSERT_NE(end_of_stream, std::string::npos) << out;
  ASSERT_NE(second, std::string::npos) << out;
  EXPECT_LT(end_of_stream, second) << out;
}

}  // namespace
}  // namespace cellgate::http
