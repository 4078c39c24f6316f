// KernelRegistry: the gateway's live kernels — start, find, interrupt, restart, shut down, cull —
// and the bridge between each kernel's ZeroMQ client and the WebSockets attached to it.
//
//   KernelRegistry km(options);
//   auto model = km.start("python3", env);          // blocking: returns once kernel_info answers
//   auto kernel = km.find(model->id);               // shared_ptr<ManagedKernel>
//   kernel.value()->attach(listener);               // a WebSocket receives iopub and its replies
//   kernel.value()->post(Channel::kShell, msg);     // a WebSocket's request
//
// Replies on shell/control/stdin go to the WebSocket whose messages carried the same
// header.session (each WebSocket's client session); iopub goes to every attached WebSocket.
//
// The warm pool (ServeOptions::pool_size, pool_kernels): per pooled kernelspec, a background
// thread keeps that many kernels fully started (kernel_info answered) but invisible to clients.
// start() with no client env hands one over at once; it is then an ordinary kernel and never
// goes back to the pool. A pooled kernel that dies is dropped and replaced, not restarted.
//
// Thread-safety: every public method is thread-safe. Blocking ones (start, restart, shutdown)
// must not run on the network threads. Listener callbacks run on kernel I/O threads and the
// manager's monitor thread; listeners must only queue work.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cellgate/kernel/client.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/kernel/zygote.hpp"
#include "cellgate/result.hpp"
#include "cellgate/jail/spec.hpp"

namespace cellgate::kernels {

// What the registry is configured with (the composition root fills it from `cellgate serve`'s
// options).
struct RegistryOptions {
  std::string state_dir;                // kernels/<id>.json records, work dirs, run/ (required)
  std::size_t max_kernels = 64;         // live kernels, pooled ones included
  double cull_idle_timeout = 0;         // seconds; 0: never cull
  double cull_interval = 300;
  bool cull_connected = false;
  bool cull_busy = false;
  std::set<std::string> env_allowlist;  // client env names passed besides KERNEL_*
  int restart_limit = 5;                // auto-restarts of a dying kernel before it is dead
  double kernel_start_timeout = 60;     // seconds until the kernel must answer kernel_info
  bool no_jail = false;                 // run kernels unjailed (explicit only)
  int pool_size = 0;                    // ready kernels per pooled kernelspec (0: off)
  std::vector<std::string> pool_kernels;  // kernelspecs pooled; empty: the default one
  bool zygote = false;                  // fork python3 ipykernels from a zygote (jailed only)
  std::vector<std::string> zygote_preload;
  jail::JailSpec jail;                  // limits for every kernel
};

struct KernelModel {
  std::string id;
  std::string name;
  std::string last_activity;  // ISO 8601 UTC with microseconds and Z
  std::string execution_state;  // starting | idle | busy | restarting | dead
  int connections = 0;
  std::string reason;  // why it is dead, when it is
  nlohmann::json to_json() const;
};

// A WebSocket (or anything else) that receives a kernel's messages.
class ChannelListener {
 public:
  virtual ~ChannelListener() = default;
  // A message for this listener. Must not block.
  virtual void deliver(kernel::Channel channel, std::shared_ptr<const protocol::Message> msg) = 0;
  // The kernel is gone (deleted or culled): close with a normal closure.
  virtual void kernel_gone(const std::string& reason) = 0;
};

class ManagedKernel {
 public:
  ManagedKernel(std::string id, kernel::KernelSpec spec, std::string home);
  ~ManagedKernel();

  const std::string& id() const { return id_; }
  const kernel::KernelSpec& spec() const { return spec_; }
  KernelModel model() const;

  // Attaches a listener for the client session `session_id` ("" when the client gave none).
  // Returns false when the kernel is already gone.
  bool attach(const std::shared_ptr<ChannelListener>& listener, const std::string& session_id);
  void detach(const ChannelListener* listener);
  // Forwards a client's message; records the sender's header.session for routing replies.
  Result<void> post(kernel::Channel channel, protocol::Message msg,
                    const std::shared_ptr<ChannelListener>& sender);
  // The kernel client for the gateway's own requests (agents, restart checks). May be null
  // while the kernel restarts.
  std::shared_ptr<kernel::KernelClient> client() const;

  // The kernel's work dir on the host (kept across restarts) and the uid/gid its files belong to.
  std::string work_dir() const { return home_ + "/work"; }
  uid_t uid() const;
  // Its cgroup's CPU and memory figures; an error when unjailed or not running.
  Result<jail::CgroupStats> cgroup_stats() const;
  // Held by an agent execution from its first message to its answer, so two agent calls on one
  // kernel run one after the other instead of interleaving.
  std::timed_mutex& execution_mutex() { return execution_mu_; }

 private:
  friend class KernelRegistry;
  struct Attached {
    std::weak_ptr<ChannelListener> listener;
    std::string session_id;
  };

  // Stops the client and ends the kernel process (and its cgroup); safe to call twice.
  void stop_process();
  void on_iopub(const protocol::Message& msg);
  void on_unrouted(kernel::Channel channel, const protocol::Message& msg);
  void publish_status(const std::string& state, const std::string& reason = "");
  void touch();
  std::vector<std::shared_ptr<ChannelListener>> listeners_snapshot();

  const std::string id_;
  const kernel::KernelSpec spec_;
  const std::string home_;  // state_dir/kernels/<id>: work dir lives here

  mutable std::mutex mu_;
  std::timed_mutex execution_mu_;
  std::unique_ptr<kernel::KernelProcess> process_;
  std::shared_ptr<kernel::KernelClient> client_;
  std::vector<Attached> attached_;
  std::map<std::string, std::weak_ptr<ChannelListener>> by_session_;  // header.session → sender
  std::string execution_state_ = "starting";
  std::string reason_;
  std::chrono::system_clock::time_point last_activity_;
  std::chrono::steady_clock::time_point last_activity_steady_;
  std::map<std::string, std::string> env_;
  uid_t uid_ = 0;
  int restarts_ = 0;
  bool gone_ = false;
  bool restarting_ = false;
};

class KernelRegistry {
 public:
  // Makes the state dir; starts nothing (see start()).
  explicit KernelRegistry(RegistryOptions options);
  ~KernelRegistry();  // shuts every kernel down
  // Starts the zygote (if configured), the death monitor and culler, and the pool's filler.
  void start();

  // Blocking. env: the client's env (filtered here: KERNEL_* and the allowlist only). With
  // nothing left after filtering, a ready pooled kernel of `name` is claimed instead (a pool hit).
  Result<KernelModel> start(const std::string& name, const nlohmann::json& env);
  Result<std::shared_ptr<ManagedKernel>> find(const std::string& id) const;
  std::vector<KernelModel> list() const;
  Result<void> interrupt(const std::string& id);
  Result<KernelModel> restart(const std::string& id);  // blocking
  Result<void> shutdown(const std::string& id);        // blocking
  // Ends every kernel, pooled ones included, and stops refilling the pool for good.
  void shutdown_all();

  // Pooled kernels of kernelspec `name` ("" : the default) ready to be claimed.
  std::size_t pool_ready(const std::string& name) const;
  // Their kernel pids (host pid namespace), for tests.
  std::vector<pid_t> pool_pids(const std::string& name) const;

  // Kernelspecs: the standard directories; every one runs through cellgate-kernel.
  std::vector<kernel::KernelSpec> kernelspecs() const;
  Result<kernel::KernelSpec> kernelspec(const std::string& name) const;
  const std::string& default_kernel_name() const { return default_kernel_; }
  const RegistryOptions& options() const { return options_; }
  const std::string& state_dir() const { return state_dir_; }

 private:
  // (Re)starts the process and client and writes the state record; blocking.
  Result<void> launch(const std::shared_ptr<ManagedKernel>& k);
  // launch() without the state record (pooled kernels get theirs when claimed).
  Result<void> start_process(const std::shared_ptr<ManagedKernel>& k);
  // A new kernel object with its uid (nothing started yet); mu_ held.
  std::shared_ptr<ManagedKernel> new_kernel_locked(kernel::KernelSpec spec);
  // Makes the work dir and starts the process (no state record).
  Result<void> start_fresh(const std::shared_ptr<ManagedKernel>& k);
  // Ends a kernel no client ever saw (a failed start, a pooled one): no shutdown_request.
  void discard(const std::shared_ptr<ManagedKernel>& k);
  // A ready pooled kernel of `name` moved into kernels_, or null.
  std::shared_ptr<ManagedKernel> claim_pooled(const std::string& name);
  // Ready pooled kernels given up so live + pending + pool fits max_kernels again.
  std::vector<std::shared_ptr<ManagedKernel>> evict_pooled_locked();
  std::size_t pool_total_locked() const;
  // Why a kernel has died ("" while it runs); k.mu_ held.
  static std::string death_reason_locked(ManagedKernel& k);
  bool is_pooled(const std::string& name) const;
  void pool_loop();
  // Starts one kernel for the pool of `name`; false when it failed.
  bool refill(const std::string& name);
  void reap_dead_pooled();
  void stop_pool();
  void monitor_loop();
  void handle_death(const std::shared_ptr<ManagedKernel>& k, const std::string& reason);
  void cull();
  Result<void> write_record(const ManagedKernel& k);
  uid_t allocate_uid();

  RegistryOptions options_;
  std::string state_dir_;
  std::string default_kernel_ = "python3";

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<ManagedKernel>> kernels_;
  std::size_t pending_ = 0;
  std::set<uid_t> uids_in_use_;

  std::vector<std::string> pool_names_;  // the pooled kernelspecs; fixed by the constructor
  // The warm pool, under mu_: ready kernels per kernelspec name (oldest first), starts in flight.
  std::map<std::string, std::vector<std::shared_ptr<ManagedKernel>>> pool_;
  std::map<std::string, std::size_t> pool_starting_;
  std::condition_variable pool_cv_;  // with mu_; wakes pool_loop: a claim, a death, stopping
  bool pool_stopping_ = false;       // under mu_: no more refills

  // The fork server python3 kernels start from (ServeOptions::zygote); ticked by the monitor.
  std::unique_ptr<kernel::Zygote> zygote_;

  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;
  bool stopping_ = false;  // the monitor ends
  std::thread monitor_;
  std::thread pool_thread_;
};

}  // namespace cellgate::kernels
