// The REST API: one function from a request to a response, so it can be tested without sockets.
//
//   Api api(manager, options);
//   api.handle(std::move(request), [](Response r) { ... });   // may answer later, from a pool
//
// Routes (under base_url): /api, /api/kernelspecs[/{name}], /kernelspecs/{name}/{file},
// /api/kernels[/{id}[/interrupt|/restart]], /api/sessions[/{id}]. WebSocket upgrades of
// /api/kernels/{id}/channels are checked here (check_channels) and served by the HTTP layer.
// Errors are JSON {"reason", "message"} with the status from http_status().
//
// Thread-safety: handle() may be called from any thread; `reply` is called exactly once, from
// the calling thread or from the blocking pool.
#pragma once

#include <boost/asio/thread_pool.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cellgate/server/config.hpp"
#include "cellgate/server/execute.hpp"
#include "cellgate/server/kernel_manager.hpp"

namespace cellgate::server {

namespace http = boost::beast::http;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;
using Reply = std::function<void(Response)>;

// One request's way back to its client: either one whole response, or a streamed one (chunked:
// a header, then pieces as they are produced, then the end). The HTTP layer implements it over a
// connection; LambdaExchange adapts a plain Reply (a streamed answer is gathered into one body).
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
  // Runs `on_gone` (once, from any thread) if the client disconnects before the answer is
  // complete; right away if it already has.
  virtual void watch(std::function<void()> on_gone) = 0;
  // The client's address ("127.0.0.1:51234"), "" when unknown.
  virtual std::string peer() const { return ""; }
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

// Something that answers HTTP requests: the Jupyter API, or the E2B-compatible one.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void handle(Request req, std::shared_ptr<Exchange> exchange) = 0;
  // For a WebSocket upgrade of /api/kernels/{id}/channels: the kernel, or the response to send
  // instead of upgrading (401, 403, 404).
  struct ChannelsCheck {
    std::shared_ptr<ManagedKernel> kernel;
    std::string session_id;
    std::optional<Response> refusal;
  };
  virtual ChannelsCheck check_channels(const Request& req) = 0;
};

// A path and its decoded query.
struct Target {
  std::string path;
  std::map<std::string, std::string> query;
  static Target parse(std::string_view target);
};

struct Session {
  std::string id, path, name, type, kernel_id;
};

class Api : public Handler {
 public:
  Api(KernelManager& manager, const ServeOptions& options, std::string token);
  ~Api() override;

  void handle(Request req, Reply reply) {
    handle(std::move(req), std::make_shared<LambdaExchange>(std::move(reply)));
  }
  void handle(Request req, std::shared_ptr<Exchange> exchange) override;
  ChannelsCheck check_channels(const Request& req) override;

  // Adds CORS headers for an allowed Origin.
  void decorate(const Request& req, Response& res) const;
  // Whether the Origin header (if any) is allowed: same host, or in --allow-origin.
  bool origin_allowed(const Request& req) const;

  Executor& executor() { return *executor_; }

  static Response json_response(const Request& req, http::status status, const nlohmann::json& body);
  static Response error_response(const Request& req, const Error& error);

 private:
  std::optional<Response> authenticate(const Request& req, const Target& target) const;
  void route(Request req, const Target& target, Reply reply, std::shared_ptr<Exchange> exchange);
  void kernels(Request req, const std::vector<std::string>& parts, Reply reply,
               std::shared_ptr<Exchange> exchange);
  // Agent routes (agent_routes.cpp): execute (JSON, NDJSON or SSE), one-shot, artifacts, files.
  void execute(Request req, const std::string& id, Reply reply, std::shared_ptr<Exchange> exchange);
  void execute_once(Request req, Reply reply, std::shared_ptr<Exchange> exchange);
  void kernel_artifacts(const Request& req, const std::string& id, Reply reply);
  void artifact(const Request& req, const std::vector<std::string>& parts, Reply reply);
  void files(Request req, const std::vector<std::string>& parts, Reply reply);
  std::chrono::milliseconds keepalive_interval() const;
  void sessions(Request req, const std::vector<std::string>& parts, Reply reply);
  void kernelspecs(const Request& req, const std::vector<std::string>& parts, Reply reply);
  void kernelspec_file(const Request& req, const std::vector<std::string>& parts, Reply reply);
  nlohmann::json spec_model(const kernel::KernelSpec& spec) const;
  // Removes base_url from the front of `path`; false when the path is not under it.
  bool strip_base(std::string& path) const;
  nlohmann::json session_model(const Session& s) const;
  // Runs blocking work on the pool and replies from there.
  void offload(std::function<Response()> work, Reply reply);

  KernelManager& manager_;
  const ServeOptions& options_;
  std::unique_ptr<Executor> executor_;
  const std::string token_;
  std::string base_;  // base_url without its trailing slash ("" for "/")
  // Blocking work (kernel starts, restarts, shutdowns): mostly waiting, so many threads; kernel
  // starts must not queue behind each other (20 at once should take one start's time).
  boost::asio::thread_pool pool_{32};

  std::mutex sessions_mu_;
  std::map<std::string, Session> sessions_;
};

}  // namespace cellgate::server
