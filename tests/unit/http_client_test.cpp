// The CLI's HTTP client against a tiny loopback server (a raw socket on 127.0.0.1, port 0, one
// connection, scripted by the test): request()'s status, body and headers; stream() handing each
// piece of a chunked body over as it arrives; error answers collected; and bounded time when the
// server never answers, stalls mid-body, or cuts the body short. parse_url and encode_path too.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "cellgate/http/client.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::http::client {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Accepts one connection on a loopback port, reads the request (headers and a Content-Length
// body) and hands the socket to `script`. The thread is joined on destruction.
class OneShotServer {
 public:
  using Script = std::function<void(int fd, const std::string& request)>;

  explicit OneShotServer(Script script) {
    listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (!listener_ || ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listener_.get(), 1) != 0 ||
        ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, script = std::move(script)] {
      UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn) {
        return;
      }
      const std::string request = read_request(conn.get());
      {
        std::lock_guard lock(mu_);
        request_ = request;
      }
      script(conn.get(), request);
    });
  }
  ~OneShotServer() {
    if (thread_.joinable()) {
      ::shutdown(listener_.get(), SHUT_RDWR);  // unblocks accept() if no client came
      thread_.join();
    }
  }

  Url url() const { return Url{false, "127.0.0.1", std::to_string(port_), ""}; }
  bool listening() const { return port_ != 0; }
  std::string request() {
    std::lock_guard lock(mu_);
    return request_;
  }

  static void send(int fd, const std::string& bytes) {
    for (std::size_t done = 0; done < bytes.size();) {
      const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) {
        return;
      }
      done += static_cast<std::size_t>(n);
    }
  }

 private:
  static std::string read_request(int fd) {
    std::string got;
    char buf[4096];
    std::size_t want = std::string::npos;
    while (want == std::string::npos || got.size() < want) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        break;
      }
      got.append(buf, static_cast<std::size_t>(n));
      const auto end = got.find("\r\n\r\n");
      if (want == std::string::npos && end != std::string::npos) {
        std::size_t length = 0;
        if (const auto cl = got.find("Content-Length: "); cl != std::string::npos && cl < end) {
          length = std::stoul(got.substr(cl + 16));
        }
        want = end + 4 + length;
      }
    }
    return got;
  }

  UniqueFd listener_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::string request_;
};

std::string chunk(const std::string& data) {
  char size[16];
  std::snprintf(size, sizeof size, "%zx", data.size());
  return std::string(size) + "\r\n" + data + "\r\n";
}

// A flag one thread waits on, with a bound, and another sets.
class Signal {
 public:
  void set() {
    {
      std::lock_guard lock(mu_);
      set_ = true;
    }
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

TEST(HttpClient, RequestSendsHeadersAndReturnsStatusAndBody) {
  OneShotServer server([](int fd, const std::string&) {
    OneShotServer::send(fd,
                        "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                        "Content-Length: 13\r\nConnection: close\r\n\r\n{\"id\": \"k1\"}\n");
  });
  ASSERT_TRUE(server.listening());
  Url url = server.url();
  url.base = "/base";
  Client client(url, "sekrit", "cellgate-test");
  auto res = client.request("POST", "/api/kernels", R"({"name":"python3"})", 5s);
  ASSERT_TRUE(res) << res.error().message;
  EXPECT_EQ(res->status, 201);
  EXPECT_EQ(res->body, "{\"id\": \"k1\"}\n");
  const std::string request = server.request();
  EXPECT_EQ(request.rfind("POST /base/api/kernels HTTP/1.1\r\n", 0), 0u) << request;
  EXPECT_NE(request.find("Authorization: token sekrit\r\n"), std::string::npos);
  EXPECT_NE(request.find("User-Agent: cellgate-test\r\n"), std::string::npos);
  EXPECT_NE(request.find("Content-Type: application/json\r\n"), std::string::npos);
  EXPECT_NE(request.find("\r\n\r\n{\"name\":\"python3\"}"), std::string::npos);
}

TEST(HttpClient, StreamHandsOverEachPieceAsItArrives) {
  Signal got_first;
  std::atomic<bool> streamed{false};  // the client had the first piece before the rest was sent
  OneShotServer server([&](int fd, const std::string&) {
    OneShotServer::send(fd,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n" +
                            chunk("{\"type\":\"stream\"}\n"));
    streamed = got_first.wait(5s);
    OneShotServer::send(fd, chunk("{\"type\":") + chunk("\"end\"}\n"));
    OneShotServer::send(fd, "0\r\n\r\n");
  });
  ASSERT_TRUE(server.listening());
  Client client(server.url(), "", "cellgate-test");
  std::string body;
  std::vector<std::string> pieces;
  auto res = client.stream("POST", "/api/execute", "{}", "application/x-ndjson",
                           [&](std::string_view piece) {
                             pieces.emplace_back(piece);
                             body.append(piece);
                             if (body.find('\n') != std::string::npos) {
                               got_first.set();
                             }
                           },
                           {.head = 5s, .idle = 5s, .total = 10s});
  ASSERT_TRUE(res) << res.error().message;
  EXPECT_EQ(res->status, 200);
  EXPECT_TRUE(res->body.empty());
  EXPECT_EQ(body, "{\"type\":\"stream\"}\n{\"type\":\"end\"}\n");
  EXPECT_GE(pieces.size(), 2u);
  EXPECT_EQ(pieces.front(), "{\"type\":\"stream\"}\n");
  EXPECT_TRUE(streamed) << "the first piece reached the callback only after the whole body";
  EXPECT_NE(server.request().find("Accept: application/x-ndjson\r\n"), std::string::npos);
}

TEST(HttpClient, StreamReadsABodyEndedByClose) {
  OneShotServer server([](int fd, const std::string&) {
    OneShotServer::send(fd, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nline 1\n");
    OneShotServer::send(fd, "line 2\n");
  });
  ASSERT_TRUE(server.listening());
  Client client(server.url(), "", "cellgate-test");
  std::string body;
  auto res = client.stream("POST", "/x", "{}", "application/x-ndjson",
                           [&](std::string_view piece) { body.append(piece); }, {.head = 5s});
  ASSERT_TRUE(res) << res.error().message;
  EXPECT_EQ(body, "line 1\nline 2\n");
}

TEST(HttpClient, StreamCollectsAnErrorAnswer) {
  OneShotServer server([](int fd, const std::string&) {
    const std::string body = R"({"reason": "no_such_kernel", "message": "no kernel k9"})";
    OneShotServer::send(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body);
  });
  ASSERT_TRUE(server.listening());
  Client client(server.url(), "", "cellgate-test");
  bool called = false;
  auto res = client.stream("POST", "/api/kernels/k9/execute", "{}", "application/x-ndjson",
                           [&](std::string_view) { called = true; }, {.head = 5s});
  ASSERT_TRUE(res) << res.error().message;
  EXPECT_EQ(res->status, 404);
  EXPECT_FALSE(called);
  EXPECT_EQ(res->error_message(), "no kernel k9");
}

TEST(HttpClient, AServerThatNeverAnswersTimesOut) {
  Signal done;
  OneShotServer server([&](int, const std::string&) { done.wait(10s); });
  ASSERT_TRUE(server.listening());
  Client client(server.url(), "", "cellgate-test");
  const auto started = Clock::now();
  auto res = client.stream("POST", "/x", "{}", "application/x-ndjson", [](std::string_view) {},
                           {.head = 300ms});
  done.set();
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_NE(res.error().message.find("POST http://127.0.0.1:"), std::string::npos);
  EXPECT_NE(res.error().message.find("cannot read the answer"), std::string::npos)
      << res.error().message;
  EXPECT_LT(Clock::now() - started, 5s);

  Signal done2;
  OneShotServer quiet([&](int, const std::string&) { done2.wait(10s); });
  ASSERT_TRUE(quiet.listening());
  auto req = Client(quiet.url(), "", "t").request("GET", "/api/kernelspecs", "", 300ms);
  done2.set();
  ASSERT_FALSE(req);
  EXPECT_EQ(req.error().code, ErrorCode::kDeadlineExceeded);
}

TEST(HttpClient, AStreamThatStallsTimesOutAfterTheIdleLimit) {
  Signal done;
  OneShotServer server([&](int fd, const std::string&) {
    OneShotServer::send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
                                chunk("{\"type\":\"stream\"}\n"));
    done.wait(10s);
  });
  ASSERT_TRUE(server.listening());
  Client client(server.url(), "", "cellgate-test");
  std::string body;
  const auto started = Clock::now();
  auto res = client.stream("POST", "/x", "{}", "application/x-ndjson",
                           [&](std::string_view piece) { body.append(piece); },
                           {.head = 5s, .idle = 300ms});
  done.set();
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(body, "{\"type\":\"stream\"}\n");  // what came before the stall was handed over
  EXPECT_LT(Clock::now() - started, 5s);
}

TEST(HttpClient, AStreamCutShortIsAnError) {
  OneShotServer server([](int fd, const std::string&) {
    OneShotServer::send(
        fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk("partial\n"));
    // Closing without the last chunk.
  });
  ASSERT_TRUE(server.listening());
  Client client(server.url(), "", "cellgate-test");
  std::string body;
  auto res = client.stream("POST", "/x", "{}", "application/x-ndjson",
                           [&](std::string_view piece) { body.append(piece); }, {.head = 5s});
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(body, "partial\n");
}

TEST(HttpClient, ARefusedConnectionIsUnavailable) {
  // A port bound but not listening refuses connections.
  UniqueFd bound(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(bound.get(), reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::getsockname(bound.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const Url url{false, "127.0.0.1", std::to_string(ntohs(addr.sin_port)), ""};
  auto res = Client(url, "", "t").request("GET", "/", "", 2s);
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(res.error().message.find("cannot connect"), std::string::npos) << res.error().message;
}

TEST(HttpClient, ParsesUrls) {
  auto u = parse_url("https://example.org/base/");
  ASSERT_TRUE(u);
  EXPECT_TRUE(u->tls);
  EXPECT_EQ(u->host, "example.org");
  EXPECT_EQ(u->port, "443");
  EXPECT_EQ(u->base, "/base");
  auto v6 = parse_url("http://[::1]:8888");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, "8888");
  EXPECT_EQ(v6->base, "");
  EXPECT_FALSE(parse_url("ftp://x"));
  EXPECT_FALSE(parse_url("http://:80"));
  EXPECT_FALSE(parse_url("http://[::1"));
}

TEST(HttpClient, EncodesPathSegments) {
  EXPECT_EQ(encode_path("data/sales 2024.csv"), "data/sales%202024.csv");
  EXPECT_EQ(encode_path("a?b#c/é"), "a%3Fb%23c/%C3%A9");
}

}  // namespace
}  // namespace cellgate::http::client
