// Zygote: the gateway's handle on `cellgate-kernel --zygote` (kernel-launcher's zygote.hpp), the
// fork server python3 kernels are started from. It spawns the zygote with an empty environment,
// learns from its status fd when the preload is done, and restarts it with back-off (1 s doubling
// to 30 s) when it dies. Kernels already forked from a dead zygote run on: they never depended on
// it after their start.
//
//   kernel::Zygote zygote({.socket_path = state + "/run/zygote.sock", .log_file = …});
//   zygote.tick();                                  // from a periodic loop: reap, restart
//   request.zygote_socket = zygote.ready_socket();  // "" while none is ready: start cold
//
// Thread-safety: all members may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <string>
#include <vector>

#include "cellgate/mutex.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::kernel {

struct ZygoteOptions {
  std::string socket_path;
  std::string log_file;
  std::vector<std::string> preload;  // empty: the launcher's default list
  std::string launcher_path;         // "": cellgate-kernel beside the running binary
};

class Zygote {
 public:
  explicit Zygote(ZygoteOptions options);  // spawns the first zygote
  ~Zygote();                               // SIGTERM, then SIGKILL after 2 s; reaped
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  // The socket to pass to launchers while a zygote is ready, else "".
  std::string ready_socket();
  // Waits until a zygote is ready or `timeout` passes; false if none is ready by then.
  bool wait_ready(std::chrono::milliseconds timeout);
  // Reads its status, reaps it if it died, restarts it when its back-off has passed.
  void tick();
  // True once a zygote ended (or reported a setup error) without ever becoming ready.
  bool failed();
  pid_t pid();     // -1 while none runs
  int restarts();  // zygotes started after the first

 private:
  void spawn_locked() CELLGATE_REQUIRES(mu_);
  void read_status_locked() CELLGATE_REQUIRES(mu_);

  const ZygoteOptions options_;
  Mutex mu_;
  std::condition_variable_any ready_cv_;
  pid_t pid_ CELLGATE_GUARDED_BY(mu_) = -1;
  bool ready_ CELLGATE_GUARDED_BY(mu_) = false;
  bool failed_ CELLGATE_GUARDED_BY(mu_) = false;
  int restarts_ CELLGATE_GUARDED_BY(mu_) = 0;
  std::chrono::milliseconds backoff_ CELLGATE_GUARDED_BY(mu_){1000};
  std::chrono::steady_clock::time_point next_start_ CELLGATE_GUARDED_BY(mu_){};
  UniqueFd status_fd_ CELLGATE_GUARDED_BY(mu_);
  std::string status_buffer_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace cellgate::kernel
