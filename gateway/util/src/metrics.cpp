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

HistogramVec::HistogramVec(std::vector<std::string> label_names, std::vector<double> upper_bounds)
    : names_(std::move(label_names)), bounds_(std::move(upper_bounds)) {}

void HistogramVec::observe(const std::vector<std::string>& label_values, double value) {
  Histogram* h = nullptr;
  {
    MutexLock lock(mu_);
    auto it = series_.find(label_values);
    if (it == series_.end()) {
      if (series_.size() >= kMaxSeries) {
        return;
      }
      it = series_.emplace(label_values, std::make_unique<Histogram>(bounds_)).first;
    }
    h = it->second.get();  // series are never removed: valid after the lock
  }
  h->observe(value);
}

std::vector<std::pair<std::vector<std::string>, Histogram::Snapshot>> HistogramVec::snapshot()
    const {
  std::vector<std::pair<std::vector<std::string>, Histogram::Snapshot>> out;
  MutexLock lock(mu_);
  for (const auto& [labels, h] : series_) {
    out.emplace_back(labels, h->snapshot());
  }
  return out;
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

void PrometheusText::family(const std::string& name, const std::string& help,
                            const std::string& type) {
  header(name, help, type);
}

void PrometheusText::sample(const std::string& name, const Labels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (std::size_t i = 0; i < labels.size(); ++i) {
      text_ += (i == 0 ? "" : ",") + labels[i].first + "=\"" + escape(labels[i].second) + '"';
    }
    text_ += '}';
  }
  text_ += " " + number(value) + "\n";
}

void PrometheusText::buckets(const std::string& name, const Labels& labels,
                             const Histogram::Snapshot& s) {
  Labels with_le = labels;
  with_le.emplace_back("le", "");
  for (std::size_t i = 0; i <= s.bounds.size(); ++i) {
    with_le.back().second = i < s.bounds.size() ? number(s.bounds[i]) : "+Inf";
    sample(name + "_bucket", with_le, static_cast<double>(s.cumulative[i]));
  }
  sample(name + "_sum", labels, s.sum);
  sample(name + "_count", labels, static_cast<double>(s.count));
}

void PrometheusText::histogram(const std::string& name, const std::string& help,
                               const Histogram& h) {
  header(name, help, "histogram");
  buckets(name, {}, h.snapshot());
}

void PrometheusText::histograms(const std::string& name, const std::string& help,
                                const HistogramVec& h) {
  header(name, help, "histogram");
  for (const auto& [values, snapshot] : h.snapshot()) {
    Labels labels;
    for (std::size_t i = 0; i < values.size() && i < h.label_names().size(); ++i) {
      labels.emplace_back(h.label_names()[i], values[i]);
    }
    buckets(name, labels, snapshot);
  }
}

}  // namespace cellgate::util
