#include "metrics.hpp"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "cellgate/http/message.hpp"
#include "cellgate/sys/dir_stream.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/proc.hpp"
#include "cellgate/util/descriptors.hpp"
#include "cellgate/util/metrics.hpp"

namespace cellgate::server {
namespace {

using http::Status;

// Entries of a /proc directory (the threads), or 0.
std::size_t count_entries(const char* dir) {
  return sys::list_dir(dir).size();
}

// VmRSS from /proc/self/status ("123 kB"), in bytes (0 when unreadable).
double resident_bytes() {
  const auto rss = sys::read_status_field("self", "VmRSS");
  return rss ? std::strtod(rss->c_str(), nullptr) * 1024 : 0;
}

double seconds_of(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// The process_* families every Prometheus client library exports (client_golang's process
// collector), from one bounded read of /proc/self/stat: CPU seconds, start time, memory,
// descriptors and their limit.
void process_metrics(util::PrometheusText& out) {
  const auto text = sys::read_file("/proc/self/stat", 4096, "proc_stat");
  const auto stat = text ? sys::parse_proc_stat(*text) : Result<sys::ProcStat>(text.error());
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  auto field = [&](int n) {
    return text ? std::strtod(sys::proc_stat_field(*text, n).c_str(), nullptr) : 0.0;
  };
  if (stat && ticks > 0) {
    out.family("process_cpu_seconds_total", "User and system CPU time spent in seconds.",
               "counter");
    out.sample("process_cpu_seconds_total", {},
               static_cast<double>(stat->utime + stat->stime) / ticks);
    // Field 22 is ticks since boot (CLOCK_BOOTTIME's origin): the wall time now, less the time
    // since then.
    const double since_boot = field(22) / ticks;
    out.gauge("process_start_time_seconds",
              "Start time of the process since unix epoch in seconds.",
              seconds_of(CLOCK_REALTIME) - (seconds_of(CLOCK_BOOTTIME) - since_boot));
  }
  if (text) {
    out.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", field(23));
    out.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", field(24) * page);
  }
  out.gauge("process_open_fds", "Number of open file descriptors.",
            static_cast<double>(descriptors_open()));
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    out.gauge("process_max_fds", "Maximum number of open file descriptors.",
              static_cast<double>(nofile.rlim_cur));
  }
}

}  // namespace

std::string render_metrics(const MetricsSources& s) {
  util::PrometheusText out;
  out.family("cellgate_build_info", "The gateway's version; always 1.", "gauge");
  out.sample("cellgate_build_info", {{"version", CELLGATE_VERSION}}, 1);
  if (s.registry != nullptr) {
    std::map<std::string, std::uint64_t> by_state = {
        {"starting", 0}, {"idle", 0}, {"busy", 0}, {"restarting", 0}, {"dead", 0}};
    for (const auto& model : s.registry->list()) {
      ++by_state[model.execution_state];
    }
    out.labeled("cellgate_kernels", "Client kernels by execution state.", "gauge", "state",
                by_state);
    // jupyter_server's kernel_currently_running_total{type}, by kernelspec; dead ones left out.
    std::map<std::string, std::uint64_t> running;
    for (const auto& model : s.registry->list()) {
      if (model.execution_state != "dead") {
        ++running[model.name];
      }
    }
    out.labeled("cellgate_kernels_running", "Client kernels running, by kernelspec.", "gauge",
                "kernelspec", running);
    out.gauge("cellgate_pool_ready", "Pooled kernels ready to be claimed.",
              static_cast<double>(s.registry->pool_ready_total()));
    const auto& r = s.registry->stats();
    out.counter("cellgate_kernel_starts_total", "Client kernels started (pool claims included).",
                r.starts.value());
    out.counter("cellgate_kernel_pool_claims_total", "Client kernels taken from the warm pool.",
                r.pool_claims.value());
    out.counter("cellgate_kernel_start_failures_total", "Client kernel starts that failed.",
                r.start_failures.value());
    out.counter("cellgate_kernel_restarts_total", "Automatic restarts after a kernel died.",
                r.restarts.value());
    auto deaths = r.deaths.snapshot();
    out.counter("cellgate_kernel_oom_kills_total", "Kernels killed by their memory limit.",
                deaths.count("oom") ? deaths["oom"] : 0);
    out.labeled("cellgate_kernel_deaths_total", "Kernel deaths by reason.", "counter", "reason",
                deaths);
    out.counter("cellgate_kernels_adopted_total",
                "Kernels of a previous gateway on the state dir adopted at start.",
                r.adopted.value());
    out.counter("cellgate_kernels_cleaned_up_total",
                "Kernels and starts a previous gateway left that were ended and removed.",
                r.cleaned_up.value());
    out.histograms("cellgate_kernel_start_duration_seconds",
                   "Client kernel starts' wall time, by kernelspec and source (pool, zygote, "
                   "cold).",
                   r.start_seconds);
  }
  if (s.zygote_restarts) {
    if (const int n = s.zygote_restarts(); n >= 0) {
      out.counter("cellgate_zygote_restarts_total", "Zygotes started after the first.",
                  static_cast<std::uint64_t>(n));
    }
  }
  if (s.executor != nullptr) {
    const auto& c = s.executor->stats();
    out.labeled("cellgate_cells_total", "Agent API cells by status.", "counter", "status",
                c.by_status.snapshot());
    out.histogram("cellgate_cell_duration_seconds", "Agent API cells' wall time.",
                  c.duration_seconds);
    out.counter("cellgate_cell_dropped_output_bytes_total",
                "Output bytes cut by the cells' stream and output caps.",
                c.dropped_output_bytes.value());
  }
  if (s.open_connections) {
    out.gauge("cellgate_connections_open", "Open client connections.",
              static_cast<double>(s.open_connections()));
  }
  if (s.http) {
    out.counter("cellgate_connections_accepted_total", "Client connections accepted.",
                s.http->accepted.value());
    out.labeled("cellgate_rejected_total", "Connections and requests turned away, by reason.",
                "counter", "reason", s.http->rejected.snapshot());
    out.labeled("cellgate_websocket_dropped_total",
                "WebSocket connections the gateway closed, by reason.", "counter", "reason",
                s.http->ws_dropped.snapshot());
    out.histograms("cellgate_http_request_duration_seconds",
                   "HTTP requests' wall time to their whole answer, by method, route pattern "
                   "and status code.",
                   s.http->requests);
  }
  out.gauge("cellgate_process_resident_memory_bytes", "The gateway's resident memory.",
            resident_bytes());
  out.gauge("cellgate_process_open_fds", "The gateway's open descriptors.",
            static_cast<double>(descriptors_open()));
  out.gauge("cellgate_process_threads", "The gateway's threads.",
            static_cast<double>(count_entries("/proc/self/task")));
  process_metrics(out);
  return out.text();
}

void MetricsEndpoint::handle(http::Request req, std::shared_ptr<http::Exchange> exchange) {
  if (req.method() != http::Verb::get) {
    exchange->reply(http::method_not_allowed(req));
    return;
  }
  auto res = http::text_response(req, Status::ok, render_metrics(sources_));
  res.set(boost::beast::http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
  exchange->reply(std::move(res));
}

http::Upgrade MetricsEndpoint::upgrade(const http::Request& req) {
  http::Upgrade up;
  up.refusal = http::text_response(req, Status::method_not_allowed, "no WebSocket here\n");
  return up;
}

}  // namespace cellgate::server
