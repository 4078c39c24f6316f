// The cgroup the jail tests' kernels and cgroups go below: "" (each process's own cgroup) on
// cgroup v1 and wherever the controllers are already enabled; on a delegated cgroup v2 (the
// systemd guest of tests/vm runs this binary with Delegate=yes) the binary first moves itself
// into a leaf, as `cellgate serve` does, and this names the delegated cgroup.
#pragma once

#include <string>

namespace cellgate::jail::testing {

const std::string& cgroup_parent();

// True when the binary, started by an ordinary user, entered a user namespace of its own
// (rootless mode) before main.
bool rootless();

// True when this process holds CAP_NET_ADMIN (its effective set): what bringing up a new network
// namespace's loopback needs (a debugger kernel's jail, jail/README.md "Loopback network"). A
// container without it (tests/vm/container-suite's flags) cannot: such kernels fail closed there.
bool has_net_admin();

// Where the launcher and the probes are: $CELLGATE_TEST_BIN_DIR (the guest copies them where a
// non-root user can run them), else the build's bin dir.
const std::string& bin_dir();

}  // namespace cellgate::jail::testing
