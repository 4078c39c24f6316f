// The transport that ships: a kernel's five channels over ZeroMQ
// (https://jupyter-client.readthedocs.io/en/stable/messaging.html#general-message-format):
// shell, control and stdin as DEALERs sharing one routing id (the kernel sends input_request to
// the identity that sent the execute_request), iopub as a SUB to everything, the heartbeat as a
// REQ. It waits in epoll on the sockets' ZMQ_FDs and an eventfd that wake() writes.
//
//   CELLGATE_ASSIGN_OR_RETURN(auto transport,
//                             make_zmq_transport(info, options, session.id()));
//   auto client = KernelClient::open(std::move(transport), std::move(signer), options);
//
// Thread-safety: as every Transport: wake() from any thread, the rest on the client's I/O thread,
// the only thread that touches the sockets.
#pragma once

#include <memory>
#include <string>

#include "cellgate/kernel/connection.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernel/transport.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernel {

// Connects to `info`'s endpoints in ClientOptions::zmq_context (or a context of its own), with
// ClientOptions::limits.max_message_bytes as every socket's maxmsgsize.
Result<std::unique_ptr<Transport>> make_zmq_transport(const ConnectionInfo& info,
                                                      const ClientOptions& options,
                                                      const std::string& routing_id);

}  // namespace cellgate::kernel
