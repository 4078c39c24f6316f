// Internal: pid 1 of a jail, the same in both launch modes, and the pipe it reports on.
//
//   exec mode    launcher ─clone→ init (exec_mode.cpp) ─start_kernel→ kernel (execve)
//                                 init runs reap_kernel() in place
//   zygote mode  zygote ─clone→ init (zygote_server.cpp) ─start_kernel→ kernel (Python)
//                                 init execs the static cellgate-reaper (reaper.cpp), whose main
//                                 is reap_kernel(): a copy of the zygote as pid 1 would hold
//                                 megabytes per kernel
//
// The report pipe (init → launcher) carries lines, written by the functions below and read only
// by InitReport:
//   "R"                the kernel got through its setup steps (it exec'd, or entered Python)
//   "E<text>"          a setup step failed, in init or in the kernel; init exits 127
//   "X<wait status>"   the kernel ended: waitpid()'s status, decimal
// The go pipe (launcher → init) carries one byte, "G", once the launcher has put init into the
// kernel's cgroup; in zygote mode the launcher keeps its end open and the reaper takes its EOF
// as the launcher's death (exec mode's init has a parent-death signal instead).
//
// Nothing here links the jail: cellgate-reaper is a static binary and links only this file.
// The reaper's path (reap_kernel, report_exit) does not touch the heap.
//
// Thread-safety: single-threaded processes.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::launcher::init {

// Forwarded by init (and by the launcher to init) to the kernel.
inline constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// The forwarded signals and SIGCHLD. Blocked before the jail is cloned and kept blocked across
// the reaper's exec, so a signal sent before the reaper listens is not lost.
sigset_t reaper_signals();

// ---- pid 1's side ----

// Writes "E<message>" and ends the process with 127. `fd` is the report pipe, or a kernel's
// setup pipe (init passes the line on).
[[noreturn]] void fail(int fd, std::string_view message);

// Forks the kernel. The child closes the read end of a setup pipe and runs
// `kernel_main(setup_fd)`, which never returns: it execs (the pipe is close-on-exec, so its EOF
// says the steps passed) or calls fail(setup_fd, …). Init waits for that EOF, then writes "R"
// and returns the kernel's pid, or passes the "E" line on and exits 127. A caller that embeds
// Python calls PyOS_BeforeFork() first (and the child PyOS_AfterFork_Child()).
pid_t start_kernel(int report_fd, const std::function<void(int setup_fd)>& kernel_main);

// pid 1's loop once the kernel runs: forwards kForwardedSignals to it, reaps every orphan (they
// are ours as pid 1) and writes "X<status>" when the kernel ends. Expects reaper_signals()
// blocked. Returns init's exit code: 0 once the kernel ended (pid 1 leaving kills whatever is
// left in the namespace), 137 when `go_fd` (>= 0) reads EOF — the launcher is gone, and the
// kernel goes with us — or 127 when signalfd() fails (the kernel is killed).
int reap_kernel(pid_t kernel, int report_fd, int go_fd);

// "X<wait status>\n" without the heap.
void report_exit(int report_fd, int wait_status);

// ---- the launcher's side ----

// One line of the report pipe, without its newline.
struct InitLine {
  enum class Kind { kReady, kError, kExit, kEnd, kUnknown };
  Kind kind = Kind::kUnknown;
  std::string text;     // kError: the failure
  int wait_status = 0;  // kExit
};
InitLine parse_line(std::string_view line);

// The read end of the report pipe, read in blocking calls.
class InitReport {
 public:
  explicit InitReport(UniqueFd read_end) : fd_(std::move(read_end)) {}

  // The first line: ok on "R"; an error with the text of "E<text>", or `ended` when the pipe
  // closed (or said something else) first.
  Result<void> wait_ready(const std::string& ended);

  // The kernel's wait status from the "X" line, reading to EOF: call once pid 1 has ended.
  // nullopt when it wrote none (it was killed).
  std::optional<int> kernel_status();

 private:
  InitLine next();  // kEnd at EOF

  UniqueFd fd_;
  std::string buffer_;
};

}  // namespace cellgate::launcher::init
