// Resource limits for the kernel process (inherited by everything it starts).
#include <sys/resource.h>

#include <cerrno>
#include <string>

#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/userns.hpp"

namespace cellgate::jail {

Result<void> apply_rlimits(const JailSpec& spec) {
  struct Limit {
    int resource;
    const char* name;
    rlim_t value;
  };
  const Limit limits[] = {
      {RLIMIT_CORE, "RLIMIT_CORE", 0},  // no core files in the work dir
      {RLIMIT_NOFILE, "RLIMIT_NOFILE", spec.nofile},
      {RLIMIT_FSIZE, "RLIMIT_FSIZE", spec.fsize_bytes},
      {RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK", spec.memlock_bytes},
      // Per real uid, host-wide; the uid is this kernel's alone, so it only bounds this kernel.
      {RLIMIT_NPROC, "RLIMIT_NPROC", static_cast<rlim_t>(spec.pids)},
      {RLIMIT_RTPRIO, "RLIMIT_RTPRIO", 0},
      {RLIMIT_MSGQUEUE, "RLIMIT_MSGQUEUE", 64 << 10},
      {RLIMIT_SIGPENDING, "RLIMIT_SIGPENDING", 4096},
  };
  // Rootless (userns.hpp): every kernel, the zygote and the gateway share the user's one uid, so
  // a per-uid count of processes would starve them all; the pids cgroup bounds each kernel.
  const bool shared_uid = in_single_uid_user_namespace();
  for (const auto& l : limits) {
    if (shared_uid && l.resource == RLIMIT_NPROC) {
      continue;
    }
    rlimit r{l.value, l.value};
    if (::setrlimit(l.resource, &r) != 0) {
      return errno_error(ErrorCode::kInternal, "rlimit",
                         std::string("setrlimit(") + l.name + ", " + std::to_string(l.value) + ")",
                         errno);
    }
  }
  return {};
}

}  // namespace cellgate::jail
