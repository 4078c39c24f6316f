// Internal: one process envd runs in a sandbox (a kernel::JailCommand), the streams that watch
// it, and the thread that pumps its output to them.
//
//   auto p = Process::create(std::move(cmd), config, stdin_open, hooks);
//   p->attach(stream);         // before run()
//   p->run();                  // the pump thread starts        // {"start": {pid}} first, then
//   data, keepalives, the end p->send_input(bytes, /*pty=*/false);
//
// Bounded: the pump reads at most 32 KiB at a time and stops reading (the command then blocks on
// its pipe: back-pressure) while any watching stream has more than kHighWater bytes unsent to its
// client. With no stream watching, output is read and dropped (counted). When the command ends
// each stream gets {"end": …} and the end of the stream — unless the sandbox itself is gone
// (hooks.sandbox_alive() false), then the streams are cut, as E2B's envd's are when it dies.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/envd/connect.hpp"
#include "cellgate/http/message.hpp"
#include "cellgate/kernel/jail_command.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::envd {

// What the process was started with, as List answers it (envd's ProcessConfig).
struct ProcessConfig {
  std::string cmd;
  std::vector<std::string> args;
  std::map<std::string, std::string> envs;
  std::string cwd;
  std::string tag;
};

// One client's server-streaming response watching a process.
struct Watcher {
  std::shared_ptr<http::Exchange> exchange;
  std::chrono::seconds keepalive{50};
  std::optional<std::chrono::steady_clock::time_point> deadline;  // Connect-Timeout-Ms
  std::chrono::steady_clock::time_point next_keepalive{};
};

// Connect-Timeout-Ms (0 or absent: none) and Keepalive-Ping-Interval (seconds; 50 by default)
// of a streaming request (envd_api.cpp).
void stream_timing(const http::Request& req, Watcher& w);

struct ProcessHooks {
  // Whether the sandbox still runs (checked when the command ends: a stream is cut if not).
  std::function<bool()> sandbox_alive;
  // Called once from the pump thread when the process is over and its streams are done.
  std::function<void()> on_finished;
};

class Process : public std::enable_shared_from_this<Process> {
 public:
  static constexpr std::size_t kHighWater = 1u << 20;

  // The process of a started command; run() starts its pump (after the first watcher is
  // attached, so that it sees the start event before any output).
  static std::shared_ptr<Process> create(std::unique_ptr<kernel::JailCommand> command,
                                         ProcessConfig config, bool stdin_open, ProcessHooks hooks);
  void run();
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const ProcessConfig& config() const { return config_; }
  bool pty() const { return pty_; }

  // Sends {"start": {pid}} on the stream and watches from then on; false once it has ended.
  bool attach(Watcher watcher);
  Result<void> send_input(const std::string& bytes, bool to_pty);
  Result<void> close_stdin();
  Result<void> signal(int sig);
  Result<void> resize(kernel::PtySize size);
  // Kills the command and waits for the pump to finish (the gateway's shutdown).
  void stop();

 private:
  Process(std::unique_ptr<kernel::JailCommand> command, ProcessConfig config, ProcessHooks hooks);
  void pump();
  // Sends one event to every watcher; drops those whose client is gone or whose deadline passed.
  void broadcast(const nlohmann::json& event) CELLGATE_REQUIRES(mu_);
  void finish(const nlohmann::json& end_event);
  void wake();

  const ProcessConfig config_;
  const ProcessHooks hooks_;
  pid_t pid_ = -1;
  bool pty_ = false;
  UniqueFd wake_fd_;
  std::atomic<bool> stopping_{false};

  Mutex in_mu_;
  UniqueFd input_ CELLGATE_GUARDED_BY(in_mu_);  // a copy of stdin's pipe or the pty's master

  Mutex done_mu_;
  std::condition_variable_any done_cv_;
  bool done_ CELLGATE_GUARDED_BY(done_mu_) = false;

  mutable Mutex mu_;
  std::unique_ptr<kernel::JailCommand> command_ CELLGATE_GUARDED_BY(mu_);
  std::vector<Watcher> watchers_ CELLGATE_GUARDED_BY(mu_);
  bool ended_ CELLGATE_GUARDED_BY(mu_) = false;
  std::uint64_t dropped_bytes_ CELLGATE_GUARDED_BY(mu_) = 0;
};

}  // namespace cellgate::envd
