// The WebSocket channel bridge of /api/kernels/{id}/channels: one per connection, between the
// HTTP layer's WebSocket (http::WsHandler) and a kernel (kernels::ChannelListener).
//
// Kernel → client: iopub goes to every connection of the kernel, replies (shell, control, stdin)
// to the connection whose client session sent the request — routed on the header alone. Each
// message is encoded for the connection's format when its connection first sends it, on that
// connection's strand, and the encoding is shared by every connection of that format: v1
// frames are the kernel's frames, byte for byte.
// Client → kernel: legacy JSON (and legacy binary) messages are decoded and re-encoded for the
// kernel; v1 frames are checked (valid JSON, a header with msg_type) and forwarded as they are,
// re-signed. A bad frame is dropped with a log line; the connection stays.
//
// Thread-safety: see http::WsHandler and kernels::ChannelListener.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "cellgate/http/handler.hpp"
#include "cellgate/kernels/registry.hpp"

namespace cellgate::api {

// Whether the upgrade request offers the v1.kernel.websocket.jupyter.org subprotocol.
bool offers_v1(const http::Request& req);

// `resume` is called (and must not block: it hands the blocking resume to a worker) when the
// connection opens or posts a message while the kernel is hibernated; the messages wait in the
// kernel's queue meanwhile (managed_kernel.hpp). `usage` answers a client's usage_request on
// the control channel in the gateway (KernelRegistry::usage): the kernel never sees it.
std::shared_ptr<http::WsHandler> make_channel_bridge(std::shared_ptr<kernels::ManagedKernel> kernel,
                                                     std::string session_id, bool v1,
                                                     std::function<void()> resume,
                                                     std::function<Result<nlohmann::json>()> usage);

}  // namespace cellgate::api
