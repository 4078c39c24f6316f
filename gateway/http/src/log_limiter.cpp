#include "cellgate/http/log_limiter.hpp"

namespace cellgate::http {

// Keys past this are forgotten all at once: a bound on memory when keys carry peers.
static constexpr std::size_t kMaxKeys = 4096;

std::optional<std::string> LogLimiter::admit(std::string_view key, Clock::time_point now) {
  MutexLock lock(mu_);
  auto it = entries_.find(std::string(key));
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxKeys) {
      entries_.clear();
    }
    entries_.emplace(std::string(key), Entry{now, 1, 0});
    return std::string();
  }
  Entry& e = it->second;
  if (now - e.window_start >= window_) {
    std::string suffix;
    if (e.suppressed > 0) {
      suffix = " (" + std::to_string(e.suppressed) + " more like this in the last " +
               std::to_string(
                   std::chrono::duration_cast<std::chrono::seconds>(now - e.window_start).count()) +
               " s)";
    }
    e = Entry{now, 1, 0};
    return suffix;
  }
  if (e.logged < burst_) {
    ++e.logged;
    return std::string();
  }
  ++e.suppressed;
  return std::nullopt;
}

}  // namespace cellgate::http
