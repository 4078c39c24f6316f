// GET /metrics: the gateway's figures in Prometheus' text format, mounted on the Api (behind its
// token: 401 without it). Each room counts its own things (RegistryStats, CellStats, HttpStats);
// this renders them with the gauges read at scrape time (kernels by state, the pool, open
// connections, the zygote, the process's own memory, descriptors and threads, and the standard
// process_* families), the build, and requests and kernel starts timed by route and by source.
//
// Thread-safety: handle() may run on any network thread; everything it reads is thread-safe.
#pragma once

#include <functional>
#include <memory>

#include "cellgate/execute/executor.hpp"
#include "cellgate/http/handler.hpp"
#include "cellgate/http/stats.hpp"
#include "cellgate/kernels/registry.hpp"

namespace cellgate::server {

struct MetricsSources {
  const kernels::KernelRegistry* registry = nullptr;
  const execute::Executor* executor = nullptr;
  std::shared_ptr<http::HttpStats> http;
  std::function<std::size_t()> open_connections;  // the listeners'
  std::function<int()> zygote_restarts;           // -1: no zygote
};

// The whole text of one scrape.
std::string render_metrics(const MetricsSources& sources);

class MetricsEndpoint : public http::Handler {
 public:
  explicit MetricsEndpoint(MetricsSources sources) : sources_(std::move(sources)) {}
  void handle(http::Request req, std::shared_ptr<http::Exchange> exchange) override;
  http::Upgrade upgrade(const http::Request& req) override;

 private:
  MetricsSources sources_;
};

}  // namespace cellgate::server
