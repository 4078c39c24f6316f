// Landlock: one more wall inside the jail's mount namespace. After pivot_root the kernel may
// read (and execute) the system it needs and write only its scratch space; every other path of
// the new root, writable mount or not, refuses it with EACCES. A bug that makes a mount
// writable, or a file the jail binds by mistake, is then still not the kernel's to touch.
//
// The policy is a table (landlock_policy()), a path and its rights per row with the reason; the
// "landlock" step of contain_kernel() applies it after no_new_privs and before seccomp:
//
//   CELLGATE_ASSIGN_OR_RETURN(int abi, apply_landlock(spec));   // 0: skipped (optional, absent)
//
// ABI: the rights handled are every filesystem right the running kernel's ABI knows (1: the 13
// basic ones, 2: +REFER, 3: +TRUNCATE, 5: +IOCTL_DEV), so a right we do not name is denied too;
// the rows' rights are masked to that set (the kernel docs' "best effort" pattern).
//
// Fail closed: without Landlock (not built in, or not in the boot's lsm= list) the step fails
// with a message saying so, unless the spec lists "landlock" in `optional`; then it warns on
// stderr and the kernel runs without this layer.
//
// Thread-safety: apply_landlock() restricts the calling thread (and what it later forks or
// execs); call it from the single-threaded kernel process, like the other contain_kernel() steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cellgate/jail/spec.hpp"
#include "cellgate/result.hpp"

namespace cellgate::jail {

struct LandlockRule {
  std::string path;      // inside the jail; a row whose path does not exist is skipped
  std::uint64_t access;  // LANDLOCK_ACCESS_FS_* bits, before masking to the ABI
  std::string reason;
};

// The rows for this spec: /usr and the top-level links into it, /etc, system_binds, /proc, /sys,
// /dev, the connection dir, the work dir, /tmp, /dev/shm and the spec's own binds.
std::vector<LandlockRule> landlock_policy(const JailSpec& spec);

// The running kernel's Landlock ABI version, 0 when it has none.
int landlock_abi();

// Applies landlock_policy(spec) to the calling process. Returns the ABI applied, or 0 when
// Landlock is absent and "landlock" is optional (a warning went to stderr). Needs no_new_privs.
Result<int> apply_landlock(const JailSpec& spec);

}  // namespace cellgate::jail
