// E2bFront: everything on the E2B port (`serve --e2b-port`), so E2B's SDK works with
// E2B_API_URL and E2B_SANDBOX_URL both pointing at it (docs/e2b.md):
//
//   request                                           goes to
//   E2b-Sandbox-Id: debug_sandbox_id (debug mode)     the code interpreter as before (E2bApi)
//   E2b-Sandbox-Id: <id>, E2b-Sandbox-Port: 49999     that sandbox's code interpreter: an E2bApi
//                                                     whose default python context is its kernel
//   E2b-Sandbox-Id: <id>, GET /health                 204 running, 502 paused, killed or unknown
//   E2b-Sandbox-Id: <id>, other paths                 envd (set_envd; none: 501 JSON); an id that
//                                                     is no sandbox's: set_fallback's (a kernel)
//   /files, /process.Process/*, /filesystem.*         envd too (signed file URLs carry no header)
//   the control plane's routes (control_plane.cpp)    with X-API-KEY: a tenant's key, or the
//                                                     gateway's token (the operator: sees all)
//   anything else                                     the code interpreter as before (E2bApi)
//
// Control-plane errors are E2B's JSON {"code": <status>, "message"} (the SDK reads the code from
// the body), with cellgate's "error" and "reason". A sandbox's code interpreter takes its
// X-Access-Token (envdAccessToken) or E2B-Traffic-Access-Token (trafficAccessToken: the only one
// the SDK sends on its context calls), or the gateway's token; a sandbox created without
// `secure` takes any request. envd's handler checks envd's own auth (SandboxTarget::access_token).
//
// Thread-safety: handle() may be called from any network thread; set_envd() before serving.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/api/e2b_api.hpp"
#include "cellgate/http/handler.hpp"
#include "cellgate/http/router.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/sandboxes/registry.hpp"
#include "cellgate/tenants/keys.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::sandboxes {

struct FrontOptions {
  std::string token;  // the operator's (serve --token); "": requests without a key are the operator
  api::E2bOptions e2b;  // each sandbox's code interpreter is configured as this (token aside)
  // How long an ended sandbox's code interpreter is kept for requests still in flight.
  std::chrono::seconds retire_after{900};
};

class E2bFront : public http::Handler {
 public:
  // `keys` may be null (no tenant keys); `legacy` serves what is not a sandbox's.
  E2bFront(SandboxRegistry& sandboxes, tenants::KeyStore* keys, api::E2bApi& legacy,
           kernels::KernelRegistry& kernels, execute::Executor& executor, FrontOptions options,
           util::Offload offload);
  ~E2bFront() override;

  // envd's handler (commands, PTYs, files); null: those paths answer 501.
  void set_envd(http::Handler* envd) { envd_ = envd; }
  // Who an E2b-Sandbox-Id names when it is no sandbox of the control plane (the composition root
  // gives running kernels by id, with the operator's token as their access token: envd in a
  // Jupyter kernel's jail). Unset: nobody.
  void set_fallback(std::function<std::optional<SandboxTarget>(std::string_view)> fallback) {
    fallback_ = std::move(fallback);
  }

  void handle(http::Request req, std::shared_ptr<http::Exchange> exchange) override;
  http::Upgrade upgrade(const http::Request& req) override;

  // The caller a request's credentials name (X-API-KEY, else Authorization: Bearer/token):
  // nullopt for none that is valid.
  std::optional<Caller> caller_of(const http::Request& req) const;

 private:
  void add_routes();  // control_plane.cpp
  void code_interpreter(const SandboxTarget& target, http::Request req,
                        std::shared_ptr<http::Exchange> exchange);
  // The code interpreter of a sandbox, made on first use.
  api::E2bApi& interpreter_of(const SandboxTarget& target);
  // A sandbox ended: its contexts' kernels end, its interpreter retires.
  void ended(const std::string& sandbox_id);

  SandboxRegistry& sandboxes_;
  tenants::KeyStore* keys_;
  api::E2bApi& legacy_;
  kernels::KernelRegistry& kernels_;
  execute::Executor& executor_;
  const FrontOptions options_;
  util::Offload offload_;
  http::Handler* envd_ = nullptr;
  std::function<std::optional<SandboxTarget>(std::string_view)> fallback_;
  http::Router router_;

  Mutex mu_;
  std::map<std::string, std::unique_ptr<api::E2bApi>> interpreters_ CELLGATE_GUARDED_BY(mu_);
  // Ended sandboxes' interpreters: requests in flight may still hold them.
  struct Retired {
    std::chrono::steady_clock::time_point at;
    std::unique_ptr<api::E2bApi> api;
  };
  std::vector<Retired> retired_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace cellgate::sandboxes
