// The death monitor and the culler: one pass every 250 ms (sooner when a connection reports a
// death) restarts kernels that died, declares dead those past --restart-limit, and, every
// cull_interval on the injected clock, shuts down kernels idle longer than cull_idle_timeout.
#include <spdlog/spdlog.h>

#include "cellgate/kernels/registry.hpp"
#include "records.hpp"

namespace cellgate::kernels {
namespace {

std::chrono::milliseconds from_seconds(double s) {
  return std::chrono::milliseconds(static_cast<long long>(s * 1000));
}

}  // namespace

void KernelRegistry::monitor_loop() {
  std::unique_lock lock(monitor_mu_);
  while (!stopping_) {
    monitor_cv_.wait_for(lock, std::chrono::milliseconds(250));
    if (stopping_) {
      break;
    }
    lock.unlock();
    monitor_once();
    lock.lock();
  }
}

void KernelRegistry::monitor_once() {
  std::lock_guard pass(pass_mu_);
  backend_.tick();
  std::vector<std::shared_ptr<ManagedKernel>> snapshot;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, k] : kernels_) {
      snapshot.push_back(k);
    }
  }
  for (const auto& k : snapshot) {
    if (std::string reason = k->death_reason(); !reason.empty()) {
      handle_death(k, reason);
    }
  }
  if (options_.cull_idle_timeout > 0 && now_() >= next_cull_) {
    next_cull_ = now_() + from_seconds(options_.cull_interval);
    cull();
  }
}

void KernelRegistry::handle_death(const std::shared_ptr<ManagedKernel>& k,
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
    spdlog::error("kernel {}: restart failed: {}", k->id(), launched.error().message);
    k->restart_failed(reason + "; the restart failed: " + launched.error().message);
    k->publish_status("dead", launched.error().message);
  } else {
    stats_.restarts.add();
    spdlog::info("kernel {} restarted after: {}", k->id(), reason);
  }
}

void KernelRegistry::cull() {
  const auto now = now_();
  const auto idle_limit = from_seconds(options_.cull_idle_timeout);
  std::vector<std::shared_ptr<ManagedKernel>> snapshot;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, k] : kernels_) {
      snapshot.push_back(k);
    }
  }
  std::vector<std::string> victims;
  for (const auto& k : snapshot) {
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
