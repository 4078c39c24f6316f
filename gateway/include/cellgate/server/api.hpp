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
#include "cellgate/server/kernel_manager.hpp"

namespace cellgate::server {

namespace http = boost::beast::http;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;
using Reply = std::function<void(Response)>;

// A path and its decoded query.
struct Target {
  std::string path;
  std::map<std::string, std::string> query;
  static Target parse(std::string_view target);
};

struct Session {
  std::string id, path, name, type, kernel_id;
};

class Api {
 public:
  Api(KernelManager& manager, const ServeOptions& options, std::string token);
  ~Api();

  void handle(Request req, Reply reply);

  // For a WebSocket upgrade of /api/kernels/{id}/channels: the kernel, or the response to send
  // instead of upgrading (401, 403, 404).
  struct ChannelsCheck {
    std::shared_ptr<ManagedKernel> kernel;
    std::string session_id;
    std::optional<Response> refusal;
  };
  ChannelsCheck check_channels(const Request& req);

  // Adds CORS headers for an allowed Origin.
  void decorate(const Request& req, Response& res) const;
  // Whether the Origin header (if any) is allowed: same host, or in --allow-origin.
  bool origin_allowed(const Request& req) const;

  static Response json_response(const Request& req, http::status status, const nlohmann::json& body);
  static Response error_response(const Request& req, const Error& error);

 private:
  std::optional<Response> authenticate(const Request& req, const Target& target) const;
  void route(Request req, const Target& target, Reply reply);
  void kernels(Request req, const std::vector<std::string>& parts, Reply reply);
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
  const std::string token_;
  std::string base_;  // base_url without its trailing slash ("" for "/")
  // Blocking work (kernel starts, restarts, shutdowns): mostly waiting, so many threads; kernel
  // starts must not queue behind each other (20 at once should take one start's time).
  boost::asio::thread_pool pool_{32};

  std::mutex sessions_mu_;
  std::map<std::string, Session> sessions_;
};

}  // namespace cellgate::server
