// The death monitor and the culler: one pass every 250 ms (sooner when a connection reports a
// death) restarts kernels that died, declares dead those past --restart-limit, and, every
// cull_interval on the injected clock, shuts down kernels idle longer than cull_idle_timeout.
// The passes run on a thread of the registry's own, or as timers on the monitor loop it was
// given (registry.hpp; tests move a util::ManualLoop).
#include <spdlog/spdlog.h>

#include "cellgate/kernels/registry.hpp"
#include "cellgate/util/log_fields.hpp"
#include "records.hpp"
#include "registry_impl.hpp"

namespace cellgate::kernels {
namespace {

constexpr std::chrono::milliseconds kPassInterval(250);

std::chrono::milliseconds from_seconds(double s) {
  return std::chrono::milliseconds(static_cast<long long>(s * 1000));
}

}  // namespace

void KernelRegistry::Impl::start_monitor() {
  MutexLock lock(monitor_mu_);
  if (stopping_) {
    return;
  }
  if (monitor_loop_ == nullptr) {
    if (!monitor_.joinable()) {
      monitor_ = std::thread([this] { monitor_loop(); });
    }
    return;
  }
  if (!monitor_strand_) {
    monitor_strand_ = monitor_loop_->strand();
    schedule_pass();
  }
}

void KernelRegistry::Impl::schedule_pass() {
  std::weak_ptr<bool> alive = alive_;
  monitor_timer_ = monitor_strand_->at(monitor_loop_->now() + kPassInterval, [this, alive] {
    if (alive.expired()) {
      return;
    }
    monitor_once();
    MutexLock lock(monitor_mu_);
    if (!stopping_) {
      schedule_pass();
    }
  });
}

void KernelRegistry::Impl::wake_monitor() {
  MutexLock lock(monitor_mu_);
  if (monitor_strand_ && !stopping_) {
    std::weak_ptr<bool> alive = alive_;
    monitor_strand_->post([this, alive] {
      if (!alive.expired()) {
        monitor_once();
      }
    });
  }
  monitor_cv_.notify_all();
}

void KernelRegistry::Impl::monitor_loop() {
  UniqueLock lock(monitor_mu_);
  while (!stopping_) {
    monitor_cv_.wait_for(lock, kPassInterval);
    if (stopping_) {
      break;
    }
    lock.unlock();
    monitor_once();
    lock.lock();
  }
}

void KernelRegistry::Impl::stop_monitor() {
  {
    MutexLock lock(monitor_mu_);
    stopping_ = true;
    alive_.reset();
    if (monitor_timer_) {
      monitor_timer_->cancel();
    }
  }
  monitor_cv_.notify_all();
  if (monitor_.joinable()) {
    monitor_.join();
  }
}

void KernelRegistry::Impl::monitor_once() {
  MutexLock pass(pass_mu_);
  backend_.tick();
  for (const auto& k : snapshot()) {
    if (std::string reason = k->death_reason(); !reason.empty()) {
      handle_death(k, reason);
    }
  }
  if (options_.cull_idle_timeout > 0 && now_() >= next_cull_) {
    next_cull_ = now_() + from_seconds(options_.cull_interval);
    cull();
  }
  if (options_.hibernate_after > 0 && options_.checkpoints_unavailable.empty()) {
    hibernate_idle();
  }
}

void KernelRegistry::Impl::handle_death(const std::shared_ptr<ManagedKernel>& k,
                                        const std::string& reason) {
  const auto after = k->died(reason, options_.restart_limit);
  if (after != ManagedKernel::AfterDeath::kIgnored) {
    // The launcher's reason word ("oom (signal 9): killed by the memory limit…" → "oom").
    std::string kind = reason.substr(0, reason.find_first_of(" :("));
    stats_.deaths.add(kind == "the" ? "heartbeat" : kind);
  }
  if (after == ManagedKernel::AfterDeath::kIgnored) {
    return;
  }
  spdlog::warn("kernel {} died: {}", k->id(), reason);
  if (after == ManagedKernel::AfterDeath::kDead) {
    k->publish_status("dead", reason);
    return;
  }
  k->publish_status("restarting", reason);
  k->stop_process();
  auto launched = [&]() -> Result<void> {
    CELLGATE_ASSIGN_OR_RETURN(auto running, launch(k));
    CELLGATE_TRY(
        write_record(options_.state_dir, *k, ProcessFacts::of(*running.process), options_.jail));
    return k->started(std::move(running));
  }();
  if (!launched) {
    util::log_kernel_action(
        "restart", k->id(), k->spec().name, false,
        fmt::format("kernel {}: restart failed: {}", k->id(), launched.error().message));
    k->restart_failed(reason + "; the restart failed: " + launched.error().message);
    k->publish_status("dead", launched.error().message);
  } else {
    stats_.restarts.add();
    util::log_kernel_action("restart", k->id(), k->spec().name, true,
                            fmt::format("kernel {} restarted after: {}", k->id(), reason));
  }
}

void KernelRegistry::Impl::cull() {
  const auto now = now_();
  const auto idle_limit = from_seconds(options_.cull_idle_timeout);
  std::vector<std::string> victims;
  for (const auto& k : snapshot()) {
    const KernelModel model = k->model();
    const bool idle_long = now - k->last_activity() > idle_limit;
    const bool busy_ok = options_.cull_busy || model.execution_state != "busy";
    const bool conn_ok = options_.cull_connected || model.connections == 0;
    if ((idle_long && busy_ok && conn_ok) || model.execution_state == "dead") {
      victims.push_back(model.id);
    }
  }
  for (const auto& id : victims) {
    spdlog::info("culling kernel {} (idle)", id);
    (void)shutdown(id);
  }
}

}  // namespace cellgate::kernels
