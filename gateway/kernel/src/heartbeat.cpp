#include "heartbeat.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace cellgate::kernel {

Heartbeat::Tick Heartbeat::tick(Clock::time_point now, bool excused,
                                const std::function<bool()>& ping,
                                const std::function<Clock::time_point()>& clock) {
  const auto interval = options_.heartbeat_interval;
  if (outstanding_ && now - sent_at_ >= interval) {
    outstanding_ = false;
    if (ever_answered_ && !excused) {
      if (auto dead = count_miss()) {
        return {std::chrono::milliseconds(-1), std::move(dead)};
      }
    }
    now = clock();  // the probe read files
    next_at_ = now;
  }
  if (!outstanding_ && now >= next_at_) {
    if (ping()) {
      outstanding_ = true;
      soon_ = false;
      sent_at_ = now;
    } else {
      next_at_ = now + interval;
    }
  }
  const auto due = outstanding_ ? sent_at_ + interval : next_at_;
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(due - now);
  return {std::max(wait, std::chrono::milliseconds(1)), std::nullopt};
}

std::optional<Heartbeat::Clock::time_point> Heartbeat::on_pong() {
  if (!outstanding_) {
    return std::nullopt;
  }
  outstanding_ = false;
  ever_answered_ = true;
  if (busy_logged_) {
    spdlog::info("kernel {}: answers heartbeats again after {} missed", name_, misses_);
  }
  misses_ = 0;
  quiet_misses_ = 0;
  busy_logged_ = false;
  next_at_ = soon_ ? Clock::time_point{} : sent_at_ + options_.heartbeat_interval;
  return sent_at_;
}

std::optional<std::string> Heartbeat::count_miss() {
  ++misses_;
  Progress progress{Progress::State::kStalled, ""};
  if (options_.progress) {
    progress = options_.progress();
  }
  if (progress.state == Progress::State::kRunning) {
    quiet_misses_ = 0;
    // Said once a silence is as long as one that would have been a death without the probe.
    if (!busy_logged_ && misses_ >= options_.heartbeat_misses) {
      busy_logged_ = true;
      spdlog::info("kernel {}: no answer to {} heartbeats in a row, but {}: busy, not dead", name_,
                   misses_, progress.why);
    }
    return std::nullopt;
  }
  if (++quiet_misses_ < options_.heartbeat_misses) {
    return std::nullopt;
  }
  const auto interval = options_.heartbeat_interval.count();
  std::string reason = "no answer to " + std::to_string(misses_) + " heartbeats in a row (" +
                       std::to_string(misses_ * interval) + " ms)";
  if (options_.progress) {
    reason +=
        ", and for the last " + std::to_string(quiet_misses_ * interval) + " ms " + progress.why;
  }
  return reason;
}

}  // namespace cellgate::kernel
