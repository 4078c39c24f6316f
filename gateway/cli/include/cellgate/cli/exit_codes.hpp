// The exit codes of cellgate's one-shot commands: `cellgate exec` (local and --url) and
// `cellgate run`. Scripts and CI depend on them; docs/run.md and `cellgate exec --help` list them.
//
//   return status == "ok" ? cli::kExitOk : cli::kExitCellError;
//
// Thread-safety: constants.
#pragma once

namespace cellgate::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCellError = 1;  // exec: the cell raised; run: a notebook failed
inline constexpr int kExitUsage = 2;      // bad options, an unreachable gateway, invalid input
inline constexpr int kExitKernelDied = 3;
inline constexpr int kExitTimeout = 124;      // as timeout(1)
inline constexpr int kExitInterrupted = 130;  // 128 + SIGINT, as a shell reports Ctrl-C

}  // namespace cellgate::cli
