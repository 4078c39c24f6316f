// JailCommand: one command run inside a running kernel's jail, through `cellgate-kernel
// --exec-into` (kernel-launcher/src/exec_into.cpp, jail/enter.hpp): the kernel's namespaces,
// cgroup, uid, seccomp, Landlock and rlimits, its environment plus the caller's. The gateway
// never forks: it spawns the launcher, whose stdio are the command's pipes (or /dev/null with a
// pty, whose master comes back on the control socket).
//
//   CELLGATE_ASSIGN_OR_RETURN(auto target, process.jail_target());
//   CELLGATE_ASSIGN_OR_RETURN(auto cmd, JailCommand::start(target, {.argv = {"/bin/sh", "-c",
//                                                                   "echo hi"}}));
//   poll cmd->stdout_fd(), cmd->stderr_fd() and cmd->control_fd();
//   when control_fd() is readable: if (auto ended = cmd->read_control()) { … ended->exit_code … }
//
// The destructor closes the control socket (the launcher then kills the command if it still
// runs) and reaps the launcher. Ending the kernel ends every command in its jail: they are in its
// pid namespace and cgroup.
//
// Thread-safety: not thread-safe; one owner (descriptors may be polled from the owner's thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/kernel/kernel.hpp"
#include "cellgate/launcher/status.hpp"
#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::kernel {

struct PtySize {
  int cols = 80;
  int rows = 24;
};

struct CommandRequest {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // NAME=VALUE, on top of the kernel's environment
  std::string cwd;               // in the jail; "" = the kernel's work dir
  std::optional<PtySize> pty;    // a terminal of the jail's devpts instead of three pipes
  std::chrono::milliseconds start_timeout{10000};
};

class JailCommand {
 public:
  static Result<std::unique_ptr<JailCommand>> start(const JailTarget& target,
                                                    const CommandRequest& request);
  ~JailCommand();
  JailCommand(const JailCommand&) = delete;
  JailCommand& operator=(const JailCommand&) = delete;

  pid_t pid() const { return pid_; }  // in the jail's pid namespace
  bool pty() const { return static_cast<bool>(pty_); }
  // -1 when there is none (with a pty, only pty_fd(); after close_stdin(), no stdin).
  int stdin_fd() const { return stdin_.get(); }
  int stdout_fd() const { return stdout_.get(); }
  int stderr_fd() const { return stderr_.get(); }
  int pty_fd() const { return pty_.get(); }
  int control_fd() const { return control_.get(); }

  void close_stdin() { stdin_.reset(); }
  // Closes our end of stdout or stderr (its EOF was read).
  void close_output(int fd);
  // Sent to the command (through its pidfd, by the launcher); fails once it has ended.
  Result<void> signal(int sig);
  // TIOCSWINSZ on the pty's master (the command gets SIGWINCH).
  Result<void> resize(PtySize size);
  // Reads what the launcher reported (call when control_fd() is readable): its "exited" event
  // once it came, also when the launcher is gone without one (then reason signaled, SIGKILL).
  std::optional<launcher::StatusEvent> read_control();
  const std::optional<launcher::StatusEvent>& exited() const { return exited_; }

 private:
  JailCommand() = default;

  pid_t launcher_ = -1;
  pid_t pid_ = -1;
  UniqueFd control_;
  UniqueFd stdin_, stdout_, stderr_, pty_;
  std::optional<launcher::StatusEvent> exited_;
};

}  // namespace cellgate::kernel
