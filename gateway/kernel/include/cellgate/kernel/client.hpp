// KernelClient: one connection to one Jupyter kernel, a request router over a Transport
// (transport.hpp).
//
// It sends requests on shell, control and stdin, routes replies, iopub messages and input
// requests to the request they answer (by parent msg_id), completes a request once its reply and
// its iopub status idle are in, and declares the kernel dead when it stops answering heartbeats
// (a kernel other than ipykernel only while idle: see ClientOptions::heartbeat_while_busy) while
// its process makes no progress (ClientOptions::progress: a kernel starved of CPU by its own cell
// is busy, not dead). connect() carries it over ZeroMQ to the endpoints of a connection file;
// open() over any transport (tests/support's fake kernel is one).
//
//   auto client = KernelClient::connect(info, {});
//   client.value()->wait_ready(5s);
//   auto run = client.value()->request(Channel::kShell, "execute_request",
//                                      execute_content("x = 1"), 30s);
//   for (auto& [channel, msg] : run->messages) { ... }
//
// Threading: the router and the transport belong to one I/O thread that the client owns; no
// ZeroMQ socket is touched from any other thread (libzmq's own I/O thread is its context's,
// shared by a gateway's clients: ClientOptions::zmq_context). Public methods are thread-safe:
// they queue work for the I/O thread and wake it (Transport::wake). Handlers run on the I/O
// thread and must not block.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/kernel/connection.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernel/transport.hpp"
#include "cellgate/protocol/codec.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernel {

// A ZeroMQ context for clients to share (ClientOptions::zmq_context). Making one starts no
// thread: libzmq starts its I/O thread with the first socket. It ends when the last client
// holding it goes.
std::shared_ptr<ZmqContext> make_zmq_context();

class KernelClient : public KernelConnection {
 public:
  // Over ZeroMQ, to the endpoints and with the key of `info`.
  static Result<std::unique_ptr<KernelClient>> connect(const ConnectionInfo& info,
                                                       ClientOptions options = {});
  // Over `transport`, signing and checking messages with `signer` (the kernel's key).
  // ClientOptions::zmq_context is not used.
  static Result<std::unique_ptr<KernelClient>> open(std::unique_ptr<Transport> transport,
                                                    protocol::Signer signer,
                                                    ClientOptions options = {});
  KernelClient(const KernelClient&) = delete;
  KernelClient& operator=(const KernelClient&) = delete;

  ~KernelClient() override;

  using KernelConnection::send;
  const protocol::Session& session() const override;
  std::string send(Channel channel, protocol::Message msg, RequestHandlers handlers) override;
  void post(Channel channel, EnvelopePtr msg) override;
  void send_input(const protocol::Message& input_request, std::string value) override;
  // Also waits for iopub to deliver (ZeroMQ's late joiner: a SUB misses what was published
  // before its subscription arrived).
  Result<nlohmann::json> wait_ready(std::chrono::milliseconds timeout) override;
  bool is_alive() const override;
  std::string death_reason() const override;
  // Wire errors seen so far (dropped frame sets).
  std::size_t wire_errors() const;

 private:
  struct Impl;
  explicit KernelClient(std::unique_ptr<Impl> impl);
  // Starts the I/O thread.
  static std::unique_ptr<KernelClient> start(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cellgate::kernel
