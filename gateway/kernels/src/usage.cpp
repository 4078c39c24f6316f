// A kernel's resource usage in the shape of ipykernel's usage_reply (jupyter-resource-usage's
// kernel panel asks for it with usage_request on the control channel), measured from outside:
// the kernel's cgroup (CPU, memory, and its limits) and the host's /proc. A jailed kernel's own
// psutil would see only its pid namespace; ipykernel 6.17 (Debian 12) does not answer at all.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <set>
#include <sstream>
#include <thread>

#include "cellgate/sys/file.hpp"
#include "registry_impl.hpp"

namespace cellgate::kernels {
namespace {

using nlohmann::json;

// /proc/stat's first line: all CPUs' busy and total jiffies.
std::pair<std::uint64_t, std::uint64_t> host_cpu_jiffies() {
  auto text = sys::read_file("/proc/stat", 1 << 20, "proc_stat");
  if (!text) {
    return {0, 0};
  }
  std::istringstream in(text->substr(0, text->find('\n')));
  std::string cpu;
  in >> cpu;
  std::uint64_t v = 0, total = 0, idle = 0;
  for (int i = 0; in >> v && i < 10; ++i) {
    total += v;
    if (i == 3 || i == 4) {  // idle, iowait
      idle += v;
    }
  }
  return {total - idle, total};
}

// psutil.virtual_memory()'s main fields, from /proc/meminfo.
json host_memory() {
  auto text = sys::read_file("/proc/meminfo", 1 << 20, "meminfo");
  std::uint64_t total = 0, available = 0, free = 0;
  if (text) {
    std::istringstream in(*text);
    std::string key;
    std::uint64_t kib = 0;
    std::string unit;
    while (in >> key >> kib) {
      std::getline(in, unit);
      if (key == "MemTotal:") {
        total = kib * 1024;
      } else if (key == "MemAvailable:") {
        available = kib * 1024;
      } else if (key == "MemFree:") {
        free = kib * 1024;
      }
    }
  }
  const double percent =
      total > 0 ? 100.0 * static_cast<double>(total - available) / static_cast<double>(total) : 0;
  return json{{"total", total},
              {"available", available},
              {"percent", std::round(percent * 10) / 10},
              {"used", total - available},
              {"free", free}};
}

}  // namespace

Result<json> KernelRegistry::Impl::usage(const std::string& id) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  const auto now = std::chrono::steady_clock::now();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  json reply{{"hostname", host}, {"cpu_count", std::max(1u, std::thread::hardware_concurrency())}};
  if (auto facts = k->process_facts()) {
    reply["pid"] = facts->pid;
  }
  // CPU as psutil's cpu_percent(): since the last ask (0.0 the first time), 100 per CPU.
  auto stats = k->cgroup_stats();
  MutexLock lock(usage_mu_);
  if (usage_samples_.size() > 2 * options_.max_kernels + 16) {  // samples of ended kernels go
    const auto live = snapshot();
    std::set<std::string> ids;
    for (const auto& kernel : live) {
      ids.insert(kernel->id());
    }
    std::erase_if(usage_samples_, [&](const auto& s) { return ids.count(s.first) == 0; });
  }
  if (stats) {
    reply["kernel_memory"] = stats->memory_current_bytes;
    double percent = 0;
    auto& last = usage_samples_[id];
    if (stats->cpu_usage_known && last.at.time_since_epoch().count() != 0) {
      const double wall_us = std::chrono::duration<double, std::micro>(now - last.at).count();
      if (wall_us > 0 && stats->cpu_usage_usec >= last.cpu_usec) {
        percent = 100.0 * static_cast<double>(stats->cpu_usage_usec - last.cpu_usec) / wall_us;
      }
    }
    last = {stats->cpu_usage_usec, now};
    reply["kernel_cpu"] = std::round(percent * 10) / 10;
  } else {
    reply["kernel_memory"] = 0;  // unjailed or hibernated: no cgroup to read
    reply["kernel_cpu"] = 0.0;
  }
  // cellgate's additions: the jail's limits, and where the figures came from.
  if (!options_.no_jail) {
    reply["kernel_memory_limit"] = options_.jail.memory_bytes;
    reply["kernel_cpu_limit"] = options_.jail.cpus;
  }
  reply["source"] = stats ? "cgroup" : "none";
  const auto [busy, total] = host_cpu_jiffies();
  if (host_cpu_.total != 0 && total > host_cpu_.total) {
    reply["host_cpu_percent"] = std::round(1000.0 * static_cast<double>(busy - host_cpu_.busy) /
                                           static_cast<double>(total - host_cpu_.total)) /
                                10;
  }
  host_cpu_ = {busy, total};
  reply["host_virtual_memory"] = host_memory();
  return reply;
}

Result<json> KernelRegistry::usage(const std::string& id) {
  return impl_->usage(id);
}

}  // namespace cellgate::kernels
