// `cellgate serve --user`: the split into a privileged broker and an unprivileged gateway
// (cellgate/broker/broker.hpp), and what the gateway's user needs of the state dir.
//
//   <state>/            root 0711        the gateway cannot rename or replace what is in it
//     run/, work/       root:gw 0710     the broker's: runtime and work dirs (kernels' sockets
//                                        and files reached through the group)
//     zygote.log        root
//     kernels/, artifacts/, audit/, uid-ranges/, lock     the gateway's
#pragma once

#include <sys/types.h>

#include <string>

#include "cellgate/result.hpp"

namespace cellgate::server {

struct GatewayUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

// A user name, or uid[:gid] (gid defaults to the uid). Never root.
Result<GatewayUser> resolve_gateway_user(const std::string& spec);

// Makes the layout above (chowning the gateway's parts to it) and checks that the gateway's
// user can reach the state dir through every directory above it.
Result<void> prepare_state_dir(const std::string& state_dir, const GatewayUser& user);

// This process becomes `user`: no supplementary groups, no capabilities (bounding set emptied),
// no_new_privs. Checked, not trusted. Call before any thread.
Result<void> become_gateway_user(const GatewayUser& user);

}  // namespace cellgate::server
