#include "zmq_transport.hpp"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cellgate/kernel/client.hpp"
#include "cellgate/sys/error_text.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::kernel {

struct ZmqContext {
  zmq::context_t context{1};  // one I/O thread, started with the first socket
};

std::shared_ptr<ZmqContext> make_zmq_context() {
  return std::make_shared<ZmqContext>();
}

namespace {

constexpr int kReconnectIvlMs = 10;
// Capped low: a kernel binds its sockets some 50 ms after its launcher reports it started, and
// an exponential back-off would leave the first connection waiting up to twice that.
constexpr int kReconnectIvlMaxMs = 20;
constexpr int kIopubReceiveHwm = 32;  // iopub messages queued in the gateway per kernel

Error zmq_failure(const std::string& what, const zmq::error_t& e) {
  return make_error(ErrorCode::kUnavailable, "zmq_error", what + ": " + e.what());
}

// The transport waits in epoll on each socket's ZMQ_FD and the wake fd, not in zmq::poll:
// zmq::poll asks every socket for its events before and after it sleeps, and each ask is a poll
// and a getpid system call (libzmq's mailbox check), ~14 per wakeup for six sockets. Here a
// socket is asked only when its fd fired, or after something that may have taken its
// notification without reading its messages: a send on it, or the socket being new. A socket
// read until EAGAIN signals its fd again when more arrives.
enum Sock : std::size_t {
  kShellSock,
  kControlSock,
  kStdinSock,
  kIopubSock,
  kHbSock,
  kMonitorSock,
  kSockCount
};

std::size_t sock_of(Channel channel) {
  switch (channel) {
    case Channel::kShell:
      return kShellSock;
    case Channel::kControl:
      return kControlSock;
    case Channel::kStdin:
      return kStdinSock;
    case Channel::kIopub:
      return kIopubSock;
    case Channel::kHeartbeat:
      return kHbSock;
  }
  return kShellSock;
}

class ZmqTransport : public Transport {
 public:
  ZmqTransport(const ConnectionInfo& info, const ClientOptions& options, std::string routing_id)
      : info_(info),
        max_message_bytes_(options.limits.max_message_bytes),
        routing_id_(std::move(routing_id)),
        zmq_context_(options.zmq_context ? options.zmq_context : make_zmq_context()),
        context_(zmq_context_->context) {
    fds_.fill(-1);
  }

  Result<void> open() {
    try {
      shell_ = zmq::socket_t(context_, zmq::socket_type::dealer);
      control_ = zmq::socket_t(context_, zmq::socket_type::dealer);
      stdin_ = zmq::socket_t(context_, zmq::socket_type::dealer);
      for (auto* s : {&shell_, &control_, &stdin_}) {
        configure(*s);
      }
      // The stdin socket must share the shell socket's routing id: the kernel sends
      // input_request to the identity that sent the execute_request.
      shell_.set(zmq::sockopt::routing_id, routing_id_);
      stdin_.set(zmq::sockopt::routing_id, routing_id_);
      open_iopub();
      shell_.connect(info_.endpoint(Channel::kShell));
      control_.connect(info_.endpoint(Channel::kControl));
      stdin_.connect(info_.endpoint(Channel::kStdin));
      open_heartbeat();
    } catch (const zmq::error_t& e) {
      return zmq_failure("connecting to the kernel's sockets", e);
    }
    const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake < 0) {
      return errno_error(ErrorCode::kInternal, "eventfd", "eventfd()", errno);
    }
    wake_fd_.reset(wake);
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) {
      return errno_error(ErrorCode::kInternal, "epoll", "epoll_create1()", errno);
    }
    epoll_fd_.reset(ep);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kSockCount;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) {
      return errno_error(ErrorCode::kInternal, "epoll", "epoll_ctl(ADD, eventfd)", errno);
    }
    return {};
  }

  bool send(Channel channel, std::vector<std::string> frames) override {
    zmq::multipart_t multipart;
    for (auto& f : frames) {
      multipart.addstr(std::move(f));
    }
    const std::size_t i = sock_of(channel);
    dirty_[i] = true;  // a send may take the notification of a message that arrived meanwhile
    try {
      // DEALER queues while the peer is away (up to the high-water mark); dontwait keeps a full
      // queue from blocking the loop.
      return multipart.send(sock(i), ZMQ_DONTWAIT);
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  bool ping() override {
    try {
      if (hb_.send(zmq::str_buffer("ping"), zmq::send_flags::dontwait)) {
        dirty_[kHbSock] = true;  // the send may have taken the reply's notification
        return true;
      }
    } catch (const zmq::error_t&) {
    }
    return false;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    try {
      if (!sync_epoll()) {
        return false;
      }
      ready_ = {};
      bool any = false;
      for (std::size_t i = 0; i < kSockCount; ++i) {
        if (dirty_[i]) {
          dirty_[i] = false;
          ready_[i] = readable(i);
          any = any || ready_[i];
        }
      }
      std::array<epoll_event, kSockCount + 1> events{};
      const int n = ::epoll_wait(epoll_fd_.get(), events.data(), static_cast<int>(events.size()),
                                 any ? 0 : static_cast<int>(timeout.count()));
      if (n < 0 && errno != EINTR) {
        spdlog::error("kernel client: epoll_wait failed: {}", sys::error_text(errno));
        return false;
      }
      for (int e = 0; e < n; ++e) {
        const std::size_t i = events[static_cast<std::size_t>(e)].data.u64;
        if (i == kSockCount) {
          std::uint64_t value = 0;
          [[maybe_unused]] ssize_t got = ::read(wake_fd_.get(), &value, sizeof value);
        } else if (!ready_[i]) {
          ready_[i] = readable(i);  // also takes the notification that fired the fd
        }
      }
      return true;
    } catch (const zmq::error_t&) {
      return false;  // the context is gone; nothing more can be done on these sockets
    }
  }

  bool receive(TransportEvents& events) override {
    try {
      if (ready_[kMonitorSock]) {
        drain_iopub_monitor(events);
      }
      if (ready_[kShellSock]) {
        drain(shell_, Channel::kShell, events);
      }
      if (ready_[kControlSock]) {
        drain(control_, Channel::kControl, events);
      }
      if (ready_[kStdinSock]) {
        drain(stdin_, Channel::kStdin, events);
      }
      if (ready_[kIopubSock] || reopen_iopub_pending_) {
        drain(iopub_, Channel::kIopub, events);
      }
      if (reopen_iopub_pending_) {
        reopen_iopub();  // what the old socket still held was taken just above
        events.on_iopub_reopened();
      }
      if (ready_[kHbSock]) {
        drain_heartbeat(events);
      }
      ready_ = {};
      return true;
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  void wake() override {
    std::uint64_t one = 1;
    // A full eventfd counter still wakes the reader; nothing to handle on failure.
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  }

  std::string name() const override { return info_.endpoint(Channel::kShell); }

 private:
  void configure(zmq::socket_t& s) {
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::reconnect_ivl, kReconnectIvlMs);
    s.set(zmq::sockopt::reconnect_ivl_max, kReconnectIvlMaxMs);
    // A frame larger than the whole-message limit is refused by libzmq before it is buffered.
    s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_message_bytes_));
  }

  // The iopub SUB and the monitor that sees it disconnected (a new pair each time: see
  // reopen_iopub). libzmq drops the connection when a frame is over maxmsgsize, before a byte of
  // it is buffered: that is how an oversized output shows. Throws zmq::error_t.
  void open_iopub() {
    iopub_ = zmq::socket_t(context_, zmq::socket_type::sub);
    configure(iopub_);
    iopub_.set(zmq::sockopt::subscribe, "");
    // Few messages wait in the gateway: when it parses slower than a kernel prints, the rest
    // waits in the kernel's own PUB queue (its cgroup's memory), so a cell printing a gigabyte
    // in 1 MiB pieces costs the gateway tens of MiB, not the default 1000 messages' worth.
    iopub_.set(zmq::sockopt::rcvhwm, kIopubReceiveHwm);
    const std::string monitor_endpoint =
        "inproc://iopub-monitor-" + routing_id_ + "-" + std::to_string(++iopub_generation_);
    if (zmq_socket_monitor(iopub_.handle(), monitor_endpoint.c_str(), ZMQ_EVENT_DISCONNECTED) !=
        0) {
      throw zmq::error_t();
    }
    iopub_monitor_ = zmq::socket_t(context_, zmq::socket_type::pair);
    iopub_monitor_.set(zmq::sockopt::linger, 0);
    iopub_monitor_.connect(monitor_endpoint);
    iopub_.connect(info_.endpoint(Channel::kIopub));
  }

  // libzmq ends an iopub session on a protocol error (an oversized frame is one) and does not
  // reconnect it, so iopub would stay silent for the rest of the kernel's life. A disconnect()
  // and connect() on the same socket can abort libzmq (fq.cpp `!_more`) when the cut left part
  // of a message in its queue; a new socket has no such state.
  void reopen_iopub() {
    reopen_iopub_pending_ = false;
    zmq_socket_monitor(iopub_.handle(), nullptr, 0);
    iopub_monitor_.close();
    iopub_.close();
    try {
      open_iopub();
    } catch (const zmq::error_t& e) {
      spdlog::warn("reopening a kernel's iopub ({}) failed: {}", info_.endpoint(Channel::kIopub),
                   e.what());
    }
  }

  void open_heartbeat() {
    hb_ = zmq::socket_t(context_, zmq::socket_type::req);
    configure(hb_);
    // After a lost ping the REQ socket may send again; replies to old pings are dropped.
    hb_.set(zmq::sockopt::req_relaxed, 1);
    hb_.set(zmq::sockopt::req_correlate, 1);
    hb_.connect(info_.endpoint(Channel::kHeartbeat));
  }

  zmq::socket_t& sock(std::size_t i) {
    switch (i) {
      case kShellSock:
        return shell_;
      case kControlSock:
        return control_;
      case kStdinSock:
        return stdin_;
      case kIopubSock:
        return iopub_;
      case kHbSock:
        return hb_;
      default:
        return iopub_monitor_;
    }
  }

  bool readable(std::size_t i) {
    if (sock(i).handle() == nullptr) {
      return false;
    }
    return (sock(i).get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  }

  // Keeps the epoll set on the current sockets: iopub and its monitor are replaced on a cut,
  // which open_iopub counts in iopub_generation_ (a new socket may reuse the old one's address,
  // so the handle alone does not tell). Returns false when the context is gone.
  bool sync_epoll() {
    const bool replaced = registered_generation_ != iopub_generation_;
    registered_generation_ = iopub_generation_;
    std::array<bool, kSockCount> changed{};
    // Every old fd out first: a closed one's number may already belong to a new socket.
    for (std::size_t i = 0; i < kSockCount; ++i) {
      changed[i] = sock(i).handle() != registered_[i] ||
                   (replaced && (i == kIopubSock || i == kMonitorSock));
      if (changed[i] && fds_[i] >= 0) {
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fds_[i], nullptr);  // gone if libzmq closed it
        fds_[i] = -1;
      }
    }
    for (std::size_t i = 0; i < kSockCount; ++i) {
      if (!changed[i]) {
        continue;
      }
      registered_[i] = sock(i).handle();
      dirty_[i] = true;
      if (registered_[i] == nullptr) {
        continue;
      }
      try {
        fds_[i] = sock(i).get(zmq::sockopt::fd);
      } catch (const zmq::error_t&) {
        return false;
      }
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = i;
      if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fds_[i], &ev) != 0) {
        spdlog::warn("kernel client: epoll_ctl(ADD) failed: {}", sys::error_text(errno));
      }
    }
    return true;
  }

  void drain(zmq::socket_t& socket, Channel channel, TransportEvents& events) {
    for (;;) {
      std::vector<zmq::message_t> parts;
      std::optional<size_t> got;
      try {
        got = zmq::recv_multipart(socket, std::back_inserter(parts), zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        return;
      }
      if (!got) {
        return;
      }
      std::vector<std::string_view> views;
      views.reserve(parts.size());
      for (auto& p : parts) {
        views.emplace_back(static_cast<const char*>(p.data()), p.size());
      }
      events.on_frames(channel, views, [&parts] { parts.clear(); });
    }
  }

  void drain_iopub_monitor(TransportEvents& events) {
    for (;;) {
      std::vector<zmq::message_t> parts;
      std::optional<size_t> got;
      try {
        got = zmq::recv_multipart(iopub_monitor_, std::back_inserter(parts),
                                  zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        return;
      }
      if (!got) {
        return;
      }
      std::uint16_t event = 0;
      if (!parts.empty() && parts[0].size() >= sizeof event) {
        std::memcpy(&event, parts[0].data(), sizeof event);
      }
      if (event == ZMQ_EVENT_DISCONNECTED && events.on_iopub_cut()) {
        // A kernel that dies disconnects too: the router's notice waits until the kernel
        // publishes again on the reopened socket or echoes a later ping, so a death is never
        // called a drop.
        reopen_iopub_pending_ = true;  // after this pass: reopen_iopub()
        return;
      }
    }
  }

  void drain_heartbeat(TransportEvents& events) {
    for (;;) {
      zmq::message_t reply;
      std::optional<size_t> got;
      try {
        got = hb_.recv(reply, zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        return;
      }
      if (!got) {
        return;
      }
      // REQ_CORRELATE drops echoes of earlier pings: this one answers the last ping sent, which
      // the router compares with the time iopub was reopened before it counts it as a sign of life.
      events.on_pong();
    }
  }

  const ConnectionInfo info_;
  const std::size_t max_message_bytes_;
  const std::string routing_id_;
  // ClientOptions::zmq_context (one per gateway), or the transport's own; before the sockets,
  // which must close first.
  const std::shared_ptr<ZmqContext> zmq_context_;
  zmq::context_t& context_;
  zmq::socket_t shell_, control_, stdin_, iopub_, hb_;
  zmq::socket_t iopub_monitor_;  // disconnections of iopub (zmq_socket_monitor)
  UniqueFd wake_fd_;
  UniqueFd epoll_fd_;

  // The I/O thread's: what epoll watches, and which sockets to ask.
  std::array<void*, kSockCount> registered_{};
  std::array<int, kSockCount> fds_{};
  std::array<bool, kSockCount> dirty_{};
  std::array<bool, kSockCount> ready_{};
  int registered_generation_ = -1;
  int iopub_generation_ = 0;
  bool reopen_iopub_pending_ = false;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_zmq_transport(const ConnectionInfo& info,
                                                      const ClientOptions& options,
                                                      const std::string& routing_id) {
  auto transport = std::make_unique<ZmqTransport>(info, options, routing_id);
  CELLGATE_TRY(transport->open());
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace cellgate::kernel
