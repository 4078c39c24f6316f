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
// Mapping: where /etc/subuid and /etc/subgid grant the user a subordinate range and newuidmap /
// newgidmap (Debian's uidmap package) are installed, the user's own uid and gid become namespace
// 0 and the range namespace 1..count, written by those setuid helpers: each kernel then gets a
// uid of its own (kernel_uid_range()). Otherwise only the user's own ids are mapped, as 0 — an
// unprivileged user may map that one id without help — and kernels run as that same uid
// (namespace uid 0) with every capability dropped, no_new_privs and securebits locked: outside
// they are the user, inside they can do nothing the user's files do not allow.
//
// Thread-safety: enter_gateway_user_namespace() must run while the process has one thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "cellgate/result.hpp"

namespace cellgate::jail {

struct UserNamespace {
  bool entered = false;  // false: we are real root, nothing was done
  uid_t outer_uid = 0;
  gid_t outer_gid = 0;
  std::string summary;  // for the start-up log
  // Namespace uids kernels may run as (1..count, a subordinate range); 0: the single mapping.
  uid_t kernel_uid_count = 0;
};

// A user's subordinate range from /etc/subuid or /etc/subgid text ("name:start:count" or
// "uid:start:count" lines); the first that names the user; count 0 when none does.
struct SubordinateRange {
  std::uint64_t start = 0;
  std::uint64_t count = 0;
};
SubordinateRange find_subordinate_range(const std::string& text, const std::string& name,
                                        std::uint64_t id);

// The namespace uids a kernel may run as, from /proc/self/uid_map: the range mapped at 1 beside
// 0 (the gateway) — {1, count} — or {0, 0} when the namespace maps no such range (the single
// mapping, or real root).
struct KernelUidRange {
  uid_t first = 0;
  uid_t count = 0;
};
KernelUidRange kernel_uid_range();
KernelUidRange kernel_uid_range_of_map(const std::string& uid_map);

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
