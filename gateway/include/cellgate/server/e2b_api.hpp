// E2B-compatible endpoints, so agents written for E2B's code interpreter run unchanged against
// cellgate (docs/e2b.md has the protocol, read from the SDK's source):
//
//   POST   /execute                 {code, context_id?, language?, env_vars?} → NDJSON lines
//   POST   /contexts                {language?, cwd?} → {id, language, cwd}
//   GET    /contexts                → [{id, language, cwd}, ...]
//   POST   /contexts/{id}/restart   → 204 (variables gone, cwd kept)
//   DELETE /contexts/{id}           → 204
//   GET    /health                  → 200 (no token needed)
//
// A context is a jailed kernel of the default kernelspec. /execute without a context uses a
// default context, started on first use. Auth: the gateway token in X-Access-Token or
// Authorization ("token t" / "Bearer t"). Served on a second listener (`--e2b-port`), as E2B's SDK
// in debug mode talks to http://localhost:49999.
//
// Thread-safety: handle() may be called from any thread.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "cellgate/server/api.hpp"

namespace cellgate::server {

class E2bApi : public Handler {
 public:
  // `api` provides the executor and the blocking pool's behaviour; it must outlive this.
  // token "" : every request is allowed. allow_missing_token: a request without any token is
  // allowed (E2B's SDK in debug mode sends none), but a wrong one is still refused.
  E2bApi(KernelManager& manager, Executor& executor, const ServeOptions& options,
         std::string token, bool allow_missing_token = false);
  ~E2bApi() override;

  void handle(Request req, std::shared_ptr<Exchange> exchange) override;
  ChannelsCheck check_channels(const Request& req) override;

 private:
  struct Context {
    std::string id, language, cwd;
  };

  void execute(Request req, std::shared_ptr<Exchange> exchange);
  void create_context(Request req, std::shared_ptr<Exchange> exchange);
  // Starts a kernel and moves it to `cwd`; blocking.
  Result<Context> start_context(const std::string& language, const std::string& cwd);
  // The default context's kernel id, started when there is none (or it is gone); blocking.
  Result<std::string> default_context();
  bool authorized(const Request& req) const;

  KernelManager& manager_;
  Executor& executor_;
  const ServeOptions& options_;
  const std::string token_;
  const bool allow_missing_token_;
  boost::asio::thread_pool pool_{32};

  std::mutex mu_;
  std::map<std::string, Context> contexts_;  // by kernel id
  std::string default_id_;
  std::mutex default_start_mu_;  // one start of the default context at a time
};

}  // namespace cellgate::server
