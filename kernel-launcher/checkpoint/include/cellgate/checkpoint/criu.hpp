// CRIU, the program that checkpoints and restores a kernel's jail: found, checked once, and run.
//
//   const checkpoint::CriuSupport criu = checkpoint::probe_criu();   // once, at start
//   log(criu.describe());   // "checkpoints: CRIU 4.2.1 (/opt/cellgate/criu/sbin/criu)", or
//                           // "checkpoints unavailable: <reason>"
//   if (!criu.available) { refuse with criu.reason; }   // routes that need it: 501
//
// Which criu: $CELLGATE_CRIU when set, else `criu` on the PATH, else the private build that
// scripts/install-criu makes (kPrivateCriu); the first that is at least 4.2 (older ones cannot
// run on kernels >= 6.13, or cannot dump ipykernel's TCP listener on kernels >= 6.16). It must
// then pass `criu check`, which needs root.
//
// Thread-safety: functions without shared state. run_program() forks; between fork and exec the
// child makes only async-signal-safe calls, so a threaded caller (the gateway) may use it.
#pragma once

#include <string>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::checkpoint {

inline constexpr const char* kPrivateCriu = "/opt/cellgate/criu/sbin/criu";

struct CriuSupport {
  bool available = false;
  std::string path;     // the binary chosen ("" when none was found)
  std::string version;  // "4.2.1"
  std::string reason;   // why not available: what is missing and what to do
  // One line for the start-up log.
  std::string describe() const;
};

// Looks for criu as above and runs `criu check`. Takes ~50 ms when one is found.
CriuSupport probe_criu();

// The criu probe_criu() would choose, without `criu check` (for the launcher, whose gateway ran
// the check): its path, or why there is none.
Result<std::string> find_criu();

// "4.2.1" >= "4.2"? Numeric, component by component.
bool version_at_least(const std::string& version, int major, int minor);

// Runs `program args…` (criu, zstd) and waits for it. Its stdin is /dev/null; its stdout and stderr
// are captured (up to 64 KiB) into `output` when non-null, else go to ours. `keep_fds` are left
// open across the exec (for --inherit-fd); every other descriptor is close-on-exec or closed.
// Answers criu's waitpid status.
Result<int> run_program(const std::string& program, const std::vector<std::string>& args,
                        const std::vector<int>& keep_fds = {}, std::string* output = nullptr);

}  // namespace cellgate::checkpoint
