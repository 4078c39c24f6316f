// E2B-compatible endpoints, so agents written for E2B's code interpreter run unchanged against
// cellgate (docs/e2b.md has the protocol, read from the SDK's source):
//
//   POST   /execute                 {code, context_id?, language?, env_vars?} → NDJSON lines
//   POST   /contexts                {language?, cwd?} → {id, language, cwd}
//   GET    /contexts                → [{id, language, cwd}, ...] in creation order
//   POST   /contexts/{id}/restart   → 204 (variables gone, cwd kept)
//   DELETE /contexts/{id}           → 204
//   GET    /health                  → 200 (no token needed)
//
// A context is a jailed kernel of the kernelspec for its language: python → the default
// kernelspec (when it is a python one), any other language → the first kernelspec whose
// "language" is it (r → Debian's `ir`). No such kernelspec: 400, text/plain. /execute without a
// context uses the default context of its language, started on first use. A context starts in
// its cwd (default /home/user), made if missing (context_setup_code). Auth: the gateway token
// in X-Access-Token or Authorization ("token t" / "Bearer t"). Served on a second listener
// (`--e2b-port`), as E2B's SDK in debug mode talks to http://localhost:49999. Cells run through
// the same Executor path as the agent API's streamed answers, with E2B's line format (e2b.hpp).
//
// Thread-safety: handle() may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "cellgate/execute/executor.hpp"
#include "cellgate/http/handler.hpp"
#include "cellgate/http/router.hpp"
#include "cellgate/http/stats.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::api {

struct E2bOptions {
  std::string token;                 // "" : every request is allowed
  bool allow_missing_token = false;  // a request without any token is allowed (E2B's debug SDK)
  double execute_max_timeout = 600;
  double execute_keepalive = 3;
  std::shared_ptr<http::HttpStats> stats;  // requests timed for /metrics; null: not timed
  // envd (gateway/envd): requests with `E2b-Sandbox-Port: 49983` (the SDK's envd calls with
  // E2B_SANDBOX_URL) go there. Null: none. Not owned.
  http::Handler* envd = nullptr;
};

class E2bApi : public http::Handler {
 public:
  E2bApi(kernels::KernelRegistry& registry, execute::Executor& executor, E2bOptions options,
         util::Offload offload);
  ~E2bApi() override;

  void handle(http::Request req, std::shared_ptr<http::Exchange> exchange) override;
  http::Upgrade upgrade(const http::Request& req) override;

 private:
  struct Context {
    std::string id, language, cwd;
    std::uint64_t created = 0;  // the order GET /contexts lists them in
  };

  void add_routes();
  void execute(http::Call& call);
  // The kernelspec that runs `language` (normalized, as the requests give it).
  Result<std::string> kernelspec_for(const std::string& language) const;
  // Starts a kernel and moves it to `cwd`; blocking.
  Result<Context> start_context(const std::string& language, const std::string& cwd);
  // Makes `ctx.cwd` and changes to it, after a start or a restart; blocking.
  Result<void> set_up(const Context& ctx);
  // The default context of `language`: its kernel id, started when there is none (or it is
  // gone); blocking.
  Result<std::string> default_context(const std::string& language);
  bool authorized(const http::Request& req) const;

  kernels::KernelRegistry& registry_;
  execute::Executor& executor_;
  const E2bOptions options_;
  util::Offload offload_;
  http::Router router_;

  Mutex mu_;
  std::map<std::string, Context> contexts_ CELLGATE_GUARDED_BY(mu_);  // by kernel id
  // language → kernel id
  std::map<std::string, std::string> default_ids_ CELLGATE_GUARDED_BY(mu_);
  std::uint64_t created_ CELLGATE_GUARDED_BY(mu_) = 0;
  Mutex default_start_mu_;  // one start of a default context at a time
};

}  // namespace cellgate::api
