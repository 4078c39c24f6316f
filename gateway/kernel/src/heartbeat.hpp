// The heartbeat's verdict
// (https://jupyter-client.readthedocs.io/en/stable/messaging.html#heartbeat-for-kernels): a ping
// every interval, and a kernel dead after `misses` unanswered pings in a row that count. Pure logic
// on the time it is given; the router sends the pings through its transport.
//
//   Heartbeat hb(options, "kernel-1");
//   auto tick = hb.tick(now, /*excused=*/false, [&] { return transport.ping(); }, clock);
//   if (tick.dead) { declare_dead(*tick.dead); }   // else wait at most tick.wait
//   hb.on_pong();                                  // an echo came back
//
// Thread-safety: none; one thread (the client's I/O thread) uses it.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "cellgate/kernel/kernel.hpp"

namespace cellgate::kernel {

class Heartbeat {
 public:
  using Clock = std::chrono::steady_clock;

  // Reads heartbeat_interval, heartbeat_misses and progress from `options`, which must outlive it.
  Heartbeat(const ClientOptions& options, std::string name)
      : options_(options), name_(std::move(name)) {}

  struct Tick {
    std::chrono::milliseconds wait{-1};  // until the next thing due (at least 1 ms)
    std::optional<std::string> dead;     // why the kernel is dead, once
  };
  // Sends a ping when one is due (`ping`, false when it could not be sent) and counts an
  // unanswered one as a miss unless `excused` (a kernel that answers only while idle is busy).
  // `clock` is asked again after the progress probe, which reads files.
  Tick tick(Clock::time_point now, bool excused, const std::function<bool()>& ping,
            const std::function<Clock::time_point()>& clock);
  // An echo of the outstanding ping: the kernel lives. Returns when that ping was sent; nullopt
  // (and nothing changes) when no ping is outstanding.
  std::optional<Clock::time_point> on_pong();
  // The next ping goes out at the next tick (after the outstanding one's echo or miss, if any):
  // the router wants fresh proof that the kernel lives.
  void ping_soon() {
    soon_ = true;
    if (!outstanding_) {
      next_at_ = Clock::time_point{};
    }
  }
  // The kernel's iopub status went from busy to idle: pings lost while it ran a cell are not held
  // against a kernel that answers only between requests.
  void forgive() { misses_ = 0; }

 private:
  // One more unanswered ping; the reason when it made the kernel dead.
  std::optional<std::string> count_miss();

  const ClientOptions& options_;
  const std::string name_;
  bool outstanding_ = false;
  bool ever_answered_ = false;
  int misses_ = 0;            // unanswered pings in a row
  int quiet_misses_ = 0;      // of those, the ones in a row the progress probe saw no progress in
  bool busy_logged_ = false;  // this silence was logged as busy, not dead
  bool soon_ = false;         // ping_soon(): the next ping is due as soon as none is outstanding
  Clock::time_point sent_at_{};
  Clock::time_point next_at_{};
};

}  // namespace cellgate::kernel
