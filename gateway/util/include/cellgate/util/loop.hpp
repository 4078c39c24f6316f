// Event loops behind a small interface, so code that computes deadlines and sets timers (agent
// cells, the culler) is tested with a clock the test moves (ManualLoop) instead of real time.
//
//   util::AsioLoop loop(ioc);                       // the composition root's
//   auto strand = loop.strand();                    // functions posted to it never overlap
//   strand->post([&] { … });
//   auto timer = strand->at(loop.now() + 30s, [&] { interrupt(); });
//   timer->cancel();                                // the function will not run
//
//   util::ManualLoop loop;                          // tests
//   loop.advance(30s);                              // runs what is due, in time order
//
// Offload is where blocking work goes (kernel starts and restarts, file I/O): a thread pool in
// the gateway, the calling thread or a queue in tests.
//
// Thread-safety: post() and at() may be called from any thread; cancel() too (a function already
// running is not stopped). ManualLoop runs functions only inside advance()/run_ready(), on the
// calling thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cellgate/mutex.hpp"

namespace boost::asio {
class io_context;
}

namespace cellgate::util {

using Clock = std::chrono::steady_clock;

class Timer {
 public:
  virtual ~Timer() = default;
  virtual void cancel() = 0;
};

class Strand {
 public:
  virtual ~Strand() = default;
  virtual void post(std::function<void()> fn) = 0;
  // Runs `fn` on this strand at `when` (at once if it has passed), unless cancelled first.
  virtual std::shared_ptr<Timer> at(Clock::time_point when, std::function<void()> fn) = 0;
};

class Loop {
 public:
  virtual ~Loop() = default;
  virtual Clock::time_point now() const = 0;
  virtual std::shared_ptr<Strand> strand() = 0;
};

using Offload = std::function<void(std::function<void()>)>;

// Strands of a running io_context; timers are asio steady_timers.
class AsioLoop : public Loop {
 public:
  explicit AsioLoop(boost::asio::io_context& ioc) : ioc_(ioc) {}
  Clock::time_point now() const override { return Clock::now(); }
  std::shared_ptr<Strand> strand() override;

 private:
  boost::asio::io_context& ioc_;
};

// Time stands still until the test moves it; everything runs on the thread that calls advance()
// or run_ready(). Strands are all one queue (so they never overlap).
class ManualLoop : public Loop {
 public:
  Clock::time_point now() const override;
  std::shared_ptr<Strand> strand() override;
  // Runs what is posted and due now, including what that posts, until nothing is left.
  void run_ready();
  // Moves time forward by `d`, running due timers in time order (and what they post) on the way.
  void advance(Clock::duration d);
  // Timers set and not yet run or cancelled.
  std::size_t pending_timers() const;

 private:
  struct Task {
    Clock::time_point when;
    std::uint64_t seq;
    std::function<void()> fn;
    std::shared_ptr<bool> cancelled;
  };
  class ManualStrand;
  void add(Clock::time_point when, std::function<void()> fn, std::shared_ptr<bool> cancelled);
  bool run_one_due();

  mutable Mutex mu_;
  Clock::time_point now_ CELLGATE_GUARDED_BY(mu_) = Clock::time_point{} + std::chrono::hours(1);
  std::uint64_t seq_ CELLGATE_GUARDED_BY(mu_) = 0;
  std::vector<Task> tasks_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace cellgate::util
