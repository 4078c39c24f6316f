// The HTTP session (gateway/http/src/sessions.hpp) over Beast's in-memory test::stream, in front
// of a small Router: the input is the bytes a client sends on one connection, then it closes its
// side. Invariants:
//   - every byte the server writes belongs to a well-formed HTTP/1.x response that starts with a
//     status line (up to a 101 Switching Protocols: WebSocket frames follow it);
//   - no route sees a body over the limit body_limit_for() gives its method and target;
//   - a body that passed check_json_depth() and parses has no deeper nesting than kMaxJsonDepth.
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "cellgate/http/handler.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/http/listener.hpp"
#include "cellgate/http/router.hpp"
#include "fuzz_util.hpp"
#include "sessions.hpp"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using cellgate::fuzz::check;
using namespace cellgate::http;

std::size_t depth_of(const nlohmann::json& j) {
  std::size_t deepest = 0;
  if (j.is_structured()) {
    for (const auto& child : j) {
      deepest = std::max(deepest, depth_of(child));
    }
    return deepest + 1;
  }
  return 0;
}

// Echoes WebSocket messages back, as a channel bridge answers them.
class EchoWs : public WsHandler {
 public:
  void on_open(std::shared_ptr<WsConnection> connection) override { conn_ = std::move(connection); }
  void on_message(std::string_view data, bool text) override {
    if (conn_) {
      conn_->send(std::make_shared<ReadyFrame>(std::string(data), !text));
    }
  }
  void on_close() override { conn_.reset(); }

 private:
  std::shared_ptr<WsConnection> conn_;
};

class FuzzHandler : public Handler {
 public:
  explicit FuzzHandler(const HttpOptions& options) : options_(options) {
    router_.add(Verb::get, "/api", [](Call& c) {
      c.reply(json_response(c.req, Status::ok, {{"version", "fuzz"}}));
    });
    // A control route (small body limit) and an execute route (the large one), both JSON.
    auto json_route = [this](Call& c) {
      const std::size_t limit = body_limit_for(options_, c.req.method(), c.req.target());
      check(c.req.body().size() <= limit, "a route got a body over its limit",
            std::to_string(c.req.body().size()) + " > " + std::to_string(limit));
      auto body = body_object(c.req);
      if (!body) {
        return c.fail(body.error());
      }
      check(depth_of(*body) <= kMaxJsonDepth, "a body deeper than kMaxJsonDepth was parsed");
      c.reply(json_response(c.req, Status::created, {{"id", c.param("id")}, {"n", body->size()}}));
    };
    router_.add({Verb::post, Verb::put}, "/api/kernels", json_route);
    router_.add(Verb::post, "/api/kernels/{id}/execute", json_route);
    // A streamed (chunked) answer.
    router_.add(Verb::get, "/api/kernels/{id}/files/{path*}", [](Call& c) {
      Response head = json_response(c.req, Status::ok, nlohmann::json::object());
      c.exchange->begin(std::move(head));
      c.exchange->write(c.param("path"));
      c.exchange->write("\n");
      c.exchange->end();
    });
  }

  void handle(Request req, std::shared_ptr<Exchange> exchange) override {
    Call call{std::move(req), std::move(exchange), {}, {}};
    call.target = Target::parse(call.req.target());
    switch (router_.dispatch(call)) {
      case Router::Match::kFound:
        return;
      case Router::Match::kNoMethod:
        return call.reply(method_not_allowed(call.req));
      case Router::Match::kNoPath:
        return call.fail(cellgate::make_error(cellgate::ErrorCode::kNotFound, "not_found",
                                              "no route for " + call.target.path));
    }
  }

  Upgrade upgrade(const Request& req) override {
    if (Target::parse(req.target()).path != "/api/kernels/k/channels") {
      return {.refusal = error_response(req, cellgate::make_error(cellgate::ErrorCode::kNotFound,
                                                                  "not_found", "no channels")),
              .handler = nullptr,
              .subprotocol = ""};
    }
    return {.refusal = std::nullopt, .handler = std::make_shared<EchoWs>(), .subprotocol = ""};
  }

 private:
  const HttpOptions& options_;
  Router router_;
};

// Every byte written is part of a whole response; stops at a 101 (WebSocket frames follow).
void check_responses(std::string_view out) {
  while (!out.empty()) {
    // Beast answers in the request's version: HTTP/1.0 requests get HTTP/1.0 responses.
    check(out.substr(0, 9) == "HTTP/1.1 " || out.substr(0, 9) == "HTTP/1.0 ",
          "the server wrote something that is not a status line", std::string(out.substr(0, 200)));
    bhttp::response_parser<bhttp::string_body> parser;
    parser.eager(true);
    parser.body_limit(boost::none);
    beast::error_code ec;
    const std::size_t used = parser.put(net::buffer(out.data(), out.size()), ec);
    check(!ec || ec == bhttp::error::need_more, "the server wrote a malformed response",
          ec.message() + "\n" + std::string(out.substr(0, 400)));
    if (parser.is_header_done() && parser.get().result() == bhttp::status::switching_protocols) {
      return;
    }
    if (!parser.is_done()) {
      // A body without Content-Length that runs to the close (none of ours should), or cut.
      parser.put_eof(ec);
      check(!ec && parser.is_done(), "the server wrote an incomplete response",
            ec.message() + "\n" + std::string(out.substr(0, 400)));
      return;
    }
    out.remove_prefix(used);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  HttpOptions options;
  options.max_body_bytes = 4096;
  options.max_control_body_bytes = 256;
  options.max_header_bytes = 2048;
  options.ws_ping_interval = 0;  // no timers left behind
  FuzzHandler handler(options);

  net::io_context ioc;
  beast::test::stream client(ioc);
  beast::test::stream server(ioc);
  client.connect(server);
  std::make_shared<cellgate::http::detail::HttpSession<beast::test::stream>>(handler, options,
                                                                             std::move(server))
      ->run();
  net::write(client, net::buffer(data, size));
  // Run everything that is ready, let the client hang up, and run what that causes. Timers (a
  // WebSocket's handshake deadline) are never waited for: the io_context is destroyed with them.
  auto drain = [&ioc] {
    for (int i = 0; i < 100000; ++i) {
      ioc.restart();
      if (ioc.poll() == 0) {
        return;
      }
    }
    cellgate::fuzz::fail("the session never went idle");
  };
  drain();
  client.close();  // the server reads eof after the bytes; what it writes still arrives
  drain();
  // CELLGATE_FUZZ_ECHO=1: print what the server wrote (to see what an input gets, -runs=0).
  if (std::getenv("CELLGATE_FUZZ_ECHO") != nullptr) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(client.str().size()), client.str().data());
  }
  check_responses(client.str());
  return 0;
}
