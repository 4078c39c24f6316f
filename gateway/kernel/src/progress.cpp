#include "cellgate/kernel/progress.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "cellgate/sys/proc.hpp"

namespace cellgate::kernel {
namespace {

using Clock = std::chrono::steady_clock;

class Probe {
 public:
  explicit Probe(AdoptionFacts facts) : facts_(std::move(facts)) {}

  Progress operator()() {
    using State = Progress::State;
    const auto now = Clock::now();
    const auto proc = sys::read_proc_stat(facts_.kernel_pid);
    if (!proc || proc->state == 'Z' || proc->state == 'X' ||
        (!start_time_.empty() && proc->start_time != start_time_)) {
      return {State::kGone, "its process (pid " + std::to_string(facts_.kernel_pid) + ") is gone"};
    }
    // Its state says nothing more: a jailed kernel's pid is its jail's pid 1, which waits for
    // the kernel; the CPU its cgroup uses is what tells a busy kernel from a hung one.
    start_time_ = proc->start_time;
    std::uint64_t usage = proc->cpu_usec();
    std::uint64_t throttled = 0;
    std::string what = "its process";
    if (!facts_.cgroup_paths.empty()) {
      auto stats = jail::read_cgroup_stats(
          facts_.cgroup_version == "v2" ? jail::CgroupVersion::kV2 : jail::CgroupVersion::kV1,
          facts_.cgroup_paths);
      if (!stats) {
        if (stats.error().code == ErrorCode::kNotFound) {
          return {State::kGone, "its cgroup is gone"};
        }
        // Unreadable for another reason: judge by the process alone.
      } else {
        what = "its cgroup";
        usage = stats->cpu_usage_usec;
        throttled = stats->cpu_nr_throttled;
      }
    }
    const bool first = !have_sample_;
    const auto elapsed_usec =
        std::chrono::duration_cast<std::chrono::microseconds>(now - sampled_at_).count();
    const std::uint64_t used = usage >= usage_ ? usage - usage_ : 0;
    const std::uint64_t throttled_more = throttled >= throttled_ ? throttled - throttled_ : 0;
    have_sample_ = true;
    sampled_at_ = now;
    usage_ = usage;
    throttled_ = throttled;
    if (first) {
      return {State::kRunning, "its process is alive (first look at its CPU use)"};
    }
    std::string why = what + " used " + std::to_string(used / 1000) + " ms of CPU in " +
                      std::to_string(elapsed_usec / 1000) + " ms";
    if (throttled_more > 0) {
      why += ", held at its CPU quota in " + std::to_string(throttled_more) + " periods";
    }
    // 1% of one CPU: an idle ipykernel's own threads use less; a kernel starved at its quota
    // still gets its share, and a throttled period means work was waiting to run.
    const bool running =
        throttled_more > 0 ||
        used * 100 >= static_cast<std::uint64_t>(std::max<long long>(elapsed_usec, 0));
    return {running ? State::kRunning : State::kStalled, why};
  }

 private:
  AdoptionFacts facts_;
  std::string start_time_;
  bool have_sample_ = false;
  Clock::time_point sampled_at_{};
  std::uint64_t usage_ = 0;
  std::uint64_t throttled_ = 0;
};

}  // namespace

std::function<Progress()> progress_probe(const KernelProcessHandle& process) {
  auto facts = process.adoption_facts();
  if (!facts || facts->kernel_pid <= 0) {
    return nullptr;
  }
  return Probe(std::move(*facts));
}

}  // namespace cellgate::kernel
