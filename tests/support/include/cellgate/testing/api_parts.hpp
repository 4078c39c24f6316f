// Test support: an Api over an engine (engine/engine.hpp), built as `cellgate serve` builds one:
// the real launcher as its backend (no zygote: route tests never launch), no audit log, cells on
// one thread, a small offload pool. The registry is not started (no monitor or pool) unless
// start() is called on it, so route and session tests run without root or Python.
//
//   cellgate::testing::ApiParts parts({.state_dir = dir, .token = "secret"});
//   parts.api.handle(request, [](http::Response res) { … });
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cellgate/api/api.hpp"
#include "cellgate/engine/engine.hpp"

namespace cellgate::testing {

struct ApiPartsOptions {
  std::string state_dir;
  std::string token;
  std::vector<std::string> allow_origins;
  std::string base_url = "/";
  execute::ExecuteLimits limits = {};
  double kernel_start_timeout = 60;
};

struct ApiParts {
  explicit ApiParts(ApiPartsOptions o)
      : options(std::move(o)),
        engine(std::move(engine::Engine::create(engine_options(options))).value()),
        registry(engine->registry()),
        api(registry, engine->executor(), api_options(options), engine->offload()) {
    engine->start_threads();
  }
  // Kernels end and the threads stop (engine.hpp's teardown), then the Api goes, then the parts.
  ~ApiParts() { engine->stop(); }

  static engine::EngineOptions engine_options(const ApiPartsOptions& o) {
    engine::EngineOptions e;
    e.registry.state_dir = o.state_dir;
    e.registry.kernel_start_timeout = o.kernel_start_timeout;
    e.limits = o.limits;
    e.cell_threads = 1;
    e.offload_threads = 4;
    return e;
  }
  static api::ApiOptions api_options(const ApiPartsOptions& o) {
    api::ApiOptions a;
    a.token = o.token;
    a.allow_origins = o.allow_origins;
    a.base_url = o.base_url;
    return a;
  }

  ApiPartsOptions options;
  std::unique_ptr<engine::Engine> engine;
  kernels::KernelRegistry& registry;
  api::Api api;
};

}  // namespace cellgate::testing
