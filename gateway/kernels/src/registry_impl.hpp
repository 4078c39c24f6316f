// The registry's parts behind KernelRegistry (registry.hpp), composed here in dependency order:
// admission (the --max-kernels count, admission.hpp), the live kernels under their own lock, the
// warm pool (warm_pool.hpp, its own lock and fillers, given launch_pooled and discard), the
// death monitor and culler (monitor.cpp) and adoption (adoption.cpp). Not a public header: the
// state lives here so that the public one is the contract alone.
//
// Lock order: pass_mu_ (one monitor pass), then the pool's lock, then mu_ or the admission's
// (leaves; nothing is called while either is held).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "admission.hpp"
#include "cellgate/checkpoint/images.hpp"
#include "cellgate/kernel/client.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/mutex.hpp"
#include "warm_pool.hpp"

namespace cellgate::kernels {

struct Record;  // records.hpp

class KernelRegistry::Impl {
 public:
  // With a loop, the monitor runs on it and `now` is its clock (registry.hpp).
  Impl(RegistryOptions options, kernel::KernelBackend& backend, Now now, util::Loop* loop);
  ~Impl();

  Result<void> claim_state_dir();
  void start();
  Result<KernelModel> start(const std::string& name, const nlohmann::json& env);
  Result<std::shared_ptr<ManagedKernel>> find(const std::string& id) const;
  void set_draining(bool on);
  Result<nlohmann::json> usage(const std::string& id);  // usage.cpp
  bool draining() const { return draining_.load(); }
  int room_percent() const;
  std::vector<KernelModel> list() const;
  Result<void> interrupt(const std::string& id);
  Result<KernelModel> restart(const std::string& id);
  Result<void> shutdown(const std::string& id);
  Result<KernelModel> hibernate(const std::string& id);  // hibernate.cpp
  Result<void> resume(const std::string& id);
  Result<SnapshotModel> snapshot(const std::string& kernel_id, bool compress);  // snapshots.cpp
  std::uint64_t image_bytes(const std::string& id) const;                       // hibernate.cpp
  std::vector<SnapshotModel> snapshots() const;
  Result<void> delete_snapshot(const std::string& snapshot_id);
  Result<KernelModel> start_from_snapshot(const std::string& snapshot_id, const std::string& name,
                                          const nlohmann::json& env);
  Result<std::vector<KernelModel>> fork(const std::string& kernel_id, int count);
  Result<void> move_out(const std::string& id, const MoveSender& send);  // moves.cpp
  Result<KernelModel> move_in(const MovedKernel& moved);
  std::vector<std::string> kernel_ids() const;  // the client kernels' now
  void shutdown_all();
  void hand_over();
  void hibernate_and_stop();  // hibernate.cpp
  void monitor_once();

  std::size_t pool_ready_total() const { return pool_.ready_total(); }
  std::size_t pool_ready(const std::string& name) const;
  std::vector<pid_t> pool_pids(const std::string& name) const;
  std::size_t pool_target(const std::string& name) const;

  std::vector<kernel::KernelSpec> kernelspecs() const;
  Result<kernel::KernelSpec> kernelspec(const std::string& name) const;

  RegistryOptions options_;
  RegistryStats stats_;  // thread-safe itself
  std::string default_kernel_ = "python3";

 private:
  // A client's kernel and its place under --max-kernels, given back as the entry goes.
  struct Live {
    std::shared_ptr<ManagedKernel> kernel;
    Admission::Ticket place;
  };

  // ---- registry.cpp ----
  // Starts a process for `k` through the backend and waits until it answers; blocking.
  // `copy`: restore this snapshot image (with its kernel's key) instead of running the
  // kernelspec's argv (snapshots.cpp).
  struct Copy {
    std::string image_dir;
    std::string key;
    // The jail's cgroup name instead of "k-<id>": a kernel moved here keeps its id, and its
    // first node's cgroup of that name may still exist on the same host (moves.cpp).
    std::string cgroup_name;
  };
  Result<ManagedKernel::Running> launch(const std::shared_ptr<ManagedKernel>& k,
                                        const Copy* copy = nullptr);
  // A client kernel started (from `copy` when given), recorded and made live; start()'s path
  // past the pool.
  // `id`: the kernel's id ("": a new one of this node; a moved kernel keeps its own).
  Result<KernelModel> start_new(kernel::KernelSpec spec, std::map<std::string, std::string> env,
                                const Copy* copy, std::chrono::steady_clock::time_point began,
                                const std::string& id = {});
  // Makes the work dir, launches, and moves `k` to idle (a pooled state record).
  Result<void> start_fresh(const std::shared_ptr<ManagedKernel>& k);
  Result<void> make_home(const ManagedKernel& k) const;
  // A ManagedKernel with the work dir and file ownership of this gateway's mode.
  std::shared_ptr<ManagedKernel> make_kernel(const std::string& id, kernel::KernelSpec spec,
                                             uid_t uid, std::map<std::string, std::string> env);
  // A new kernel in state starting, with its uid; fails when no uid is free.
  Result<std::shared_ptr<ManagedKernel>> new_kernel(kernel::KernelSpec spec,
                                                    std::map<std::string, std::string> env,
                                                    const std::string& id = {});
  // The pool's launch function: one kernel started, answered and warmed; blocking.
  Result<std::shared_ptr<ManagedKernel>> launch_pooled(const std::string& name);
  // A ready pooled kernel of `name` made a client's, or null.
  std::shared_ptr<ManagedKernel> claim_pooled(const std::string& name);
  // Ends a kernel no client ever saw (a failed start, a pooled one): no shutdown_request.
  void discard(const std::shared_ptr<ManagedKernel>& k);
  // Removes its work dir and gives its uid back.
  void release(const ManagedKernel& k);
  kernel::ClientOptions client_options(const std::shared_ptr<ManagedKernel>& k,
                                       const kernel::KernelProcessHandle& process);
  std::vector<std::shared_ptr<ManagedKernel>> snapshot() const;

  // Connects to a started `process` (launched, restored, or running on after a failed dump) and
  // waits until it answers kernel_info; blocking.
  Result<ManagedKernel::Running> connect(const std::shared_ptr<ManagedKernel>& k,
                                         std::unique_ptr<kernel::KernelProcessHandle> process);

  Result<void> refuse_if_draining() const {
    if (draining_.load()) {
      return make_error(ErrorCode::kUnavailable, "node_draining",
                        "this node is draining: it starts no kernel (another node can)");
    }
    return {};
  }

  // ---- snapshots.cpp ----
  Result<checkpoint::ImageStore> snapshot_store() const;
  // A fresh image id in `store`, stamped with this node (a router finds the node by it).
  static Result<std::string> reserve_stamped(const checkpoint::ImageStore& store);
  // Gives a copy just restored (not yet connected) a connection key of its own.
  Result<void> rekey(const ManagedKernel& k, kernel::KernelProcessHandle& process);

  // ---- hibernate.cpp ----
  Result<void> resume(const std::shared_ptr<ManagedKernel>& k);
  static std::string image_dir(const ManagedKernel& k) { return k.home() + "/hibernated"; }
  // The kernel's process and connection taken for a dump (ManagedKernel::begin_hibernate), or
  // why not: busy, hibernated, not checkpointable (then it is running as before). The caller
  // holds its lifecycle lock.
  static Result<ManagedKernel::Running> begin_checkpoint(ManagedKernel& k);
  // `dump` into `dir`, tried again (dir cleared) while it fails on a socket of ours libzmq has
  // not closed yet; the last answer.
  static Result<void> dump_retrying(const std::string& dir,
                                    const std::function<Result<void>()>& dump);

  // ---- adoption.cpp ----
  // At start(): adopt_or_clean_up (adoption.hpp) with adopt() for each running client kernel.
  void adopt_kernels();
  // Connects to a previous gateway's running kernel and makes it a live kernel here.
  Result<void> adopt(const Record& record);
  // hibernate.cpp: a kernel a previous gateway hibernated, listed hibernated again (resumed on
  // first touch, as if this gateway had hibernated it).
  Result<void> adopt_hibernated(const Record& record, const kernel::KernelSpec& spec);
  // hibernate.cpp: refused ("no_space", 507) when the images would pass hibernate_disk_max.
  Result<void> disk_room_for(const kernel::KernelProcessHandle& process) const;

  // ---- monitor.cpp ----
  void start_monitor();  // its thread, or its first timer on monitor_loop_
  void monitor_loop();   // the thread's
  void schedule_pass() CELLGATE_REQUIRES(monitor_mu_);  // the next timer on monitor_loop_
  void wake_monitor();                                  // a death reported: a pass now
  void stop_monitor();
  void handle_death(const std::shared_ptr<ManagedKernel>& k, const std::string& reason);
  void cull();
  // hibernate.cpp: kernels idle longer than hibernate_after hibernate, one pass's worth.
  void hibernate_idle();

  kernel::KernelBackend& backend_;
  const Now now_;
  // One ZeroMQ context (and I/O thread) for every kernel's connection; made here, started by the
  // first connection.
  const std::shared_ptr<kernel::ZmqContext> zmq_context_ = kernel::make_zmq_context();
  UidAllocator uids_;  // thread-safe itself
  Admission admission_;
  std::atomic<bool> draining_{false};  // set_draining()
  // usage.cpp: the last CPU samples, for percentages since the last ask.
  struct UsageSample {
    std::uint64_t cpu_usec = 0;
    std::chrono::steady_clock::time_point at{};
  };
  struct HostCpu {
    std::uint64_t busy = 0, total = 0;
  };
  Mutex usage_mu_;
  std::map<std::string, UsageSample> usage_samples_ CELLGATE_GUARDED_BY(usage_mu_);
  HostCpu host_cpu_ CELLGATE_GUARDED_BY(usage_mu_);

  mutable Mutex mu_;
  std::map<std::string, Live> kernels_ CELLGATE_GUARDED_BY(mu_);
  // Ids of kernels moving here from another node (moves.cpp), not yet live.
  std::set<std::string> arriving_ CELLGATE_GUARDED_BY(mu_);
  // Kernels hibernate_idle() did not hibernate, said once: for good (nullopt: a zygote kernel,
  // an adopted one), or until they are active again (their last activity then: no room on
  // disk, a failed dump). Monitor passes only (pass_mu_).
  std::map<std::string, std::optional<util::Clock::time_point>> not_hibernated_;
  UniqueFd state_lock_ CELLGATE_GUARDED_BY(mu_);  // <state_dir>/lock, flock()ed

  WarmPool pool_;

  Mutex monitor_mu_;  // with monitor_cv_: wakes monitor_loop
  std::condition_variable_any monitor_cv_;
  bool stopping_ CELLGATE_GUARDED_BY(monitor_mu_) = false;  // the monitor ends
  Mutex pass_mu_;                                           // one monitor pass at a time
  util::Clock::time_point next_cull_ CELLGATE_GUARDED_BY(pass_mu_){};
  std::thread monitor_;
  // With a monitor loop instead of the thread: its strand and the next pass's timer (under
  // monitor_mu_). `alive_` is dropped first in stop_monitor(): a pass posted for a death and run
  // later sees it gone and does nothing.
  util::Loop* const monitor_loop_;
  std::shared_ptr<util::Strand> monitor_strand_ CELLGATE_GUARDED_BY(monitor_mu_);
  std::shared_ptr<util::Timer> monitor_timer_ CELLGATE_GUARDED_BY(monitor_mu_);
  std::shared_ptr<bool> alive_ CELLGATE_GUARDED_BY(monitor_mu_) = std::make_shared<bool>(true);
};

}  // namespace cellgate::kernels
