// Rate-limits repeated log lines, per key (a call site, or a call site and a peer), so a client
// that sends 50 000 bad frames cannot grow the log by megabytes: up to `burst` lines per key in
// each window, then silence, then one line that says how many were held back.
//
//   if (auto suffix = limiter.admit("bad_frame")) {
//     spdlog::warn("dropped a bad frame: {}{}", why, *suffix);  // "… (1234 more like this in
//   }                                                             //  the last 10 s)"
//
// Thread-safety: admit() may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "cellgate/mutex.hpp"

namespace cellgate::http {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogLimiter(std::size_t burst = 5, std::chrono::seconds window = std::chrono::seconds(10))
      : burst_(burst), window_(window) {}

  // nullopt: do not log this one (it is counted). Otherwise the text to append to the line: ""
  // or " (N more like this in the last 10 s)" for the lines held back in the window before.
  std::optional<std::string> admit(std::string_view key, Clock::time_point now = Clock::now());

 private:
  struct Entry {
    Clock::time_point window_start;
    std::size_t logged = 0;
    std::size_t suppressed = 0;
  };
  std::size_t burst_;
  std::chrono::seconds window_;
  Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace cellgate::http
