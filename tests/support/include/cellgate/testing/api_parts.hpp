// Test support: the parts an Api needs, composed as the server composes them (server.cpp): a
// kernel backend (the real launcher, no zygote: route tests never launch), a registry, an
// artifact store, no audit log, an executor whose cells run on one thread, and an offload pool.
// The registry is not started (no monitor or pool) unless start() is called, so route and
// session tests run without root or Python.
//
//   cellgate::testing::ApiParts parts({.state_dir = dir, .token = "secret"});
//   parts.api.handle(request, [](http::Response res) { … });
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/api/api.hpp"
#include "cellgate/execute/executor.hpp"
#include "cellgate/kernel/backend.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/audit.hpp"
#include "cellgate/util/loop.hpp"

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
        registry(registry_options(options), backend),
        artifacts(options.state_dir + "/artifacts"),
        audit(std::move(store::AuditLog::create({})).value()),
        loop(cells),
        executor(registry, artifacts, *audit, options.limits, loop, offload()),
        api(registry, executor, api_options(options), offload()),
        cell_thread([this] { cells.run(); }) {}
  ~ApiParts() {
    registry.shutdown_all();
    pool.join();
    work.reset();
    cells.stop();
    cell_thread.join();
  }

  util::Offload offload() {
    return [this](std::function<void()> fn) { boost::asio::post(pool, std::move(fn)); };
  }
  static kernels::RegistryOptions registry_options(const ApiPartsOptions& o) {
    kernels::RegistryOptions r;
    r.state_dir = o.state_dir;
    r.kernel_start_timeout = o.kernel_start_timeout;
    return r;
  }
  static api::ApiOptions api_options(const ApiPartsOptions& o) {
    api::ApiOptions a;
    a.token = o.token;
    a.allow_origins = o.allow_origins;
    a.base_url = o.base_url;
    return a;
  }

  ApiPartsOptions options;
  boost::asio::thread_pool pool{4};
  boost::asio::io_context cells;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{
      cells.get_executor()};
  kernel::ProcessBackend backend{{}};
  kernels::KernelRegistry registry;
  store::ArtifactStore artifacts;
  std::unique_ptr<store::AuditLog> audit;
  util::AsioLoop loop;
  execute::Executor executor;
  api::Api api;
  std::thread cell_thread;
};

}  // namespace cellgate::testing
