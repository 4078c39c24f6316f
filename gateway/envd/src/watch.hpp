// Internal: one filesystem.Filesystem/WatchDir stream. The watcher is the filesystem program's
// `watch` operation (filesystem.cpp: inotify through ctypes) run in the sandbox's jail as the
// kernel's uid; it prints one JSON line per message, and a thread of this stream's own turns
// the lines into the stream's envelopes:
//
//   auto w = std::make_shared<DirWatch>(std::move(hooks));
//   w->run(target, request, std::move(req), std::move(watcher));   // the thread starts
//   w->stop();                                                      // kills it, waits
//
// Bounded: a line is at most kMaxLine bytes (a longer one ends the stream), at most
// kMaxEventsPerSecond events are sent a second, and the thread stops reading while the client
// has more than kHighWater bytes unsent; what waits meanwhile waits in the pipe, then in the
// kernel's inotify queue, whose overflow ends the stream with resource_exhausted. The stream's
// end — the client gone, Connect-Timeout-Ms, stop() — kills the watcher (its JailCommand); a
// sandbox that is gone cuts the stream, as E2B's envd's streams are cut when its VM dies.
//
// Thread-safety: stop() may be called from any thread; run() once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>

#include "cellgate/http/message.hpp"
#include "cellgate/kernel/jail_command.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/unique_fd.hpp"
#include "process.hpp"

namespace cellgate::envd {

class DirWatch;

struct WatchHooks {
  std::function<bool()> sandbox_alive;
  std::function<void(DirWatch*)> on_finished;  // once, from the stream's thread, at its end
};

class DirWatch : public std::enable_shared_from_this<DirWatch> {
 public:
  static constexpr std::size_t kMaxLine = 256u << 10;
  static constexpr int kMaxEventsPerSecond = 2000;
  static constexpr std::size_t kHighWater = 1u << 20;

  explicit DirWatch(WatchHooks hooks);
  DirWatch(const DirWatch&) = delete;
  DirWatch& operator=(const DirWatch&) = delete;

  // Starts the stream's thread: it enters the jail, starts the watcher and serves the stream.
  void run(std::function<Result<kernel::JailTarget>()> target, kernel::CommandRequest request,
           http::Request req, Watcher watcher);
  void stop();

 private:
  void serve(const std::function<Result<kernel::JailTarget>()>& target,
             const kernel::CommandRequest& request, const http::Request& req, Watcher& watcher);

  const WatchHooks hooks_;
  UniqueFd wake_fd_;
  std::atomic<bool> stopping_{false};
  Mutex done_mu_;
  std::condition_variable_any done_cv_;
  bool done_ CELLGATE_GUARDED_BY(done_mu_) = false;
};

}  // namespace cellgate::envd
