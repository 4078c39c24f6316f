#include "cellgate/kernel/client.hpp"

#include <spdlog/spdlog.h>

#include <deque>
#include <thread>

#include "cellgate/mutex.hpp"
#include "router.hpp"
#include "zmq_transport.hpp"

namespace cellgate::kernel {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

}  // namespace

// ---- the I/O thread --------------------------------------------------------------------------

struct KernelClient::Impl {
  Impl(std::unique_ptr<Transport> t, protocol::Signer s, ClientOptions o, std::string session_id)
      : options(std::move(o)),
        session(options.username, std::move(session_id)),
        signer(std::move(s)),
        transport(std::move(t)),
        router(options, session, signer, *transport) {}

  const ClientOptions options;
  const protocol::Session session;
  const protocol::Signer signer;
  const std::unique_ptr<Transport> transport;
  Router router;  // the I/O thread's (and its thread-safe readers')

  Mutex mu;
  std::deque<Router::Outgoing> outgoing CELLGATE_GUARDED_BY(mu);
  bool stopping CELLGATE_GUARDED_BY(mu) = false;

  std::thread thread;
  // The client was destroyed from a handler on this thread: the thread deletes this state when
  // its loop ends (I/O thread only).
  bool orphaned = false;

  void enqueue(Router::Outgoing out) {
    {
      MutexLock lock(mu);
      outgoing.push_back(std::move(out));
    }
    transport->wake();
  }

  void run() {
    for (;;) {
      if (!transport->wait(router.tick())) {
        break;
      }
      if (!send_queued()) {
        break;
      }
      if (!transport->receive(router)) {
        break;
      }
    }
    router.close();
  }

  // Sends what callers queued. Returns false when the client is stopping.
  bool send_queued() {
    std::deque<Router::Outgoing> batch;
    {
      MutexLock lock(mu);
      if (stopping) {
        return false;
      }
      batch.swap(outgoing);
    }
    for (auto& out : batch) {
      router.send(std::move(out));
    }
    return true;
  }
};

// ---- public API ------------------------------------------------------------------------------

KernelClient::KernelClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<KernelClient>> KernelClient::connect(const ConnectionInfo& info,
                                                            ClientOptions options) {
  CELLGATE_ASSIGN_OR_RETURN(protocol::Signer signer,
                            protocol::Signer::create(info.signature_scheme, info.key));
  std::string session_id = protocol::new_uuid();
  CELLGATE_ASSIGN_OR_RETURN(auto transport, make_zmq_transport(info, options, session_id));
  return start(std::make_unique<Impl>(std::move(transport), std::move(signer), std::move(options),
                                      std::move(session_id)));
}

Result<std::unique_ptr<KernelClient>> KernelClient::open(std::unique_ptr<Transport> transport,
                                                         protocol::Signer signer,
                                                         ClientOptions options) {
  if (!transport) {
    return make_error(ErrorCode::kInvalidArgument, "no_transport", "KernelClient::open: null");
  }
  return start(std::make_unique<Impl>(std::move(transport), std::move(signer), std::move(options),
                                      protocol::new_uuid()));
}

std::unique_ptr<KernelClient> KernelClient::start(std::unique_ptr<Impl> impl) {
  Impl* raw = impl.get();
  raw->thread = std::thread([raw] {
    raw->run();
    if (raw->orphaned) {
      delete raw;  // ~KernelClient ran on this thread and left the state to it
    }
  });
  return std::unique_ptr<KernelClient>(new KernelClient(std::move(impl)));
}

KernelClient::~KernelClient() {
  {
    MutexLock lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->router.stop();
  impl_->transport->wake();
  if (impl_->thread.joinable()) {
    if (impl_->thread.get_id() == std::this_thread::get_id()) {
      // The last owner was a handler on the I/O thread itself: joining would deadlock. The loop
      // sees `stopping` once the handler returns, ends, and the thread deletes the state.
      impl_->thread.detach();
      impl_->orphaned = true;
      (void)impl_.release();
      return;
    }
    impl_->thread.join();
  }
}

const protocol::Session& KernelClient::session() const {
  return impl_->session;
}

std::string KernelClient::send(Channel channel, protocol::Message msg, RequestHandlers handlers) {
  std::string id = msg.msg_id();
  impl_->enqueue(Router::Outgoing{channel, std::move(msg), nullptr, std::move(handlers)});
  return id;
}

void KernelClient::post(Channel channel, protocol::EnvelopePtr msg) {
  impl_->enqueue(Router::Outgoing{channel, {}, std::move(msg), std::nullopt});
}

void KernelClient::send_input(const protocol::Message& input_request, std::string value) {
  protocol::Message reply =
      impl_->session.make_reply(input_request, "input_reply", json{{"value", std::move(value)}});
  reply.identities.clear();  // a DEALER adds its own routing id
  impl_->enqueue(Router::Outgoing{Channel::kStdin, std::move(reply), nullptr, std::nullopt});
}

Result<json> KernelClient::wait_ready(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::optional<json> info;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= std::chrono::milliseconds(0)) {
      break;
    }
    // Until iopub is live the idle status may be lost, so wait for the reply alone. The kernel
    // publishes a status for every request: once one arrives, the subscription is proven. The
    // status of the first request is usually published before our subscription reached the
    // kernel, so ask again at once rather than wait for it.
    auto attempt = request(Channel::kShell, "kernel_info_request", json::object(),
                           std::min(left, std::chrono::milliseconds(1000)), false);
    if (attempt && attempt->end == RequestEnd::kKernelDead) {
      return make_error(ErrorCode::kUnavailable, "kernel_dead", "the kernel died while starting");
    }
    if (attempt && attempt->reply) {
      info = attempt->reply->content;
      impl_->router.settle_heartbeat(*info);
      for (int i = 0; i < 20 && !impl_->router.iopub_seen(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (impl_->router.iopub_seen()) {
        return *info;
      }
    }
  }
  return make_error(ErrorCode::kDeadlineExceeded, "kernel_not_ready",
                    info ? "the kernel answered kernel_info_request but its iopub channel "
                           "delivered nothing within " +
                               std::to_string(timeout.count()) + " ms"
                         : "the kernel did not answer kernel_info_request within " +
                               std::to_string(timeout.count()) + " ms");
}

bool KernelClient::is_alive() const {
  return impl_->router.alive();
}

std::string KernelClient::death_reason() const {
  return impl_->router.death_reason();
}

std::size_t KernelClient::wire_errors() const {
  return impl_->router.wire_errors();
}

}  // namespace cellgate::kernel
