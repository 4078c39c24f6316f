// SandboxRegistry's snapshots, forks and metrics (registry.hpp).
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>

#include <algorithm>

#include "cellgate/sandboxes/registry.hpp"

namespace cellgate::sandboxes {
namespace {

using nlohmann::json;

Error no_snapshot(const std::string& id) {
  return make_error(ErrorCode::kNotFound, "no_snapshot",
                    "snapshot " + id.substr(0, 64) + " not found");
}

}  // namespace

json Metric::to_json(int cpu_count) const {
  return json{{"timestamp", iso8601(at)},
              {"timestampUnix",
               std::chrono::duration_cast<std::chrono::seconds>(at.time_since_epoch()).count()},
              {"cpuCount", cpu_count},
              {"cpuUsedPct", cpu_used_pct},
              {"memUsed", mem_used},
              {"memTotal", mem_total},
              {"memCache", mem_cache},
              {"diskUsed", disk_used},
              {"diskTotal", disk_total}};
}

json SnapshotRecord::to_json() const {
  return json{{"snapshotID", id}, {"names", names}};
}

Result<SnapshotRecord> SandboxRegistry::snapshot(const Caller& caller, const std::string& id,
                                                 const std::string& name) {
  Sandbox s;
  {
    MutexLock lock(mu_);
    CELLGATE_ASSIGN_OR_RETURN(s, visible_locked(caller, id));
  }
  if (options_.disk_limit != nullptr && !caller.sees_all) {
    // Its image: at most the kernel's memory (CRIU writes anonymous memory), and its work files.
    std::uint64_t estimate = work_dir_bytes();
    if (auto kernel = kernels_.find(s.kernel_id)) {
      if (auto stats = (*kernel)->cgroup_stats()) {
        estimate = stats->memory_current_bytes + work_dir_bytes();
      }
    }
    CELLGATE_TRY(within_budget(caller, estimate));
  }
  if (s.state == State::kPaused) {
    CELLGATE_TRY(kernels_.resume(s.kernel_id));  // a snapshot is of a running kernel
  }
  auto taken = when_idle<kernels::SnapshotModel>([&] { return kernels_.snapshot(s.kernel_id); });
  if (!taken) {
    return checkpoint_refused(taken.error(), id, "snapshotted");
  }
  SnapshotRecord r;
  r.id = taken->id;
  r.tenant = s.tenant;
  r.sandbox_id = id;
  if (!name.empty()) {
    r.names.push_back(name);
  }
  MutexLock lock(mu_);
  r.seq = ++seq_;
  snapshots_[r.id] = r;
  save_snapshots_locked();
  emit("snapshotted", s);
  spdlog::info("sandbox {}: snapshot {} taken", id, r.id);
  return r;
}

std::vector<SnapshotRecord> SandboxRegistry::snapshots(const Caller& caller) const {
  std::set<std::string> live;
  for (const auto& snap : kernels_.snapshots()) {
    live.insert(snap.id);
  }
  MutexLock lock(mu_);
  std::vector<SnapshotRecord> out;
  for (const auto& [id, s] : snapshots_) {
    if (caller.can_see(s.tenant) && live.count(id) != 0) {
      out.push_back(s);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const SnapshotRecord& a, const SnapshotRecord& b) { return a.seq > b.seq; });
  return out;
}

Result<void> SandboxRegistry::delete_snapshot(const Caller& caller,
                                              const std::string& snapshot_id) {
  {
    MutexLock lock(mu_);
    auto it = snapshots_.find(snapshot_id);
    if (it == snapshots_.end() || !caller.can_see(it->second.tenant)) {
      return no_snapshot(snapshot_id);
    }
  }
  auto removed = kernels_.delete_snapshot(snapshot_id);
  MutexLock lock(mu_);
  snapshots_.erase(snapshot_id);
  save_snapshots_locked();
  if (!removed && removed.error().code != ErrorCode::kNotFound) {
    return removed;
  }
  return ok_result();
}

Result<std::vector<Result<Sandbox>>> SandboxRegistry::fork(const Caller& caller,
                                                           const std::string& id,
                                                           const ForkRequest& request) {
  Sandbox s;
  {
    MutexLock lock(mu_);
    CELLGATE_ASSIGN_OR_RETURN(s, visible_locked(caller, id));
  }
  CELLGATE_TRY(within_budget(
      caller, work_dir_bytes() * static_cast<std::uint64_t>(std::max(0, request.count))));
  // Every copy counts against the tenant's limit.
  if (options_.max_per_tenant != 0 && !caller.sees_all) {
    MutexLock lock(mu_);
    const auto mine = std::count_if(entries_.begin(), entries_.end(), [&](const auto& e) {
      return e.second.sandbox.tenant == caller.tenant;
    });
    if (static_cast<std::size_t>(mine) + static_cast<std::size_t>(request.count) >
        options_.max_per_tenant) {
      return make_error(ErrorCode::kResourceExhausted, "tenant_limit",
                        "forking " + std::to_string(request.count) +
                            " would pass the maximum number of concurrent sandboxes (" +
                            std::to_string(options_.max_per_tenant) + ")");
    }
  }
  auto copies = when_idle<std::vector<kernels::KernelModel>>(
      [&] { return kernels_.fork(s.kernel_id, request.count); });
  if (!copies) {
    return checkpoint_refused(copies.error(), id, "forked");
  }
  CreateRequest like;
  like.timeout_seconds = request.timeout_seconds;
  like.secure = !s.envd_access_token.empty();
  like.metadata = s.metadata;
  like.auto_pause = s.on_timeout == OnTimeout::kPause;
  like.auto_resume = s.auto_resume;
  std::vector<Result<Sandbox>> out;
  for (const auto& model : *copies) {
    // The copy's environment is its source's (in the image): nothing to set up again.
    auto copy = adopt_kernel(caller, model.id, s.template_id, s.alias, like, false);
    if (copy) {
      MutexLock lock(mu_);
      auto& stored = entries_.at(copy->id).sandbox;
      stored.env_vars = s.env_vars;
      stored.tenant = s.tenant;
      note_owner(stored);
      save_locked(stored);
      copy->env_vars = s.env_vars;
      copy->tenant = s.tenant;
    }
    out.push_back(std::move(copy));
  }
  return out;
}

Result<std::vector<Metric>> SandboxRegistry::metrics(const Caller& caller, const std::string& id,
                                                     std::optional<SystemTime> start,
                                                     std::optional<SystemTime> end) {
  bool empty = false;
  {
    MutexLock lock(mu_);
    if (auto s = visible_locked(caller, id); !s) {
      return std::move(s).error();
    }
    empty = entries_.at(id).metrics.empty();
  }
  if (empty) {
    sample_metrics();  // a sandbox younger than one interval has one sample at least
  }
  MutexLock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    return make_error(ErrorCode::kNotFound, "no_sandbox", "sandbox " + id + " not found");
  }
  std::vector<Metric> out;
  for (const auto& m : it->second.metrics) {
    // Whole seconds, as the SDK asks (Math.round of its dates).
    const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(m.at);
    if ((start && secs < *start - std::chrono::seconds(1)) || (end && secs > *end)) {
      continue;
    }
    out.push_back(m);
  }
  return out;
}

void SandboxRegistry::sample_metrics() {
  struct Due {
    std::string id, kernel_id;
  };
  std::vector<Due> due;
  std::vector<std::string> gone;
  {
    MutexLock lock(mu_);
    for (const auto& [id, entry] : entries_) {
      due.push_back({id, entry.sandbox.kernel_id});
    }
  }
  for (const auto& d : due) {
    auto kernel = kernels_.find(d.kernel_id);
    if (!kernel) {
      gone.push_back(d.id);
      continue;
    }
    if ((*kernel)->model().hibernated) {
      continue;  // a paused sandbox uses nothing
    }
    Metric m;
    m.at = std::chrono::system_clock::now();
    const auto at = std::chrono::steady_clock::now();
    m.mem_total = static_cast<std::uint64_t>(options_.shape.memory_mb) << 20;
    auto stats = (*kernel)->cgroup_stats();
    if (stats) {
      m.mem_used = stats->memory_current_bytes;
    }
    struct statvfs vfs {};
    if (::statvfs((*kernel)->work_dir().c_str(), &vfs) == 0) {
      m.disk_total = static_cast<std::uint64_t>(vfs.f_blocks) * vfs.f_frsize;
      m.disk_used = m.disk_total - static_cast<std::uint64_t>(vfs.f_bfree) * vfs.f_frsize;
    }
    MutexLock lock(mu_);
    auto it = entries_.find(d.id);
    if (it == entries_.end()) {
      continue;
    }
    Entry& e = it->second;
    if (stats && stats->cpu_usage_known) {
      if (e.last_cpu_at.time_since_epoch().count() != 0 &&
          stats->cpu_usage_usec >= e.last_cpu_usec) {
        const double wall_us =
            std::chrono::duration<double, std::micro>(at - e.last_cpu_at).count();
        if (wall_us > 0) {
          m.cpu_used_pct = 100.0 * static_cast<double>(stats->cpu_usage_usec - e.last_cpu_usec) /
                           wall_us / std::max(1, options_.shape.cpu_count);
        }
      }
      e.last_cpu_usec = stats->cpu_usage_usec;
      e.last_cpu_at = at;
    }
    e.metrics.push_back(m);
    while (e.metrics.size() > std::max<std::size_t>(1, options_.metrics_kept)) {
      e.metrics.pop_front();
    }
  }
  for (const auto& id : gone) {
    spdlog::info("sandbox {}: its kernel is gone; the sandbox ends", id);
    end(id, false);
  }
}

void SandboxRegistry::schedule_sampler() {
  MutexLock lock(mu_);
  if (stopping_ || options_.metrics_interval.count() <= 0) {
    return;
  }
  sampler_ = strand_->at(util::Clock::now() + options_.metrics_interval, [this] {
    offload_([this] {
      sample_metrics();
      schedule_sampler();
    });
  });
}

}  // namespace cellgate::sandboxes
