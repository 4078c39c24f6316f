// Privilege separation: `cellgate serve` started as root keeps a small privileged process, the
// broker, and runs everything that speaks HTTP and WebSocket as an unprivileged user. The broker
// starts, signals and stops jailed kernels on request over a SOCK_SEQPACKET channel, and nothing
// else: the jail, the kernelspec's argv, the runtime and work dirs and the allowed uids are its
// own configuration, fixed before the split; a request names a kernelspec, a kernel id, a uid
// from the range and the kernel's environment (request.hpp, the wire). Every request is
// validated and logged.
//
//   auto [gateway_end, broker_end] = broker_channel().value();
//   if (fork() == 0) { _exit(serve_broker(std::move(broker_end), policy)); }   // root
//   drop_privileges…;
//   BrokerBackend backend(std::move(gateway_end));      // a KernelBackend for the registry
//
// The broker is one thread: an event loop over the channel and its kernels' launcher pidfds,
// with the calls that block (a launch, a stop, wait_fast) on a small bounded pool of workers.
//
// Thread-safety: BrokerBackend and its handles may be used from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cellgate/jail/spec.hpp"
#include "cellgate/kernel/backend.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::broker {

// What the broker runs kernels with. Nothing in it can be changed by a request.
struct BrokerPolicy {
  std::string state_dir;  // runtime dirs in <state_dir>/run, work dirs in <state_dir>/work/<id>
  jail::JailSpec jail;    // every kernel's jail; uid, gid, name and work-dir binds per kernel
  // Kernelspecs (the broker's own lookup) with metadata.cellgate.debugger get a loopback network;
  // false: they are refused.
  bool allow_debugger = false;
  std::vector<std::string> work_dir_aliases;  // where the work dir is bound besides /home/kernel
  uid_t first_uid = 0;                        // the kernel uids it may run, inclusive (never 0)
  uid_t last_uid = 0;
  gid_t access_gid = 0;  // the gateway's group: may use the kernels' sockets and work dirs
  kernel::ProcessBackendOptions backend;
  // How long a launcher may take to report its kernel started (--kernel-start-timeout).
  std::chrono::milliseconds start_timeout{60000};
  // The kernelspec of a name; unset: the registry's lookup (kernelspec dirs), done as root.
  std::function<Result<kernel::KernelSpec>(const std::string& name)> find_kernelspec;
};

// A connected SOCK_SEQPACKET pair: {gateway end, broker end}.
Result<std::pair<UniqueFd, UniqueFd>> broker_channel();

// Runs the broker on `channel` until the other end closes it, then ends every kernel it still
// runs and removes their work dirs. Call in a process of its own, before any thread; returns the
// exit code.
int serve_broker(UniqueFd channel, BrokerPolicy policy);

// The gateway's side: a KernelBackend whose kernels the broker starts.
class BrokerBackend : public kernel::KernelBackend {
 public:
  explicit BrokerBackend(UniqueFd channel);
  ~BrokerBackend() override;
  BrokerBackend(const BrokerBackend&) = delete;
  BrokerBackend& operator=(const BrokerBackend&) = delete;

  bool wait_fast(std::chrono::milliseconds timeout) override;
  // Sends the kernelspec's name, the kernel id, the jail's uid, the environment and the
  // connection-dir files; everything else in `request` is the broker's to decide.
  Result<std::unique_ptr<kernel::KernelProcessHandle>> launch(
      kernel::LaunchRequest request) override;
  // Kernels are not adopted across gateways here: the broker ended them when its gateway went.
  Result<std::unique_ptr<kernel::KernelProcessHandle>> adopt(
      const kernel::AdoptionFacts& facts) override;
  void end_work_dir(const std::string& kernel_id, const std::string& work_dir) override;

  struct Shared;  // the channel, its reader thread, pending replies, handles' exit reports

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace cellgate::broker
