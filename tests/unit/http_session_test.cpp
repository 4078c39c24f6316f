// The HTTP session over Beast's in-memory test::stream: parsing, keep-alive, limits, auth and
// routing as a client on a socket sees them, without a socket.
#include <gtest/gtest.h>

#include <boost/beast/_experimental/test/stream.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "server/sessions.hpp"

namespace cellgate::server {
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
    options_.state_dir = state_dir_;
    options_.max_body_bytes = 1024;
    options_.max_header_bytes = 1024;
    manager_ = std::make_unique<KernelManager>(options_);
    api_ = std::make_unique<Api>(*manager_, manager_->options(), "secret");
  }
  ~HttpSessionTest() override {
    api_.reset();
    manager_.reset();
    std::error_code ec;
    std::filesystem::remove_all(state_dir_, ec);
  }

  // Writes `request` (in pieces of `chunk` bytes as the server reads them) and returns what the
  // server wrote back once `until` appears in it (or after a deadline).
  std::string exchange(const std::string& request, const std::string& until,
                       std::size_t chunk = 0,
                       std::chrono::milliseconds patience = std::chrono::seconds(5)) {
    TestStream client(ioc_);
    TestStream server(ioc_);
    client.connect(server);
    if (chunk > 0) {
      server.read_size(chunk);
    }
    std::make_shared<HttpSession<TestStream>>(*api_, manager_->options(), std::move(server))
        ->run();
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
  ServeOptions options_;
  std::unique_ptr<KernelManager> manager_;
  std::unique_ptr<Api> api_;
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
  auto wrong = exchange(
      "GET /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token nope\r\n\r\n", "}");
  EXPECT_EQ(wrong.rfind("HTTP/1.1 403", 0), 0u) << wrong;
  auto right = exchange(
      "GET /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token secret\r\n\r\n", "[]");
  EXPECT_EQ(right.rfind("HTTP/1.1 200", 0), 0u) << right;
  auto query = exchange("GET /api/kernels?token=secret&1712345678901 HTTP/1.1\r\nHost: x\r\n\r\n",
                        "[]");
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
  auto out = exchange("POST /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token secret\r\n"
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
                      "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 413", 0), 0u) << out;
  EXPECT_NE(out.find("Connection: close"), std::string::npos) << out;
  EXPECT_TRUE(manager_->list().empty());
}

TEST_F(HttpSessionTest, HeadersOverTheLimitAre431) {
  const std::string big(4096, 'a');
  auto out = exchange("GET /api HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n", "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 431", 0), 0u) << out;
}

TEST_F(HttpSessionTest, GarbageGetsNoAnswerAndChangesNothing) {
  auto out = exchange("\x16\x03\x01 this is not HTTP\r\n\r\n", "HTTP/1.1", 0,
                      std::chrono::milliseconds(300));
  EXPECT_EQ(out, "");
  // The next connection is served normally.
  auto next = exchange("GET /api HTTP/1.1\r\nHost: x\r\n\r\n", "}");
  EXPECT_EQ(next.rfind("HTTP/1.1 200 OK", 0), 0u) << next;
}

TEST_F(HttpSessionTest, MalformedJsonIs400WithAReason) {
  const std::string body = "{\"name\": ";
  auto out = exchange("POST /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token secret\r\n"
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
                      "}");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  EXPECT_NE(out.find("not valid JSON"), std::string::npos) << out;
}

TEST_F(HttpSessionTest, WebSocketUpgradesAreCheckedBeforeUpgrading) {
  const std::string upgrade =
      "Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
  auto no_token = exchange("GET /api/kernels/4d6c3e0e-6c8e-4b4e-9c43-0f5d4c1e2a77/channels "
                           "HTTP/1.1\r\n" + upgrade + "\r\n",
                           "}");
  EXPECT_EQ(no_token.rfind("HTTP/1.1 401", 0), 0u) << no_token;
  auto unknown = exchange("GET /api/kernels/4d6c3e0e-6c8e-4b4e-9c43-0f5d4c1e2a77/channels"
                          "?token=secret HTTP/1.1\r\n" + upgrade + "\r\n",
                          "}");
  EXPECT_EQ(unknown.rfind("HTTP/1.1 404", 0), 0u) << unknown;
  EXPECT_NE(unknown.find("Kernel does not exist"), std::string::npos) << unknown;
  auto other = exchange("GET /api/kernels?token=secret HTTP/1.1\r\n" + upgrade + "\r\n", "}");
  EXPECT_EQ(other.rfind("HTTP/1.1 404", 0), 0u) << other;
}

}  // namespace
}  // namespace cellgate::server
