// The warm pool: per pooled kernelspec, kernels started ahead of demand and handed to clients
// that start a kernel without env. They count towards max_kernels but give way to client starts;
// one that dies is dropped and replaced, never restarted.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "cellgate/kernels/registry.hpp"
#include "kernelspecs.hpp"
#include "records.hpp"

namespace cellgate::kernels {
namespace {

using Clock = util::Clock;
using kernel::Channel;

}  // namespace

bool KernelRegistry::is_pooled(const std::string& name) const {
  return std::find(pool_names_.begin(), pool_names_.end(), name) != pool_names_.end();
}

std::size_t KernelRegistry::pool_starting_locked() const {
  std::size_t n = 0;
  for (const auto& [name, starting] : pool_starting_) {
    n += starting;
  }
  return n;
}

std::size_t KernelRegistry::pool_total_locked() const {
  std::size_t n = pool_starting_locked();
  for (const auto& [name, ready] : pool_) {
    n += ready.size();
  }
  return n;
}

std::size_t KernelRegistry::pool_parallel() const {
  if (options_.pool_parallel > 0) {
    return static_cast<std::size_t>(options_.pool_parallel);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::size_t KernelRegistry::pool_budget_locked() const {
  const std::size_t most = pool_parallel();
  return most > pending_ ? most - pending_ : 1;
}

std::size_t KernelRegistry::pool_ready(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = pool_.find(name.empty() ? default_kernel_ : name);
  return it == pool_.end() ? 0 : it->second.size();
}

std::vector<pid_t> KernelRegistry::pool_pids(const std::string& name) const {
  std::vector<std::shared_ptr<ManagedKernel>> ready;
  {
    std::lock_guard lock(mu_);
    if (auto it = pool_.find(name.empty() ? default_kernel_ : name); it != pool_.end()) {
      ready = it->second;
    }
  }
  std::vector<pid_t> out;
  for (const auto& k : ready) {
    if (auto facts = k->process_facts()) {
      out.push_back(facts->pid);
    }
  }
  return out;
}

std::shared_ptr<ManagedKernel> KernelRegistry::claim_pooled(const std::string& name) {
  for (;;) {
    std::shared_ptr<ManagedKernel> k;
    {
      std::lock_guard lock(mu_);
      auto it = pool_.find(name);
      if (it == pool_.end() || it->second.empty()) {
        return nullptr;
      }
      k = it->second.front();
      it->second.erase(it->second.begin());
      ++pending_;  // still counted towards max_kernels while it moves
    }
    const std::string dead = k->death_reason();
    k->touch();
    auto facts = k->process_facts();
    Result<void> recorded =
        !dead.empty() ? Result<void>()
        : facts       ? write_record(options_.state_dir, *k, *facts, options_.jail)
                      : Result<void>(make_error(ErrorCode::kUnavailable, "kernel_unavailable",
                                                "the pooled kernel has no process"));
    const bool ok = dead.empty() && recorded.ok();
    {
      std::lock_guard lock(mu_);
      --pending_;
      if (ok) {
        kernels_[k->id()] = k;
      }
    }
    pool_cv_.notify_all();  // refill
    if (ok) {
      spdlog::info("kernel {} started ({}), uid {}, from the pool", k->id(), name, k->uid());
      return k;
    }
    spdlog::warn("kernel pool: dropping pooled kernel {} ({}): {}", k->id(), name,
                 dead.empty() ? recorded.error().describe() : "it died: " + dead);
    discard(k);
  }
}

std::vector<std::shared_ptr<ManagedKernel>> KernelRegistry::evict_pooled_locked() {
  std::vector<std::shared_ptr<ManagedKernel>> out;
  std::size_t total = kernels_.size() + pending_ + pool_total_locked();
  while (total > options_.max_kernels) {
    auto fullest = pool_.end();
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if (!it->second.empty() &&
          (fullest == pool_.end() || it->second.size() > fullest->second.size())) {
        fullest = it;
      }
    }
    if (fullest == pool_.end()) {
      break;  // only pool starts in flight: refill() drops them when they finish
    }
    out.push_back(fullest->second.front());
    fullest->second.erase(fullest->second.begin());
    --total;
  }
  return out;
}

bool KernelRegistry::refill(const std::string& name) {
  auto spec = kernelspec(name);
  std::shared_ptr<ManagedKernel> k;
  Result<void> made;
  if (spec) {
    std::lock_guard lock(mu_);
    auto made_k = new_kernel_locked(std::move(spec).value(), {});
    if (made_k) {
      k = std::move(made_k).value();
    } else {
      made = std::move(made_k).error();
    }
  } else {
    made = std::move(spec).error();
  }
  Result<void> launched = k ? start_fresh(k) : std::move(made);
  if (launched && is_ipykernel(k->spec())) {
    // An ipykernel's first cell costs ~10 ms more than later ones (IPython sets up its input
    // transformers and display machinery lazily): pay it here. Silent and without history, so
    // the execution count and In/Out are still a fresh kernel's. Not for other kernels: `pass`
    // is Python (in R it is an error, and IRkernel then aborts what is queued behind it).
    if (auto conn = k->connection()) {
      (void)conn->request(Channel::kShell, "execute_request",
                          kernel::execute_content("pass", false, false, true),
                          std::chrono::seconds(10));
    }
  }
  bool kept = false;
  std::size_t ready = 0;
  {
    std::lock_guard lock(mu_);
    --pool_starting_[name];
    // A client start may have taken the room meanwhile (clients are never refused for the pool).
    if (launched && !pool_stopping_ &&
        kernels_.size() + pending_ + pool_total_locked() < options_.max_kernels) {
      pool_[name].push_back(k);
      kept = true;
      ready = pool_[name].size();
    }
  }
  if (kept) {
    // At info like every other kernel start (tests/bench/gateway_bench.py waits for this line).
    spdlog::info("kernel pool: kernel {} ready ({} ready, {})", k->id(), ready, name);
  } else if (k) {
    discard(k);
  }
  if (!launched) {
    spdlog::warn("kernel pool: cannot start a '{}' kernel: {}", name, launched.error().describe());
  }
  return launched.ok();
}

void KernelRegistry::reap_dead_pooled() {
  std::vector<std::shared_ptr<ManagedKernel>> ready;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, kernels] : pool_) {
      ready.insert(ready.end(), kernels.begin(), kernels.end());
    }
  }
  for (const auto& k : ready) {
    const std::string reason = k->death_reason();
    if (reason.empty()) {
      continue;
    }
    bool mine = false;  // still pooled, not claimed meanwhile
    {
      std::lock_guard lock(mu_);
      auto& kernels = pool_[k->spec().name];
      if (auto it = std::find(kernels.begin(), kernels.end(), k); it != kernels.end()) {
        kernels.erase(it);
        mine = true;
      }
    }
    if (mine) {
      spdlog::warn("kernel pool: pooled kernel {} ({}) died: {}; replacing it", k->id(),
                   k->spec().name, reason);
      discard(k);
    }
  }
}

void KernelRegistry::pool_loop() {
  constexpr auto kFirstBackoff = std::chrono::seconds(1);
  constexpr auto kMaxBackoff = std::chrono::seconds(60);
  // Pool kernels forked from the zygote share its pages; cold ones would each hold their own.
  // So the first fill waits a while for launches to become fast (the zygote's preload).
  // wait_fast answers false at once when launches will never be fast (no zygote, or it failed
  // for good), and after the whole slice while they may still become fast.
  constexpr auto kSlice = std::chrono::milliseconds(200);
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    const auto asked = Clock::now();
    if (backend_.wait_fast(kSlice)) {
      break;
    }
    const bool never = Clock::now() - asked < kSlice;
    std::lock_guard lock(mu_);
    if (pool_stopping_) {
      return;
    }
    if (never || Clock::now() >= give_up) {
      if (!never) {
        spdlog::warn("kernel pool: no zygote ready; filling the pool cold");
      }
      break;
    }
  }
  for (;;) {
    reap_dead_pooled();
    std::string name;
    {
      std::unique_lock lock(mu_);
      if (pool_stopping_) {
        return;
      }
      const auto now = Clock::now();
      if (kernels_.size() + pending_ + pool_total_locked() < options_.max_kernels &&
          pool_starting_locked() < pool_budget_locked()) {
        for (const auto& n : pool_names_) {
          if (now >= pool_retry_at_[n] &&
              pool_[n].size() + pool_starting_[n] < static_cast<std::size_t>(options_.pool_size)) {
            name = n;
            ++pool_starting_[n];
            break;
          }
        }
      }
      if (name.empty()) {
        pool_cv_.wait_for(lock, std::chrono::milliseconds(250));
        continue;
      }
    }
    const bool started = refill(name);
    std::lock_guard lock(mu_);  // the backoff is shared by the fillers
    if (started) {
      pool_backoff_.erase(name);
      pool_retry_at_.erase(name);
    } else {
      auto& b = pool_backoff_[name];
      b = b == Clock::duration::zero() ? Clock::duration(kFirstBackoff)
                                       : std::min<Clock::duration>(b * 2, kMaxBackoff);
      pool_retry_at_[name] = Clock::now() + b;
      spdlog::warn("kernel pool: next '{}' start in {} s", name,
                   std::chrono::duration_cast<std::chrono::seconds>(b).count());
    }
  }
}

std::size_t KernelRegistry::pool_ready_total() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const auto& [name, kernels] : pool_) {
    n += kernels.size();
  }
  return n;
}

void KernelRegistry::stop_pool() {
  {
    std::lock_guard lock(mu_);
    pool_stopping_ = true;
  }
  pool_cv_.notify_all();
  for (auto& t : pool_threads_) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) {
      t.join();  // waits for a start in flight
    }
  }
  std::vector<std::shared_ptr<ManagedKernel>> ready;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, kernels] : pool_) {
      ready.insert(ready.end(), kernels.begin(), kernels.end());
    }
    pool_.clear();
  }
  for (const auto& k : ready) {
    discard(k);
  }
}

}  // namespace cellgate::kernels
