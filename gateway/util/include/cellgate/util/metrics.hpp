// Counters a room keeps about itself, and the Prometheus text format they are scraped in
// (GET /metrics). Each room owns its figures (the registry its starts, the executor its cells,
// the listener its connections); the composition root renders them, so no room knows another.
//
//   util::Counter starts;                 starts.add();
//   util::LabeledCounter cells;           cells.add("ok");
//   util::Histogram latency({0.01, 0.1, 1, 10});   latency.observe(0.042);
//   util::HistogramVec requests({"method", "route"}, {0.01, 0.1, 1});
//   requests.observe({"GET", "/api/kernels/{id}"}, 0.003);
//   util::PrometheusText out;
//   out.counter("cellgate_kernel_starts_total", "Kernels started.", starts.value());
//   out.labeled("cellgate_cells_total", "Cells by status.", "status", cells.snapshot());
//   out.histogram("cellgate_cell_duration_seconds", "Cell wall time.", latency);
//   out.histograms("cellgate_http_request_duration_seconds", "Requests.", requests);
//   out.family("cellgate_build_info", "The build.", "gauge");
//   out.sample("cellgate_build_info", {{"version", "0.1.0"}}, 1);
//   std::string body = out.text();        // text/plain; version=0.0.4
//
// The exposition is written by hand rather than with prometheus-cpp (bookworm's
// libprometheus-cpp-dev 1.0.1). The figures, 2026-11: ours is this header and metrics.cpp, 302
// lines; promtool accepts what it writes and Debian's Prometheus 2.42 scrapes it
// (tests/conformance/test_prometheus.py). The library is 153 KiB of core plus, to serve
// /metrics itself, 69 KiB of pull and 240 KiB of civetweb, an HTTP server beside ours; using
// only the core would still mean its Registry/Family/Counter types beside our atomics for the
// same ~30 families and a serializer we would call from our own route: a second set of types
// and a shared library to ship, for no format we lack.
//
// Thread-safety: Counter, LabeledCounter, Histogram and HistogramVec may be updated from any
// thread at once; PrometheusText is one scrape's, single-threaded.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cellgate/mutex.hpp"

namespace cellgate::util {

class Counter {
 public:
  void add(std::uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

// A counter per label value ("ok", "error", …); label values come from the code, never from a
// client, so the set stays small.
class LabeledCounter {
 public:
  void add(const std::string& label, std::uint64_t n = 1);
  std::map<std::string, std::uint64_t> snapshot() const;

 private:
  mutable Mutex mu_;
  std::map<std::string, std::uint64_t> values_ CELLGATE_GUARDED_BY(mu_);
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<std::uint64_t> cumulative;  // per bound, then +Inf last
    double sum = 0;
    std::uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable Mutex mu_;
  std::vector<std::uint64_t> buckets_
      CELLGATE_GUARDED_BY(mu_);  // per bound, then +Inf (not cumulative)
  double sum_ CELLGATE_GUARDED_BY(mu_) = 0;
};

// Histograms by a tuple of label values (method, route, code; kernelspec, source). The values
// come from bounded sets (route patterns, not paths); past kMaxSeries tuples a new one is not
// recorded, so a bug that leaks an unbounded value cannot grow the scrape without end.
class HistogramVec {
 public:
  static constexpr std::size_t kMaxSeries = 1000;
  HistogramVec(std::vector<std::string> label_names, std::vector<double> upper_bounds);
  void observe(const std::vector<std::string>& label_values, double value);

  const std::vector<std::string>& label_names() const { return names_; }
  // Every tuple observed so far, in order, with its histogram's snapshot.
  std::vector<std::pair<std::vector<std::string>, Histogram::Snapshot>> snapshot() const;

 private:
  const std::vector<std::string> names_;
  const std::vector<double> bounds_;
  mutable Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Histogram>> series_ CELLGATE_GUARDED_BY(mu_);
};

// A sample's labels, name="value" in this order.
using Labels = std::vector<std::pair<std::string, std::string>>;

class PrometheusText {
 public:
  void counter(const std::string& name, const std::string& help, std::uint64_t value);
  void gauge(const std::string& name, const std::string& help, double value);
  // One family, one sample per label value.
  void labeled(const std::string& name, const std::string& help, const std::string& type,
               const std::string& label, const std::map<std::string, std::uint64_t>& values);
  void histogram(const std::string& name, const std::string& help, const Histogram& h);
  void histograms(const std::string& name, const std::string& help, const HistogramVec& h);
  // A family's # HELP and # TYPE, then its samples one by one.
  void family(const std::string& name, const std::string& help, const std::string& type);
  void sample(const std::string& name, const Labels& labels, double value);
  const std::string& text() const { return text_; }

 private:
  void header(const std::string& name, const std::string& help, const std::string& type);
  void buckets(const std::string& name, const Labels& labels, const Histogram::Snapshot& s);
  std::string text_;
};

}  // namespace cellgate::util
