// KernelClient's router: pure logic over a Transport (cellgate/kernel/transport.hpp). It sends
// requests and routes what comes back to the request it answers, by parent msg_id: replies,
// iopub messages and input requests go to the request's handlers, every iopub message also to
// ClientOptions::on_iopub, and shell/control/stdin messages that answer no request of ours to
// on_unrouted. A request completes with its reply and its iopub status idle (or kIdleGrace after
// the reply, when the idle was lost); the heartbeat (heartbeat.hpp) decides when the kernel is
// dead, which ends every request kKernelDead.
//
//   Router router(options, session, signer, transport);   // transport: a Transport&
//   router.send({Channel::kShell, session.make("kernel_info_request", {}), nullptr, handlers});
//   for (;;) {
//     transport.wait(router.tick());
//     transport.receive(router);                            // calls router.on_frames(…), …
//   }
//   router.close();                                         // what is left ends kCancelled
//
// Thread-safety: send(), tick(), close() and the TransportEvents run on the client's I/O thread
// only, as do the handlers they call. alive(), death_reason(), iopub_seen(), wire_errors() and
// settle_heartbeat() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernel/transport.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/protocol/codec.hpp"
#include "cellgate/protocol/envelope.hpp"
#include "heartbeat.hpp"

namespace cellgate::kernel {

class Router : public TransportEvents {
 public:
  using Clock = std::chrono::steady_clock;
  // A request whose reply is in completes this long after it, idle or not: the kernel's PUB
  // socket drops messages when the gateway's iopub queue is full, so the idle may never come
  // (jupyter_client's nbclient does the same with its iopub_timeout).
  static constexpr std::chrono::milliseconds kIdleGrace{3000};

  struct Outgoing {
    Channel channel = Channel::kShell;
    protocol::Message msg;                    // unless `envelope` is set
    protocol::EnvelopePtr envelope;           // a client's message, forwarded as it is
    std::optional<RequestHandlers> handlers;  // routes what answers it; none: post()/input
  };

  // `options`, `session`, `signer` and `transport` must outlive the router. `clock` tells the
  // time (tests pass a manual one).
  Router(const ClientOptions& options, const protocol::Session& session,
         const protocol::Signer& signer, Transport& transport,
         std::function<Clock::time_point()> clock = Clock::now);
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Registers the route (or ends the request kKernelDead at once when the kernel is dead), then
  // hands the frames to the transport.
  void send(Outgoing out);
  // Completes requests whose idle was lost, pings when due, counts misses. Returns how long the
  // transport may wait before tick() is due again (negative: until something arrives).
  std::chrono::milliseconds tick();
  // Ends every request still routed kCancelled (the client is closing).
  void close() { end_all(RequestEnd::kCancelled); }

  // TransportEvents.
  void on_frames(Channel channel, std::span<const std::string_view> frames,
                 const std::function<void()>& release) override;
  void on_pong() override;
  bool on_iopub_cut() override;
  void on_iopub_reopened() override;
  void on_peer_gone(const std::string& reason) override;

  // ---- any thread ----
  // The client is being destroyed: what arrives from now on is dropped unread (a client
  // destroyed from one of its own handlers lets its thread finish the batch in hand, and that
  // thread may outlive main(), so it must touch nothing else: no signature checks, no handlers).
  void stop() { stopped_.store(true); }
  bool alive() const { return alive_.load(); }
  std::string death_reason() const;
  bool iopub_seen() const { return iopub_seen_.load(); }
  std::size_t wire_errors() const { return wire_errors_.load(); }
  // From a kernel_info_reply, unless ClientOptions::heartbeat_while_busy says: ipykernel
  // ("ipython") answers heartbeats from a thread of its own, busy or not; of any other kernel the
  // gateway assumes only what IRkernel does: it answers between requests.
  void settle_heartbeat(const nlohmann::json& kernel_info);
  // Requests waiting for an answer (for tests).
  std::size_t pending() const { return pending_.load(); }

 private:
  struct Route {
    RequestHandlers handlers;
    bool got_reply = false;
    bool got_idle = false;
    Clock::time_point reply_at;  // when got_reply became true
  };

  void dispatch(Channel channel, const protocol::EnvelopePtr& env);
  void complete_lost_idles(Clock::time_point now);
  // The earliest time a lost idle completes a request; nullopt when none waits for one.
  std::optional<Clock::time_point> next_lost_idle() const;
  void end_route(const std::string& id, RequestEnd end);
  void end_all(RequestEnd end);
  void declare_dead(const std::string& reason);
  void notify_oversized();
  void tell_dropped(std::span<const std::string_view> frames, const Error& why);
  void count_routes() { pending_.store(routes_.size()); }

  const ClientOptions& options_;
  const protocol::Session& session_;
  const protocol::Signer& signer_;
  Transport& transport_;
  const std::function<Clock::time_point()> clock_;

  // I/O thread only.
  std::unordered_map<std::string, Route> routes_;
  Heartbeat heartbeat_;
  bool kernel_busy_ = false;  // the kernel's last iopub status, whoever's request it was for
  nlohmann::json busy_parent_ = nlohmann::json::object();  // parent_header of the last "busy"
  // iopub was reopened after a cut and the kernel has not been heard from since: the first
  // message on the new connection, or the echo of a ping sent after reopened_at_, proves the
  // kernel lived on, so the cut was a dropped message.
  bool iopub_drop_pending_ = false;
  Clock::time_point reopened_at_{};

  // Read from any thread.
  std::atomic<bool> stopped_{false};
  std::atomic<bool> alive_{true};
  std::atomic<bool> iopub_seen_{false};
  std::atomic<std::size_t> wire_errors_{0};
  std::atomic<std::size_t> pending_{0};
  // ClientOptions::heartbeat_while_busy, once known (settle_heartbeat() decides an unset one).
  std::atomic<bool> hb_while_busy_{false};
  mutable Mutex mu_;
  std::string dead_reason_ CELLGATE_GUARDED_BY(mu_);  // set before alive_ turns false
};

}  // namespace cellgate::kernel
