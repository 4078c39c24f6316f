// The seam under KernelClient: how one kernel's messages travel, and nothing else. KernelClient
// is a request router (request ids → pending requests, iopub status tracking, the heartbeat's
// verdict) over a Transport that carries frames on the five Jupyter channels. ZeroMQ is the
// transport that ships (KernelClient::connect); tests/support's fake kernel is another
// (FakeBackend), so every unit test runs the router that ships.
//
//   class Loopback : public kernel::Transport { … };      // answers what send() gets
//   auto client = kernel::KernelClient::open(std::make_unique<Loopback>(), std::move(signer), {});
//   client.value()->wait_ready(1s);
//
// A transport carries a message as its wire frames (routing ids, "<IDS|MSG>", signature, the four
// JSON frames, buffers:
// https://jupyter-client.readthedocs.io/en/stable/messaging.html#the-wire-protocol); the router
// encodes, signs and checks them. The heartbeat is a ping and its echo.
//
// Thread-safety: wake() may be called from any thread. Every other method is called on the
// client's I/O thread only, one call at a time; receive() calls TransportEvents on that thread.
#pragma once

#include <chrono>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/protocol/message.hpp"

namespace cellgate::kernel {

using protocol::Channel;

// What a transport hands the router (from Transport::receive, on the I/O thread).
class TransportEvents {
 public:
  virtual ~TransportEvents() = default;
  // A frame set from the kernel on shell, control, stdin or iopub, unchecked. The views are valid
  // until `release` is called (the router calls it once it holds its own copy, so a large message
  // is not held twice while it is dispatched) or the call returns.
  virtual void on_frames(Channel channel, std::span<const std::string_view> frames,
                         const std::function<void()>& release) = 0;
  // An echo of a ping (Transport::ping).
  virtual void on_pong() = 0;
  // iopub's connection was cut while the transport still runs (libzmq drops a subscriber's
  // connection on a frame over maxmsgsize). Answers whether to reopen it: not for a kernel
  // already declared dead (a dying kernel disconnects too).
  virtual bool on_iopub_cut() = 0;
  // iopub was reopened after a cut: what arrives next was published after it.
  virtual void on_iopub_reopened() = 0;
  // The transport knows the kernel is gone (a fake kernel that the test killed). ZeroMQ never
  // knows: for it only unanswered pings tell.
  virtual void on_peer_gone(const std::string& reason) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Queues one message's frames on shell, control or stdin without blocking. false when it
  // cannot (the request it carries then ends kKernelDead).
  virtual bool send(Channel channel, std::vector<std::string> frames) = 0;
  // Sends a heartbeat ping; false when it cannot now (the router tries again an interval later).
  virtual bool ping() = 0;
  // Blocks until something may have arrived, wake() was called or `timeout` passed (negative:
  // no timeout). false: the transport is broken for good and the client stops.
  virtual bool wait(std::chrono::milliseconds timeout) = 0;
  // Hands whatever has arrived to `events`, without blocking. false: broken for good.
  virtual bool receive(TransportEvents& events) = 0;
  // Any thread: makes the wait() in progress, or the next one, return at once.
  virtual void wake() = 0;
  // Names the kernel in log lines when ClientOptions::log_name is empty (its shell endpoint).
  virtual std::string name() const = 0;
};

}  // namespace cellgate::kernel
