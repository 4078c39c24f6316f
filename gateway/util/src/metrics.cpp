#include "cellgate/util/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cellgate::util {
namespace {

// Prometheus' text format: a number as Go's strconv would print it, enough for our figures.
std::string number(double v) {
  if (std::isinf(v)) {
    return v > 0 ? "+Inf" : "-Inf";
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

// A label value with \, " and newlines escaped.
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void LabeledCounter::add(const std::string& label, std::uint64_t n) {
  MutexLock lock(mu_);
  values_[label] += n;
}

std::map<std::string, std::uint64_t> LabeledCounter::snapshot() const {
  MutexLock lock(mu_);
  return values_;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                          bounds_.begin());
  MutexLock lock(mu_);
  ++buckets_[i];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  MutexLock lock(mu_);
  std::uint64_t running = 0;
  for (auto n : buckets_) {
    running += n;
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = running;
  return s;
}

void PrometheusText::header(const std::string& name, const std::string& help,
                            const std::string& type) {
  text_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void PrometheusText::counter(const std::string& name, const std::string& help,
                             std::uint64_t value) {
  header(name, help, "counter");
  text_ += name + " " + std::to_string(value) + "\n";
}

void PrometheusText::gauge(const std::string& name, const std::string& help, double value) {
  header(name, help, "gauge");
  text_ += name + " " + number(value) + "\n";
}

void PrometheusText::labeled(const std::string& name, const std::string& help,
                             const std::string& type, const std::string& label,
                             const std::map<std::string, std::uint64_t>& values) {
  header(name, help, type);
  for (const auto& [value_label, value] : values) {
    text_ +=
        name + "{" + label + "=\"" + escape(value_label) + "\"} " + std::to_string(value) + "\n";
  }
}

void PrometheusText::histogram(const std::string& name, const std::string& help,
                               const Histogram& h) {
  header(name, help, "histogram");
  const auto s = h.snapshot();
  for (std::size_t i = 0; i < s.bounds.size(); ++i) {
    text_ += name + "_bucket{le=\"" + number(s.bounds[i]) + "\"} " +
             std::to_string(s.cumulative[i]) + "\n";
  }
  text_ += name + "_bucket{le=\"+Inf\"} " + std::to_string(s.count) + "\n";
  text_ += name + "_sum " + number(s.sum) + "\n";
  text_ += name + "_count " + std::to_string(s.count) + "\n";
}

}  // namespace cellgate::util
