// The warm pool (warm_pool.hpp): fillers that keep each pooled kernelspec at its target, the
// target following demand, claims, evictions under --max-kernels, and dead pooled kernels
// replaced.
#include "warm_pool.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace cellgate::kernels {
namespace {

using Clock = util::Clock;

}  // namespace

// ---- PoolDemand -------------------------------------------------------------------------------

void PoolDemand::note_start(Clock::time_point at) {
  starts_.push_back(at);
  if (starts_.size() > kMaxRemembered) {
    starts_.pop_front();
  }
}

void PoolDemand::note_refill(Clock::duration took) {
  // A mean that follows the machine's load within a few starts: the new one weighs a quarter.
  refill_ = measured_ ? (refill_ * 3 + took) / 4 : took;
  measured_ = true;
}

std::size_t PoolDemand::target(Clock::time_point now, std::size_t least, std::size_t most) {
  while (!starts_.empty() && now - starts_.front() > kWindow) {
    starts_.pop_front();
  }
  // The most starts within any one refill time: two indices over the sorted times (a client's
  // starts are noted in the order they came; the clock does not go back).
  std::size_t peak = 0;
  std::size_t first = 0;
  for (std::size_t last = 0; last < starts_.size(); ++last) {
    while (starts_[last] - starts_[first] >= refill_ && starts_[last] > starts_[first]) {
      ++first;
    }
    peak = std::max(peak, last - first + 1);
  }
  return std::clamp(peak, least, std::max(least, most));
}

// ---- WarmPool ---------------------------------------------------------------------------------

WarmPool::WarmPool(WarmPoolOptions options, Admission& admission, kernel::KernelBackend& backend,
                   Launch launch, Discard discard, Now now)
    : options_(std::move(options)),
      admission_(admission),
      backend_(backend),
      launch_(std::move(launch)),
      discard_(std::move(discard)),
      now_(std::move(now)) {
  for (const auto& name : options_.names) {
    specs_[name];
  }
}

WarmPool::~WarmPool() {
  stop();
}

bool WarmPool::pools(const std::string& name) const {
  return std::find(options_.names.begin(), options_.names.end(), name) != options_.names.end();
}

void WarmPool::start() {
  MutexLock lock(mu_);
  if (options_.names.empty() || !fillers_.empty() || stopping_) {
    return;
  }
  for (std::size_t i = 0; i < std::max<std::size_t>(1, options_.parallel); ++i) {
    fillers_.emplace_back([this] { fill_loop(); });
  }
}

void WarmPool::stop() {
  std::vector<std::thread> fillers;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    fillers.swap(fillers_);
  }
  cv_.notify_all();
  for (auto& t : fillers) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) {
      t.join();  // waits for a start in flight
    } else if (t.joinable()) {
      t.detach();
    }
  }
  std::vector<Entry> ready;
  {
    MutexLock lock(mu_);
    for (auto& [name, spec] : specs_) {
      std::move(spec.ready.begin(), spec.ready.end(), std::back_inserter(ready));
      spec.ready.clear();
    }
  }
  for (auto& e : ready) {
    e.ticket.reset();
    discard_(e.kernel);
  }
}

void WarmPool::wake() {
  cv_.notify_all();
}

std::optional<WarmPool::Taken> WarmPool::take(const std::string& name) {
  std::optional<Taken> out;
  {
    MutexLock lock(mu_);
    auto it = specs_.find(name);
    if (it == specs_.end()) {
      return std::nullopt;
    }
    it->second.demand.note_start(now_());
    if (!it->second.ready.empty()) {
      Entry e = std::move(it->second.ready.front());
      it->second.ready.erase(it->second.ready.begin());
      out = Taken{std::move(e.kernel), std::move(e.ticket)};
    }
  }
  cv_.notify_all();  // refill, and the target may have grown
  return out;
}

void WarmPool::evict_excess() {
  std::vector<std::shared_ptr<ManagedKernel>> out;
  {
    MutexLock lock(mu_);
    while (admission_.excess() > 0) {
      Spec* fullest = nullptr;
      for (auto& [name, spec] : specs_) {
        if (!spec.ready.empty() &&
            (fullest == nullptr || spec.ready.size() > fullest->ready.size())) {
          fullest = &spec;
        }
      }
      if (fullest == nullptr) {
        break;  // only pool starts in flight: refill() drops them when they finish
      }
      Entry e = std::move(fullest->ready.front());
      fullest->ready.erase(fullest->ready.begin());
      e.ticket.reset();
      out.push_back(std::move(e.kernel));
    }
  }
  for (const auto& k : out) {
    spdlog::debug("kernel pool: ending pooled kernel {} to make room (--max-kernels)", k->id());
    discard_(k);
  }
}

std::size_t WarmPool::ready(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = specs_.find(name);
  return it == specs_.end() ? 0 : it->second.ready.size();
}

std::size_t WarmPool::ready_total() const {
  MutexLock lock(mu_);
  std::size_t n = 0;
  for (const auto& [name, spec] : specs_) {
    n += spec.ready.size();
  }
  return n;
}

std::vector<std::shared_ptr<ManagedKernel>> WarmPool::ready_kernels(const std::string& name) const {
  std::vector<std::shared_ptr<ManagedKernel>> out;
  MutexLock lock(mu_);
  if (auto it = specs_.find(name); it != specs_.end()) {
    for (const auto& e : it->second.ready) {
      out.push_back(e.kernel);
    }
  }
  return out;
}

std::size_t WarmPool::target(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = specs_.find(name);
  return it == specs_.end() ? 0 : target_locked(const_cast<Spec&>(it->second));
}

std::size_t WarmPool::target_locked(Spec& spec) const {
  return spec.demand.target(now_(), options_.floor, options_.max);
}

std::size_t WarmPool::starting_locked() const {
  std::size_t n = 0;
  for (const auto& [name, spec] : specs_) {
    n += spec.starting;
  }
  return n;
}

std::size_t WarmPool::budget_locked() const {
  // Fewer while clients' starts are in flight, so a refill after a burst takes the idle CPUs and
  // never more than one from a client start.
  const std::size_t most = std::max<std::size_t>(1, options_.parallel);
  const std::size_t pending = admission_.counts().pending;
  return most > pending ? most - pending : 1;
}

bool WarmPool::refill(const std::string& name, Admission::Ticket ticket) {
  auto launched = launch_(name);
  bool kept = false;
  std::size_t ready = 0;
  {
    MutexLock lock(mu_);
    Spec& spec = specs_[name];
    --spec.starting;
    // A client start may have taken the room meanwhile (clients are never refused for the pool).
    if (launched && !stopping_ && admission_.excess() == 0) {
      spec.ready.push_back(Entry{launched.value(), std::move(ticket)});
      kept = true;
      ready = spec.ready.size();
    } else {
      ticket.reset();
    }
  }
  if (kept) {
    // At info like every other kernel start (tests/bench/gateway_bench.py waits for this line).
    spdlog::info("kernel pool: kernel {} ready ({} ready, {})", launched.value()->id(), ready,
                 name);
  } else if (launched) {
    discard_(launched.value());
  }
  if (!launched) {
    spdlog::warn("kernel pool: cannot start a '{}' kernel: {}", name, launched.error().describe());
  }
  return launched.ok();
}

void WarmPool::reap_dead() {
  std::vector<std::shared_ptr<ManagedKernel>> dead;
  {
    MutexLock lock(mu_);
    for (auto& [name, spec] : specs_) {
      for (auto it = spec.ready.begin(); it != spec.ready.end();) {
        if (it->kernel->death_reason().empty()) {
          ++it;
          continue;
        }
        it->ticket.reset();
        dead.push_back(std::move(it->kernel));
        it = spec.ready.erase(it);
      }
    }
  }
  for (const auto& k : dead) {
    spdlog::warn("kernel pool: pooled kernel {} ({}) died: {}; replacing it", k->id(),
                 k->spec().name, k->death_reason());
    discard_(k);
  }
}

void WarmPool::trim_to_target() {
  std::vector<std::shared_ptr<ManagedKernel>> extra;
  std::vector<std::size_t> targets;
  {
    MutexLock lock(mu_);
    for (auto& [name, spec] : specs_) {
      const std::size_t target = target_locked(spec);
      while (spec.ready.size() > target) {
        Entry e = std::move(spec.ready.front());  // the longest ready: they are all alike
        spec.ready.erase(spec.ready.begin());
        e.ticket.reset();
        extra.push_back(std::move(e.kernel));
        targets.push_back(target);
      }
    }
  }
  for (std::size_t i = 0; i < extra.size(); ++i) {
    spdlog::info("kernel pool: ending pooled kernel {} ({}): demand fell, {} wanted ready",
                 extra[i]->id(), extra[i]->spec().name, targets[i]);
    discard_(extra[i]);
  }
}

bool WarmPool::wait_for_fast_launches() {
  // Pool kernels forked from the zygote share its pages; cold ones would each hold their own.
  // So the first fill waits a while for launches to become fast (the zygote's preload).
  // wait_fast answers false at once when launches will never be fast (no zygote, or it failed
  // for good), and after the whole slice while they may still become fast.
  constexpr auto kSlice = std::chrono::milliseconds(200);
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    const auto asked = Clock::now();
    if (backend_.wait_fast(kSlice)) {
      return true;
    }
    const bool never = Clock::now() - asked < kSlice;
    MutexLock lock(mu_);
    if (stopping_) {
      return false;
    }
    if (never || Clock::now() >= give_up) {
      if (!never) {
        spdlog::warn("kernel pool: no zygote ready; filling the pool cold");
      }
      return true;
    }
  }
}

void WarmPool::fill_loop() {
  constexpr auto kFirstBackoff = std::chrono::seconds(1);
  constexpr auto kMaxBackoff = std::chrono::seconds(60);
  if (!wait_for_fast_launches()) {
    return;
  }
  for (;;) {
    reap_dead();
    trim_to_target();
    std::string name;
    Admission::Ticket ticket;
    {
      UniqueLock lock(mu_);
      if (stopping_) {
        return;
      }
      const auto now = Clock::now();
      if (starting_locked() < budget_locked()) {
        for (const auto& n : options_.names) {
          Spec& spec = specs_[n];
          if (now < spec.retry_at || spec.ready.size() + spec.starting >= target_locked(spec)) {
            continue;
          }
          auto place = admission_.admit_pooled();
          if (!place) {
            break;  // --max-kernels: no room for any
          }
          ticket = std::move(*place);
          name = n;
          ++spec.starting;
          break;
        }
      }
      if (name.empty()) {
        cv_.wait_for(lock, std::chrono::milliseconds(250));
        continue;
      }
    }
    const auto began = Clock::now();
    const bool started = refill(name, std::move(ticket));
    MutexLock lock(mu_);  // the backoff is shared by the fillers
    Spec& spec = specs_[name];
    if (started) {
      spec.backoff = Clock::duration::zero();
      spec.retry_at = {};
      spec.demand.note_refill(Clock::now() - began);
    } else {
      auto& b = spec.backoff;
      b = b == Clock::duration::zero() ? Clock::duration(kFirstBackoff)
                                       : std::min<Clock::duration>(b * 2, kMaxBackoff);
      spec.retry_at = Clock::now() + b;
      spdlog::warn("kernel pool: next '{}' start in {} s", name,
                   std::chrono::duration_cast<std::chrono::seconds>(b).count());
    }
  }
}

}  // namespace cellgate::kernels
