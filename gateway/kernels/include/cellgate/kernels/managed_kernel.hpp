// ManagedKernel: one live kernel as the gateway keeps it — its state, its process and connection,
// and the listeners (WebSockets) attached to it.
//
// Its state is an explicit machine; every transition is a method that checks the current state
// under the kernel's mutex and fails (or does nothing) from any other:
//
//   starting ──started()──► idle ◄──iopub status──► busy
//      │                     │ ▲                      │
//      │          begin_restart() / died() (≤ limit)  │      died() past --restart-limit
//      │                     ▼ │ started()            ▼
//      │                 restarting ──restart_failed()──► dead ──begin_restart()──► restarting
//      └──────────── end() from any state ──────────────────────────────────────► gone
//
//   idle ──begin_hibernate()──► hibernated ──resumed()──► idle
//   starting ──adopted_hibernated()──┘ │ resume_failed() → dead; begin_restart() → restarting
//
// execution_state (the Jupyter model's string) is derived from it: starting, idle, busy,
// restarting, dead ("gone" reads as dead, "hibernated" as idle with the model's `hibernated`).
// A hibernated kernel has no connection; messages posted to it are queued (in order, up to
// kMaxQueuedWhileHibernated) and sent once it has resumed.
//
//   auto k = registry.find(id).value();
//   k->attach(listener, session_id);              // a WebSocket receives iopub and its replies
//   k->post(Channel::kShell, envelope, listener);  // a WebSocket's request
//   k->connection()->request(…);                   // the gateway's own requests (agents)
//
// Routing: iopub goes to every attached listener; shell, control and stdin messages that answer
// no request of the gateway go to the listener that sent a message with the same header.session
// (the parent's session). Only status messages are parsed (for execution_state); everything else
// is routed on its header and handed on as the same Envelope.
//
// Thread-safety: every method is thread-safe. on_iopub/on_unrouted run on the connection's I/O
// thread; listeners are called outside the kernel's lock and must only queue work.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/protocol/envelope.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::kernels {

class DeliveryRecord;

// A gateway-made iopub stream message (stderr) saying `count` messages (exactly, or at most) were
// lost before `next` (whose cell it is shown in; null: none); metadata.cellgate.lost_messages.
protocol::EnvelopePtr lost_notice(std::uint64_t count, bool exact,
                                  const protocol::EnvelopePtr& next);

// The clock idle times are measured on (last_activity, culling): util::Clock::now in the
// gateway, a clock the test moves in unit tests.
using Now = std::function<util::Clock::time_point()>;

enum class KernelState {
  kStarting,    // launched, not yet answering kernel_info; no client sees it yet
  kIdle,        // running; no tracked request in progress
  kBusy,        // running a request (iopub status busy)
  kRestarting,  // its process is being replaced (a client's restart, or after it died)
  kDead,        // died past --restart-limit, or a restart failed; `reason` says why
  kGone,        // shut down, culled or discarded: no process, listeners told
  kHibernated,  // checkpointed to disk (or being): no processes, no connection
};
const char* to_string(KernelState state);
// The Jupyter model's execution_state: "starting", "idle", "busy", "restarting", "dead".
const char* execution_state(KernelState state);

struct KernelModel {
  std::string id;
  std::string name;
  std::string last_activity;    // ISO 8601 UTC with microseconds and Z
  std::string execution_state;  // starting | idle | busy | restarting | dead
  int connections = 0;
  std::string reason;       // why it is dead, when it is
  bool hibernated = false;  // cellgate's addition, in the JSON only when true
  nlohmann::json to_json() const;
};

// A WebSocket (or anything else) that receives a kernel's messages.
class ChannelListener {
 public:
  virtual ~ChannelListener() = default;
  // A message for this listener (its channel is msg->channel()). Must not block.
  virtual void deliver(protocol::EnvelopePtr msg) = 0;
  // The kernel is gone (deleted, culled, or replaced by a newer connection with this listener's
  // session id): close with a normal closure.
  virtual void kernel_gone(const std::string& reason) = 0;
};

// The facts about a kernel's process that its state record keeps.
struct ProcessFacts {
  pid_t pid = -1;
  bool jailed = false;
  kernel::ConnectionInfo connection;
  std::string connection_file;
  std::optional<kernel::AdoptionFacts> adoption;  // how a restarted gateway finds it again
  static ProcessFacts of(const kernel::KernelProcessHandle& process);
};

class ManagedKernel {
 public:
  // A started kernel: its process and its connection.
  struct Running {
    std::unique_ptr<kernel::KernelProcessHandle> process;
    std::shared_ptr<kernel::KernelConnection> connection;
  };
  static constexpr std::size_t kMaxQueuedWhileHibernated = 1024;
  enum class AfterDeath {
    kRestart,  // now restarting: the caller replaces the process
    kDead,     // past the restart limit: now dead
    kIgnored,  // not running (restarting already, dead or gone): nothing changed
  };

  // A kernel in state starting. `home` is state_dir/kernels/<id> (its work dir lives there);
  // `env` is the client's env, already filtered.
  // `work_dir` "" is home/work; `shared_files`: the gateway is not root and cannot give files
  // to the kernel's uid (files_uid() is WorkDir::kSharedOwner).
  ManagedKernel(std::string id, kernel::KernelSpec spec, std::string home, uid_t uid,
                std::map<std::string, std::string> env, Now now, std::string work_dir = {},
                bool shared_files = false);
  ~ManagedKernel();  // stops the connection, then the process
  ManagedKernel(const ManagedKernel&) = delete;
  ManagedKernel& operator=(const ManagedKernel&) = delete;

  const std::string& id() const { return id_; }
  const kernel::KernelSpec& spec() const { return spec_; }
  const std::string& home() const { return home_; }
  // The kernel's work dir on the host (kept across restarts) and the uid/gid its files belong to.
  const std::string& work_dir() const { return work_dir_; }
  uid_t uid() const { return uid_; }
  // The owner the files API gives the files it writes in the work dir.
  uid_t files_uid() const { return shared_files_ ? static_cast<uid_t>(-1) : uid_; }
  const std::map<std::string, std::string>& env() const { return env_; }

  KernelState state() const;
  KernelModel model() const;
  std::string reason() const;
  int restarts() const;  // deaths since the last start or client restart
  // The last client message, kernel message, attach or start, on the injected clock.
  util::Clock::time_point last_activity() const;
  void touch();

  // ---- listeners ----
  // Attaches a listener for the client session `session_id` ("" when the client gave none). A
  // listener already attached with the same session id is replaced (jupyter_server does the
  // same) and told kernel_gone. Returns false when the kernel is gone.
  bool attach(const std::shared_ptr<ChannelListener>& listener, const std::string& session_id);
  void detach(const ChannelListener* listener);
  // Forwards a client's message as it is; replies to it go to `sender` (by header.session).
  // True when it was queued instead because the kernel is hibernated (the caller resumes it).
  Result<bool> post(kernel::Channel channel, protocol::EnvelopePtr msg,
                    const std::shared_ptr<ChannelListener>& sender);
  // Tells every listener a status the gateway decided ("restarting", "dead"), with the reason.
  void publish_status(const std::string& state, const std::string& reason = "");

  // ---- the running kernel ----
  // The connection for the gateway's own requests (agents, interrupts). Null while restarting.
  std::shared_ptr<kernel::KernelConnection> connection() const;
  // Its cgroup's CPU and memory figures; an error when unjailed or not running.
  Result<jail::CgroupStats> cgroup_stats() const;
  // Throttles its cgroup's CPU, or gives its own limit back (kernel::KernelProcessHandle).
  Result<void> throttle_cpu(bool throttled);
  // The running process's facts; nullopt without one.
  std::optional<ProcessFacts> process_facts() const;
  // How to run a command in the running kernel's jail (kernel::JailCommand); kUnavailable
  // when it is not running.
  Result<kernel::JailTarget> jail_target() const;
  // Interrupts the running cell as the kernelspec says: SIGINT ("signal"), or an
  // interrupt_request on control ("message"; blocks up to 5 s for the reply).
  Result<void> interrupt();
  // Waits up to `timeout` until the kernel's iopub shutdown_reply (ipykernel publishes one as it
  // exits after a shutdown_request) has been handed to every listener: a shutdown that waits
  // for it before end() lets clients see it, as jupyter_server's do. False on timeout.
  bool wait_shutdown_published(std::chrono::milliseconds timeout);
  // Why the running kernel has died ("" while it runs, or when it is not idle or busy): the
  // launcher's exit report, or lost heartbeats.
  std::string death_reason() const;

  // ---- what each session was sent (delivery_record.hpp; docs/kernel-gateway.md) ----
  // Keep the record in this file (state_dir/kernels/<id>/delivered); before the kernel is shared.
  void record_deliveries_in(std::string path);
  // A kernel's iopub message `msg` was written to the WebSocket of `session_id`.
  void delivered(const std::string& session_id, const protocol::Envelope& msg);
  // Adoption, before the connection starts: every session the record names (the most recent
  // kMaxOfflineSessions) is made absent, so what arrives live is kept for it; returns each one's
  // last delivered msg_id.
  std::map<std::string, std::string> expect_absent_sessions();
  // Adoption, once the launcher's spool is read: `spooled` (what the kernel published after that
  // session's last delivered message, as the launcher kept it) goes before what arrived live
  // meanwhile, the overlap once; `notice` (when some was lost) first.
  void add_spooled(const std::string& session_id, const std::vector<protocol::EnvelopePtr>& spooled,
                   const protocol::EnvelopePtr& notice);

  // ---- what the connection reports (kernel::ClientOptions) ----
  void on_iopub(const protocol::EnvelopePtr& msg);
  void on_unrouted(const protocol::EnvelopePtr& msg);

  // Held by whoever hibernates or resumes the kernel (the registry), so that concurrent
  // touches resume it once.
  Mutex& lifecycle() { return lifecycle_mu_; }

  // ---- transitions (the registry drives them) ----
  // starting | restarting → idle, with this process and connection. A client restart
  // (`client_restart`) also resets the restart count. Fails when the kernel is gone (the
  // process is then stopped).
  Result<void> started(Running running, bool client_restart = false);
  // idle | busy | dead → restarting (a client's restart). kFailedPrecondition when it is
  // starting or restarting already, kNotFound when gone.
  Result<void> begin_restart();
  // idle | busy → restarting while restarts ≤ restart_limit, else → dead; the reason is kept.
  AfterDeath died(const std::string& reason, int restart_limit);
  // restarting | starting → dead with `reason`.
  void restart_failed(const std::string& reason);
  // Takes the process and connection out and stops them (restarting only; the connection
  // first, joining its I/O thread, then the process, which ends the kernel and its cgroup).
  void stop_process();
  // Any state → gone: stops the process, detaches every listener. Returns what was running (for
  // a polite shutdown_request first; stop it by destroying it) and the listeners to tell.
  // Empty when already gone.
  struct Ended {
    Running running;
    std::vector<std::shared_ptr<ChannelListener>> listeners;
  };
  Ended end();

  // ---- hibernation (registry's hibernate.cpp, under lifecycle()) ----
  // idle → hibernated: takes out the process and connection (the caller closes the connection,
  // then checkpoints the process). kFailedPrecondition ("kernel_busy") when it is not idle.
  Result<Running> begin_hibernate();
  // The checkpointed process (it holds the runtime dir the restore reuses), kept while
  // hibernated; stopped at once when the kernel went meanwhile.
  void hibernated(std::unique_ptr<kernel::KernelProcessHandle> process);
  // starting → hibernated: a kernel a previous gateway hibernated, adopted with the handle that
  // restores it. Refused (the handle goes) from any other state.
  Result<void> adopted_hibernated(std::unique_ptr<kernel::KernelProcessHandle> process);
  // The kept process, for its restore; null when not hibernated.
  std::unique_ptr<kernel::KernelProcessHandle> take_hibernated();
  // hibernated → idle with this process and connection; the messages queued meanwhile are sent.
  Result<void> resumed(Running running);
  // hibernated → dead with `reason` (the restore failed).
  void resume_failed(const std::string& reason);
  // True once per hibernation, for the first caller that asks while it is hibernated: that one
  // has a resume started (a WebSocket's burst of messages asks a worker once, not per message).
  bool claim_resume();

 private:
  struct Queued {
    kernel::Channel channel;
    protocol::EnvelopePtr msg;
  };

  struct Attached {
    std::weak_ptr<ChannelListener> listener;
    std::string session_id;
  };

  // A client that left with a session id: what it misses until a connection with the same
  // session id comes back and gets it first, in order (jupyter_server's buffered offline
  // messages, bounded here): iopub, and the replies to its own requests. All of a kernel's
  // buffers share kOfflineBudgetBytes; past it the oldest messages of the largest go.
  struct Offline {
    std::string session_id;
    std::vector<std::string> reply_sessions;  // header sessions whose replies were its
    std::deque<protocol::EnvelopePtr> missed;
    std::size_t bytes = 0;
    std::size_t dropped = 0;
  };
  static constexpr std::size_t kOfflineBudgetBytes = std::size_t{8} << 20;
  static constexpr std::size_t kMaxOfflineSessions = 8;
  void keep_for_offline_locked(const protocol::EnvelopePtr& msg, const std::string& reply_session)
      CELLGATE_REQUIRES(mu_);
  void trim_offline_locked() CELLGATE_REQUIRES(mu_);

  void touch_locked() CELLGATE_REQUIRES(mu_);
  std::vector<std::shared_ptr<ChannelListener>> listeners_locked() const CELLGATE_REQUIRES(mu_);
  static void stop(Running running);

  const std::string id_;
  const kernel::KernelSpec spec_;
  const std::string home_;
  const std::string work_dir_;
  const bool shared_files_;
  const uid_t uid_;
  const std::map<std::string, std::string> env_;
  const Now now_;
  std::unique_ptr<DeliveryRecord> delivery_;  // set before the kernel is shared; thread-safe

  Mutex lifecycle_mu_;  // before mu_
  mutable Mutex mu_;
  std::vector<Queued> queued_ CELLGATE_GUARDED_BY(mu_);  // posted while hibernated
  bool resume_claimed_ CELLGATE_GUARDED_BY(mu_) = false;
  KernelState state_ CELLGATE_GUARDED_BY(mu_) = KernelState::kStarting;
  std::string reason_ CELLGATE_GUARDED_BY(mu_);
  int restarts_ CELLGATE_GUARDED_BY(mu_) = 0;
  Running running_ CELLGATE_GUARDED_BY(mu_);
  std::vector<Attached> attached_ CELLGATE_GUARDED_BY(mu_);
  // header.session → sender
  std::map<std::string, std::weak_ptr<ChannelListener>> by_session_ CELLGATE_GUARDED_BY(mu_);
  std::vector<Offline> offline_ CELLGATE_GUARDED_BY(mu_);
  std::size_t offline_bytes_ CELLGATE_GUARDED_BY(mu_) = 0;
  bool shutdown_published_ CELLGATE_GUARDED_BY(mu_) = false;  // see wait_shutdown_published
  std::condition_variable_any shutdown_published_cv_;
  std::chrono::system_clock::time_point last_activity_wall_ CELLGATE_GUARDED_BY(mu_);  // model
  util::Clock::time_point last_activity_ CELLGATE_GUARDED_BY(mu_);  // for idle times
};

}  // namespace cellgate::kernels
