// The warm pool: per pooled kernelspec, kernels started ahead of demand (kernel_info answered,
// one silent cell run) and handed to client starts that ask for no env. It owns its own lock and
// its filler threads and is given what it needs: a function that launches one kernel, one that
// ends a kernel no client saw, the admission count (admission.hpp) each pooled kernel holds a
// place in, and the backend only to wait for fast launches (the zygote) before the first fill.
//
//   WarmPool pool({.names = {"python3"}, .floor = 2, .max = 8, .parallel = 2}, admission,
//                 backend, launch_one, discard, now);
//   pool.start();                                   // the fillers
//   if (auto taken = pool.take("python3")) { … taken->ticket.make_live(); }
//
// Its size follows demand. --pool-size is the floor; above it the target is the most starts the
// pool could have served that came within one refill time (a pool start, measured) during the
// last minute, up to --pool-max: that many ready kernels let such a run of starts all hit. On a
// 2-core machine a miss costs ~290 ms against ~16 ms for a hit, and a sequential client of a
// pool of 2 missed every third start. Ready kernels above a fallen target are ended.
//
// A pooled kernel that dies is dropped and replaced, never restarted; ready ones give way when
// the admission is over its limit (evict_excess()). Pool starts at once: `parallel` less the
// client starts in flight, at least one.
//
// Thread-safety: all members are thread-safe. Lock order: the pool's lock, then the admission's;
// launch and discard are called with no lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "admission.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernels/managed_kernel.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernels {

// How many ready kernels the recent starts of one kernelspec ask for: the most of them that came
// within one refill time in the last `window`, between `floor` and `max`. Pure; on whatever
// clock the caller passes.
class PoolDemand {
 public:
  static constexpr std::chrono::seconds kWindow{60};
  static constexpr std::size_t kMaxRemembered = 1024;

  void note_start(util::Clock::time_point at);
  // A pool start took `took`: the refill time is the mean of the recent ones (an EWMA).
  void note_refill(util::Clock::duration took);
  std::size_t target(util::Clock::time_point now, std::size_t least, std::size_t most);
  util::Clock::duration refill_time() const { return refill_; }

 private:
  std::deque<util::Clock::time_point> starts_;              // oldest first, within kWindow
  util::Clock::duration refill_ = std::chrono::seconds(1);  // until one is measured
  bool measured_ = false;
};

struct WarmPoolOptions {
  std::vector<std::string> names;  // the pooled kernelspecs
  std::size_t floor = 0;           // ready kernels kept per kernelspec at least (--pool-size)
  std::size_t max = 0;             // and at most, however high demand is (--pool-max; >= floor)
  std::size_t parallel = 1;        // pool starts at once, at most (fillers)
};

class WarmPool {
 public:
  // Starts one kernel of kernelspec `name` for the pool, ready and warmed; blocking.
  using Launch = std::function<Result<std::shared_ptr<ManagedKernel>>(const std::string& name)>;
  // Ends a kernel no client ever saw (no shutdown_request) and cleans up after it.
  using Discard = std::function<void(const std::shared_ptr<ManagedKernel>&)>;

  WarmPool(WarmPoolOptions options, Admission& admission, kernel::KernelBackend& backend,
           Launch launch, Discard discard, Now now);
  ~WarmPool();  // stop()
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;

  bool pools(const std::string& name) const;
  bool empty() const { return options_.names.empty(); }
  void start();  // the fillers; once
  // For good: no more refills, the fillers joined (a start in flight is waited for), every
  // ready kernel discarded.
  void stop();

  struct Taken {
    std::shared_ptr<ManagedKernel> kernel;
    Admission::Ticket ticket;  // pooled still: make_live() once the kernel is the client's
  };
  // The longest-ready kernel of `name`, or nothing. Counts as demand for `name` either way (the
  // registry calls it only for starts the pool can serve).
  std::optional<Taken> take(const std::string& name);
  // While the admission is over its limit: ready kernels given up, from the kernelspec with the
  // most ready, longest-ready first; discarded before this returns.
  void evict_excess();
  // A client start ended or a kernel died: the fillers look again.
  void wake();

  std::size_t ready(const std::string& name) const;
  std::size_t ready_total() const;
  std::vector<std::shared_ptr<ManagedKernel>> ready_kernels(const std::string& name) const;
  // Ready kernels wanted now for `name`: floor .. max by demand.
  std::size_t target(const std::string& name) const;

 private:
  struct Entry {
    std::shared_ptr<ManagedKernel> kernel;
    Admission::Ticket ticket;
  };
  struct Spec {
    std::vector<Entry> ready;  // oldest first
    std::size_t starting = 0;
    util::Clock::time_point retry_at{};  // after a failed start, none before this
    util::Clock::duration backoff{};     // doubles on each failure
    PoolDemand demand;
  };

  void fill_loop();
  bool wait_for_fast_launches();  // false: stopped meanwhile
  // Starts one kernel for `name` holding `ticket`; false when the launch failed.
  bool refill(const std::string& name, Admission::Ticket ticket);
  void reap_dead();
  void trim_to_target();
  std::size_t starting_locked() const CELLGATE_REQUIRES(mu_);
  std::size_t budget_locked() const CELLGATE_REQUIRES(mu_);
  std::size_t target_locked(Spec& spec) const CELLGATE_REQUIRES(mu_);

  const WarmPoolOptions options_;
  Admission& admission_;
  kernel::KernelBackend& backend_;
  const Launch launch_;
  const Discard discard_;
  const Now now_;

  mutable Mutex mu_;
  std::condition_variable_any cv_;  // with mu_: a claim, a death, a client start ended, stopping
  std::map<std::string, Spec> specs_ CELLGATE_GUARDED_BY(mu_);  // one per name in options_.names
  bool stopping_ CELLGATE_GUARDED_BY(mu_) = false;
  std::vector<std::thread> fillers_;
};

}  // namespace cellgate::kernels
