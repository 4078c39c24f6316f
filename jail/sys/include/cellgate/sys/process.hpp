// Processes by pidfd (pidfd_open(2), Linux 5.3): a pid that cannot be recycled under us, and a
// descriptor that becomes readable when the process ends, so an event loop can poll for exits.
//
//   CELLGATE_ASSIGN_OR_RETURN(sys::Child child, sys::Child::fork([] { execv(...); return 127; }));
//   CELLGATE_ASSIGN_OR_RETURN(int status, child.wait());               // a waitpid(2) status
//   child.terminate(std::chrono::seconds(2));   // SIGTERM, then SIGKILL after the grace; reaps
//
// A Child owns a child of this process: its destructor kills (SIGKILL) and reaps it unless it
// was waited for or released. A PidFd refers to any process and reaps nothing.
//
// Thread-safety: values; one owner at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>

#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::sys {

class PidFd {
 public:
  PidFd() = default;
  // pidfd_open(pid, 0).
  static Result<PidFd> open(pid_t pid);

  int get() const { return fd_.get(); }
  pid_t pid() const { return pid_; }
  explicit operator bool() const { return static_cast<bool>(fd_); }

  // pidfd_send_signal(2): ESRCH once the process has ended, never another process.
  Result<void> signal(int sig) const;
  // Whether the process has ended (the pidfd polls readable), waiting up to `timeout`.
  bool wait_readable(std::chrono::milliseconds timeout) const;

 private:
  PidFd(UniqueFd fd, pid_t pid) : fd_(std::move(fd)), pid_(pid) {}
  UniqueFd fd_;
  pid_t pid_ = -1;
};

class Child {
 public:
  Child() = default;
  ~Child();
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // fork(2); the child runs `body` and _exits with its return value. Only async-signal-safe work
  // belongs in `body` when the parent has threads.
  static Result<Child> fork(const std::function<int()>& body);
  // A child this process already has (from clone(2) or posix_spawn(3)).
  static Result<Child> adopt(pid_t pid);

  pid_t pid() const { return pidfd_.pid(); }
  const PidFd& pidfd() const { return pidfd_; }
  bool running() const { return !status_ && pidfd_; }

  // Reaps the child if it has ended (WNOHANG); its waitpid(2) status once it has.
  std::optional<int> poll();
  // Blocks until the child ends and reaps it; the waitpid(2) status (cached: a second call
  // answers the same).
  Result<int> wait();
  // SIGTERM, up to `grace` for it to end, then SIGKILL; reaps it and answers its status.
  Result<int> terminate(std::chrono::milliseconds grace);
  // Gives up ownership: the destructor no longer kills or reaps it.
  pid_t release();

 private:
  explicit Child(PidFd pidfd) : pidfd_(std::move(pidfd)) {}
  PidFd pidfd_;
  std::optional<int> status_;
};

}  // namespace cellgate::sys
