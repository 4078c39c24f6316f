#include "cellgate/tenants/cpu_budget.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "cellgate/sys/file.hpp"

namespace cellgate::tenants {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxFileBytes = 8u << 20;

std::string utc_text(std::int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

CpuBudget::CpuBudget(CpuBudgetOptions options, CpuBudgetHooks hooks)
    : options_(std::move(options)), hooks_(std::move(hooks)) {
  load();
}

CpuBudget::~CpuBudget() {
  stop();
}

void CpuBudget::start(util::Loop& loop, util::Offload offload, std::chrono::milliseconds interval) {
  if (options_.max_cpu_seconds <= 0) {
    return;
  }
  loop_ = &loop;
  strand_ = loop.strand();
  offload_ = std::move(offload);
  interval_ = interval;
  schedule();
}

void CpuBudget::stop() {
  UniqueLock lock(timer_mu_);
  stopping_ = true;
  if (timer_) {
    timer_->cancel();
    timer_.reset();
  }
  sampled_.wait(lock, [this]() CELLGATE_REQUIRES(timer_mu_) { return !sampling_; });
}

void CpuBudget::schedule() {
  MutexLock lock(timer_mu_);
  if (stopping_ || !strand_) {
    return;
  }
  timer_ = strand_->at(loop_->now() + interval_, [this] {
    {
      MutexLock timer_lock(timer_mu_);
      if (stopping_) {
        return;
      }
      sampling_ = true;  // from here until the sample ends, stop() waits
    }
    offload_([this] {
      sample(std::chrono::system_clock::now());
      schedule();
      // The last touch of `this`: stop() may return, and the budget go, once this lock is free.
      MutexLock timer_lock(timer_mu_);
      sampling_ = false;
      sampled_.notify_all();
    });
  });
}

std::int64_t CpuBudget::window_of(TimePoint now) const {
  const auto secs =
      std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  const auto len = std::max<std::int64_t>(1, options_.window.count());
  return secs / len;
}

void CpuBudget::roll_locked(std::int64_t window) {
  if (window != window_) {
    window_ = window;
    used_usec_.clear();  // each kernel's last reading stays: the new window counts from there
  }
}

void CpuBudget::load() {
  if (options_.file.empty()) {
    return;
  }
  auto text = sys::read_optional(options_.file, kMaxFileBytes, "tenant_cpu_file");
  if (!text || !*text) {
    if (!text) {
      spdlog::warn("tenant CPU budget: {}; counting afresh", text.error().message);
    }
    return;
  }
  const json j = json::parse(**text, nullptr, /*allow_exceptions=*/false);
  MutexLock lock(mu_);
  try {
    if (!j.is_object() || j.value("window_seconds", std::int64_t{0}) != options_.window.count()) {
      throw std::invalid_argument("another window length, or not an object");
    }
    // nlohmann converts between number kinds silently: each count must be unsigned as written.
    auto count = [](const json& v) {
      if (!v.is_number_unsigned()) {
        throw std::invalid_argument("a count that is not a whole number >= 0");
      }
      return v.get<std::uint64_t>();
    };
    if (!j.at("window").is_number_integer()) {
      throw std::invalid_argument("window is not a number");
    }
    window_ = j.at("window").get<std::int64_t>();
    for (const auto& [tenant, usec] : j.at("used_usec").items()) {
      used_usec_[tenant] = count(usec);
    }
    for (const auto& [id, k] : j.at("kernels").items()) {
      kernels_[id] = Seen{k.at("tenant").get<std::string>(), count(k.at("usec"))};
    }
  } catch (const std::exception& e) {
    spdlog::warn("tenant CPU budget: {} is not what this gateway writes ({}); counting afresh",
                 options_.file, e.what());
    window_ = -1;
    used_usec_.clear();
    kernels_.clear();
  }
}

std::string CpuBudget::serialize_locked() const {
  json kernels = json::object();
  for (const auto& [id, seen] : kernels_) {
    kernels[id] = {{"tenant", seen.tenant}, {"usec", seen.usec}};
  }
  json j = {{"window", window_},
            {"window_seconds", options_.window.count()},
            {"used_usec", used_usec_},
            {"kernels", std::move(kernels)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void CpuBudget::sample(TimePoint now) {
  if (options_.max_cpu_seconds <= 0 || !hooks_.owned || !hooks_.cpu_usec) {
    return;
  }
  struct Reading {
    CpuBudgetHooks::Owned owned;
    std::optional<std::uint64_t> usec;
  };
  std::vector<Reading> readings;
  for (auto& owned : hooks_.owned()) {
    auto usec = hooks_.cpu_usec(owned.kernel_id);
    readings.push_back({std::move(owned), usec});
  }
  const auto max_usec = static_cast<std::uint64_t>(std::llround(options_.max_cpu_seconds * 1e6));
  std::vector<std::string> throttle;
  std::vector<std::string> release;
  std::string text;
  {
    MutexLock lock(mu_);
    const std::map<std::string, std::uint64_t> before = used_usec_;
    const std::int64_t window_before = window_;
    roll_locked(window_of(now));
    std::map<std::string, Seen> kept;
    for (const auto& r : readings) {
      const std::string& id = r.owned.kernel_id;
      auto it = kernels_.find(id);
      if (!r.usec) {
        if (it != kernels_.end()) {
          kept[id] = it->second;  // hibernated or unreadable now: its last reading stays
        }
        continue;
      }
      std::uint64_t delta = *r.usec;  // a kernel first seen: all it used since it started
      if (it != kernels_.end() && it->second.tenant == r.owned.tenant) {
        // Lower than the last reading: a new cgroup (a restart or a restore), counted from zero.
        delta = *r.usec >= it->second.usec ? *r.usec - it->second.usec : *r.usec;
      }
      used_usec_[r.owned.tenant] += delta;
      kept[id] = Seen{r.owned.tenant, *r.usec};
    }
    const bool changed = charged_ || window_ != window_before || used_usec_ != before ||
                         kept.size() != kernels_.size();
    charged_ = false;
    kernels_ = std::move(kept);
    // Every pass throttles again (idempotent): a kernel restored or restarted has a new cgroup
    // with its own limit. Only kernels that run (were read): a hibernated one has no cgroup, and
    // comes back with a new one that the next pass holds.
    std::set<std::string> over;
    std::set<std::string> running;
    for (const auto& r : readings) {
      if (!r.usec) {
        continue;
      }
      running.insert(r.owned.kernel_id);
      auto used = used_usec_.find(r.owned.tenant);
      if (used != used_usec_.end() && used->second >= max_usec) {
        over.insert(r.owned.kernel_id);
        throttle.push_back(r.owned.kernel_id);
      }
    }
    std::erase_if(unthrottleable_, [&](const std::string& id) { return over.count(id) == 0; });
    for (auto it = throttled_.begin(); it != throttled_.end();) {
      if (over.count(*it) == 0) {
        if (running.count(*it) != 0) {
          release.push_back(*it);  // one gone or hibernated has no limit of ours to give back
        }
        it = throttled_.erase(it);
      } else {
        ++it;
      }
    }
    if (changed && !options_.file.empty()) {
      text = serialize_locked();
    }
  }
  if (hooks_.throttle) {
    for (const auto& id : throttle) {
      auto done = hooks_.throttle(id, true);
      MutexLock lock(mu_);
      if (done) {
        unthrottleable_.erase(id);
        if (throttled_.insert(id).second) {
          spdlog::warn(
              "kernel {}: its tenant used its {} CPU-seconds of this window; throttled "
              "until the window ends",
              id, options_.max_cpu_seconds);
        }
      } else if (unthrottleable_.insert(id).second) {  // said once, tried every pass
        spdlog::error(
            "kernel {}: its tenant is past its CPU budget, but it cannot be throttled: {}", id,
            done.error().message);
      }
    }
    for (const auto& id : release) {
      if (auto done = hooks_.throttle(id, false); !done) {
        spdlog::warn("kernel {}: its CPU limit could not be given back: {}", id,
                     done.error().message);
      }
    }
  }
  if (!text.empty()) {
    // Not fsync'd: written every few seconds, a crash loses at most the last samples' counts.
    if (auto written =
            sys::atomic_write(options_.file, text, 0600, sys::Durability::kNone, "tenant_cpu_file");
        !written) {
      spdlog::warn("tenant CPU budget: {}", written.error().message);
    }
  }
}

void CpuBudget::charge(const std::string& tenant, std::uint64_t usec, TimePoint now) {
  if (options_.max_cpu_seconds <= 0 || usec == 0) {
    return;
  }
  MutexLock lock(mu_);
  roll_locked(window_of(now));
  used_usec_[tenant] += usec;
  charged_ = true;
}

std::optional<std::string> CpuBudget::refusal(const std::string& tenant, TimePoint now) const {
  if (options_.max_cpu_seconds <= 0) {
    return std::nullopt;
  }
  const std::int64_t window = window_of(now);
  MutexLock lock(mu_);
  if (window != window_) {
    return std::nullopt;  // a new window: nothing used yet
  }
  auto it = used_usec_.find(tenant);
  const auto max_usec = static_cast<std::uint64_t>(std::llround(options_.max_cpu_seconds * 1e6));
  if (it == used_usec_.end() || it->second < max_usec) {
    return std::nullopt;
  }
  const std::int64_t len = std::max<std::int64_t>(1, options_.window.count());
  char used[32];
  std::snprintf(used, sizeof used, "%.1f", static_cast<double>(it->second) / 1e6);
  return "this tenant used " + std::string(used) + " CPU-seconds of its " +
         std::to_string(static_cast<long long>(std::llround(options_.max_cpu_seconds))) +
         " (--tenant-max-cpu-seconds) in this window; its kernels are throttled and nothing more "
         "starts until the next window, at " +
         utc_text((window + 1) * len);
}

double CpuBudget::used_seconds(const std::string& tenant, TimePoint now) const {
  const std::int64_t window = window_of(now);
  MutexLock lock(mu_);
  if (window != window_) {
    return 0;
  }
  auto it = used_usec_.find(tenant);
  return it == used_usec_.end() ? 0 : static_cast<double>(it->second) / 1e6;
}

std::set<std::string> CpuBudget::throttled() const {
  MutexLock lock(mu_);
  return throttled_;
}

}  // namespace cellgate::tenants
