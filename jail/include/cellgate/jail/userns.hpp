// Rootless mode: a gateway started by an ordinary user enters a user namespace of its own (with a
// mount namespace) before it starts anything, and is root there. Everything it starts —
// launchers, the zygote, the jails — runs the same code as under real root, with capabilities
// that reach no further than that namespace: mounts, pivot_root, new pid/net/uts/ipc namespaces,
// tmpfs work dirs the gateway can see, the cgroups systemd delegated to the user (owned by the
// user, so writable by the namespace's root).
//
//   auto ns = jail::enter_gateway_user_namespace();   // single-threaded, before any kernel
//   if (!ns) { print(ns.error().message); exit 2; }   // names the setting that forbids it
//
// Mapping: only the user's own uid (and gid), as namespace uid 0 — an unprivileged user may map
// that one id without help. Kernels then run as that same uid (namespace uid 0) with every
// capability dropped, no_new_privs and securebits locked: outside they are the user, inside
// they can do nothing the user's files do not allow. (newuidmap with a subordinate range from
// /etc/subuid would give each kernel a uid of its own; not done yet.)
//
// Thread-safety: enter_gateway_user_namespace() must run while the process has one thread.
#pragma once

#include <sys/types.h>

#include <string>

#include "cellgate/result.hpp"

namespace cellgate::jail {

struct UserNamespace {
  bool entered = false;  // false: we are real root, nothing was done
  uid_t outer_uid = 0;
  gid_t outer_gid = 0;
  std::string summary;  // for the start-up log
};

Result<UserNamespace> enter_gateway_user_namespace();

// True in a user namespace whose uid_map maps only uid 0, to a uid other than 0 outside (the
// rootless gateway's): the kernel's uid must then be 0, which is the user outside.
bool in_single_uid_user_namespace();
// The same decision on a uid_map's text ("         0       1001          1\n").
bool is_single_uid_map(const std::string& uid_map);

// Why unprivileged user namespaces are unavailable on this host, naming the setting
// (kernel.unprivileged_userns_clone, user.max_user_namespaces,
// kernel.apparmor_restrict_unprivileged_userns); "" when none of them forbids it.
std::string user_namespace_blocker(const std::string& proc_sys = "/proc/sys");

}  // namespace cellgate::jail
