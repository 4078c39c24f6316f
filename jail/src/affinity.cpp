// The CPUs a kernel is shown: as many as its quota rounds up to (jail.hpp, "cpu affinity").
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <string>
#include <vector>

#include "cellgate/jail/jail.hpp"

namespace cellgate::jail {
namespace {

// The CPUs the calling process may run on (its cpuset, narrowed by any affinity it inherited).
Result<cpu_set_t> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) {
    return errno_error(ErrorCode::kInternal, "affinity", "sched_getaffinity(0)", errno);
  }
  return set;
}

int quota_cpus(double cpus) {
  // A quota of 0.2 is still a whole CPU to schedule on; 1.0 is one, not two (float noise).
  return std::max(1, static_cast<int>(std::ceil(cpus - 1e-6)));
}

}  // namespace

int kernel_cpu_count(double cpus) {
  auto allowed = allowed_cpus();
  const int have = allowed ? CPU_COUNT(&allowed.value()) : 0;
  return have > 0 ? std::min(quota_cpus(cpus), have) : quota_cpus(cpus);
}

Result<void> limit_cpu_affinity(double cpus, unsigned spread) {
  CELLGATE_ASSIGN_OR_RETURN(const cpu_set_t allowed, allowed_cpus());
  const int have = CPU_COUNT(&allowed);
  const int want = quota_cpus(cpus);
  if (want >= have) {
    return {};
  }
  std::vector<int> ids;
  for (int cpu = 0; cpu < CPU_SETSIZE && static_cast<int>(ids.size()) < have; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) {
      ids.push_back(cpu);
    }
  }
  // Consecutive kernels (consecutive uids) start on different CPUs, so 1-CPU kernels spread over
  // the machine instead of all sharing the first one.
  cpu_set_t chosen;
  CPU_ZERO(&chosen);
  std::string names;
  for (int i = 0; i < want; ++i) {
    const int cpu = ids[(spread + static_cast<unsigned>(i)) % ids.size()];
    CPU_SET(cpu, &chosen);
    names += (names.empty() ? "" : ",") + std::to_string(cpu);
  }
  if (::sched_setaffinity(0, sizeof chosen, &chosen) != 0) {
    return errno_error(ErrorCode::kInternal, "affinity", "sched_setaffinity(0, {" + names + "})",
                       errno);
  }
  return {};
}

}  // namespace cellgate::jail
