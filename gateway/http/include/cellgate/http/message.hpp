// HTTP requests and responses as the gateway's routes see them, the one map from error codes to
// HTTP statuses, and an Exchange: one request's way back to its client.
//
//   exchange->reply(http::json_response(req, status::ok, {{"id", id}}));
//   exchange->reply(http::error_response(req, make_error(ErrorCode::kNotFound, "no_such_kernel",
//                                                        "Kernel does not exist: " + id)));
//   // → 404 {"reason": "Not Found", "message": "Kernel does not exist: …", "error":
//   "no_such_kernel"}
//
// Thread-safety: the functions are pure; Exchange's methods may be called from any thread.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"

namespace cellgate::http {

namespace beast_http = boost::beast::http;
using Request = beast_http::request<beast_http::string_body>;
using Response = beast_http::response<beast_http::string_body>;
using Status = beast_http::status;
using Verb = beast_http::verb;
using Field = beast_http::field;
using Reply = std::function<void(Response)>;

// The HTTP status for an error: the one place error codes map to HTTP (abseil's canonical codes).
// Three reasons refine a code: "too_large" is 413 and "no_space" 507 (both kResourceExhausted,
// which is otherwise 403: jupyter's "Resource Limit" for --max-kernels, as its clients expect),
// "checkpoints_unavailable" is 501 (hibernate where CRIU cannot work: the host lacks it, rootless,
// unjailed, or behind a broker).
Status status_for(const Error& error);
Status status_for(ErrorCode code);

// A JSON response (no body for 204), `Server: cellgate`, keep-alive as the request asked.
Response json_response(const Request& req, Status status, const nlohmann::json& body);
// {"reason": <HTTP reason phrase>, "message": error.message, "error": error.reason}.
Response error_response(const Request& req, const Error& error);
// A body of bytes with its Content-Type, served so that kernel-made content (an SVG with script,
// an HTML file) cannot run as the gateway's origin (CSP sandbox, nosniff).
Response bytes_response(const Request& req, std::string body, const std::string& content_type);
Response text_response(const Request& req, Status status, const std::string& text);
Response method_not_allowed(const Request& req);

// Whether a token a client offered is the gateway's, compared in constant time (CRYPTO_memcmp).
bool token_equals(std::string_view given, std::string_view token);

// Errors for request bodies (kInvalidArgument, reason "bad_request").
Error bad_request(std::string message);
// The body as a JSON object; an empty body is {}.
Result<nlohmann::json> body_object(const Request& req);

// One request's way back to its client: either one whole response, or a streamed one (chunked:
// a header, then pieces as they are produced, then the end). The HTTP session implements it over
// its connection; LambdaExchange adapts a plain Reply (a streamed answer is gathered into one).
//
// Thread-safety: every method may be called from any thread; the calls of one request must be
// ordered (reply, or begin → write* → end).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void reply(Response res) = 0;
  // Starts a streamed answer with this status and these headers (the body is ignored).
  virtual void begin(Response head) = 0;
  // One piece of a streamed answer. Returns false once the client is gone (or fell too far
  // behind); the producer should then stop and clean up.
  virtual bool write(std::string data) = 0;
  virtual void end() = 0;
  // Cuts a streamed answer: the connection is closed without the last chunk, so the client sees
  // the body end early (what a server that died mid-answer looks like). Default: end().
  virtual void abort() { end(); }
  // Runs `on_gone` (once, from any thread) if the client disconnects before the answer is
  // complete; right away if it already has.
  virtual void watch(std::function<void()> on_gone) = 0;
  // The client's address ("127.0.0.1:51234"), "" when unknown.
  virtual std::string peer() const { return ""; }
  // Bytes of a streamed answer written but not yet sent to the client (0 when unknown): a
  // producer that can wait (a process's output) holds back while this is high.
  virtual std::size_t unsent() const { return 0; }
};

class LambdaExchange : public Exchange {
 public:
  explicit LambdaExchange(Reply reply) : reply_(std::move(reply)) {}
  void reply(Response res) override { reply_(std::move(res)); }
  void begin(Response head) override { head_ = std::move(head); }
  bool write(std::string data) override {
    head_.body() += data;
    return true;
  }
  void end() override {
    head_.prepare_payload();
    reply_(std::move(head_));
  }
  void watch(std::function<void()>) override {}

 private:
  Reply reply_;
  Response head_;
};

}  // namespace cellgate::http
