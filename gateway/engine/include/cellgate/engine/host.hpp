// The host's preparation for jailed kernels, as one list of named steps taken once by every
// command that starts kernels (`cellgate serve`, `cellgate mcp`, `cellgate run`, `cellgate
// exec`), before any kernel, any zygote and any thread:
//
//   probe          what this host supports (user namespaces, Landlock, cgroups, seccomp); reads
//                  only, never fails
//   place_cgroups  on cgroup v2 the gateway may have to leave its own cgroup for a leaf so that
//                  kernels' cgroups can get the memory, pids and cpu controllers
//                  (jail::place_kernel_cgroups); jailed only
//   checkpoints    whether CRIU can checkpoint kernels here (checkpoint::probe_criu(): a CRIU
//                  >= 4.2, root, `criu check`); jailed only; never fails: where it cannot,
//                  the routes that need it answer 501 with PreparedHost::checkpoints.reason
//   enter_user_ns  not root: root of a user namespace of our own from here on (rootless mode).
//                  After the cgroups (they are the user's), before any thread; jailed only
//
//   auto host = engine::prepare_host({.jailed = !no_jail, .report = log_line});
//   if (!host) { print(host.error().message); exit 2; }
//   options.registry.jail.cgroup_parent = host->cgroup_parent;
//
// Each step returns its error unchanged (the message names the setting that forbids it) and the
// steps after it are not taken.
//
// Thread-safety: prepare_host() must run while the process has one thread (a user namespace can
// only be entered then).
#pragma once

#include <functional>
#include <string>

#include "cellgate/checkpoint/criu.hpp"
#include "cellgate/jail/jail.hpp"
#include "cellgate/result.hpp"

namespace cellgate::engine {

enum class HostStep { kProbe, kPlaceCgroups, kCheckpoints, kEnterUserNamespace };

struct HostOptions {
  bool jailed = true;  // false (--no-jail): the probe only; kernels get no cgroups of ours
  // Where kernels' cgroups go: serve's --cgroup-parent, a delegated cgroup; "": decided from our
  // own cgroup.
  std::string cgroup_parent;
  // false: the caller names the cgroup parent itself (`exec --jail-spec` with one) and the
  // placement step is skipped.
  bool place_cgroups = true;
  // CRIU (4.2) saves no Landlock domain: a restored kernel runs without its Landlock layer, its
  // namespaces, seccomp filter, uid, no_new_privs and cgroup restored as they were. Checkpoints
  // are therefore off unless the operator accepts that (serve's --checkpoint-without-landlock):
  // a layer that cannot be kept fails closed.
  bool checkpoint_without_landlock = false;
  // Called after each step taken with its one line for the start-up log (the host; where the
  // cgroups are; what checkpoints can do; the user namespace, only when one was entered).
  // null: nothing is said.
  std::function<void(HostStep step, const std::string& line)> report;
};

struct PreparedHost {
  jail::HostSupport support;
  std::string cgroup_parent;    // for JailSpec::cgroup_parent; "" = each launcher's own cgroup
  bool user_namespace = false;  // this process entered a user namespace of its own
  // What the gateway reads before hibernating, snapshotting or forking a kernel. Not available
  // unjailed (a checkpoint is of a jail) and in rootless mode (CRIU needs root).
  checkpoint::CriuSupport checkpoints;
};

Result<PreparedHost> prepare_host(const HostOptions& options);

// PreparedHost::checkpoints.reason when CRIU works but HostOptions::checkpoint_without_landlock
// was not given.
extern const char* const kLandlockNotCheckpointed;

}  // namespace cellgate::engine
