#include "cellgate/util/loop.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

namespace cellgate::util {
namespace {

namespace net = boost::asio;

class AsioTimer : public Timer {
 public:
  explicit AsioTimer(net::strand<net::io_context::executor_type> strand) : timer(strand) {}
  void cancel() override {
    cancelled->store(true);
    net::post(timer.get_executor(), [this, keep = keep_alive.lock()] {
      if (keep) {
        timer.cancel();
      }
    });
  }
  net::steady_timer timer;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  std::weak_ptr<AsioTimer> keep_alive;
};

class AsioStrand : public Strand {
 public:
  explicit AsioStrand(net::io_context& ioc) : strand_(net::make_strand(ioc)) {}
  void post(std::function<void()> fn) override { net::post(strand_, std::move(fn)); }
  std::shared_ptr<Timer> at(Clock::time_point when, std::function<void()> fn) override {
    auto timer = std::make_shared<AsioTimer>(strand_);
    timer->keep_alive = timer;
    timer->timer.expires_at(when);
    timer->timer.async_wait([timer, fn = std::move(fn)](const boost::system::error_code& ec) {
      if (!ec && !timer->cancelled->load()) {
        fn();
      }
    });
    return timer;
  }

 private:
  net::strand<net::io_context::executor_type> strand_;
};

}  // namespace

std::shared_ptr<Strand> AsioLoop::strand() {
  return std::make_shared<AsioStrand>(ioc_);
}

// ---- ManualLoop ------------------------------------------------------------------------------

class ManualLoop::ManualStrand : public Strand {
 public:
  explicit ManualStrand(ManualLoop& loop) : loop_(loop) {}
  void post(std::function<void()> fn) override {
    loop_.add(loop_.now(), std::move(fn), std::make_shared<bool>(false));
  }
  std::shared_ptr<Timer> at(Clock::time_point when, std::function<void()> fn) override {
    struct ManualTimer : Timer {
      std::shared_ptr<bool> cancelled = std::make_shared<bool>(false);
      Mutex* mu = nullptr;
      void cancel() override {
        MutexLock lock(*mu);
        *cancelled = true;
      }
    };
    auto timer = std::make_shared<ManualTimer>();
    timer->mu = &loop_.mu_;
    loop_.add(when, std::move(fn), timer->cancelled);
    return timer;
  }

 private:
  ManualLoop& loop_;
};

Clock::time_point ManualLoop::now() const {
  MutexLock lock(mu_);
  return now_;
}

std::shared_ptr<Strand> ManualLoop::strand() {
  return std::make_shared<ManualStrand>(*this);
}

void ManualLoop::add(Clock::time_point when, std::function<void()> fn,
                     std::shared_ptr<bool> cancelled) {
  MutexLock lock(mu_);
  tasks_.push_back({when, seq_++, std::move(fn), std::move(cancelled)});
}

bool ManualLoop::run_one_due() {
  std::function<void()> fn;
  {
    MutexLock lock(mu_);
    std::erase_if(tasks_, [](const Task& t) { return *t.cancelled; });
    auto it = std::min_element(tasks_.begin(), tasks_.end(), [](const Task& a, const Task& b) {
      return a.when != b.when ? a.when < b.when : a.seq < b.seq;
    });
    if (it == tasks_.end() || it->when > now_) {
      return false;
    }
    fn = std::move(it->fn);
    tasks_.erase(it);
  }
  fn();
  return true;
}

void ManualLoop::run_ready() {
  while (run_one_due()) {
  }
}

void ManualLoop::advance(Clock::duration d) {
  Clock::time_point target;
  {
    MutexLock lock(mu_);
    target = now_ + d;
  }
  for (;;) {
    run_ready();
    MutexLock lock(mu_);
    std::erase_if(tasks_, [](const Task& t) { return *t.cancelled; });
    auto it = std::min_element(tasks_.begin(), tasks_.end(),
                               [](const Task& a, const Task& b) { return a.when < b.when; });
    if (it == tasks_.end() || it->when > target) {
      now_ = target;
      break;
    }
    now_ = std::max(now_, it->when);
  }
  run_ready();
}

std::size_t ManualLoop::pending_timers() const {
  MutexLock lock(mu_);
  return static_cast<std::size_t>(
      std::count_if(tasks_.begin(), tasks_.end(), [](const Task& t) { return !*t.cancelled; }));
}

}  // namespace cellgate::util
