#include "cellgate/kernel/client.hpp"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cellgate/unique_fd.hpp"

namespace cellgate::kernel {

struct ZmqContext {
  zmq::context_t context{1};  // one I/O thread, started with the first socket
};

std::shared_ptr<ZmqContext> make_zmq_context() {
  return std::make_shared<ZmqContext>();
}

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The field that marks a stream message the gateway made to say output was lost (clients ignore
// content fields they do not know; the agent API's collector makes a notice of it).
constexpr const char* kDroppedMark = "cellgate_dropped";

constexpr int kReconnectIvlMs = 10;
// Capped low: a kernel binds its sockets some 50 ms after its launcher reports it started, and
// an exponential back-off would leave the first connection waiting up to twice that.
constexpr int kReconnectIvlMaxMs = 20;
constexpr int kIopubReceiveHwm = 32;  // iopub messages queued in the gateway per kernel
constexpr std::chrono::milliseconds kIdleGrace{3000};  // after a reply, for its idle status
constexpr std::chrono::milliseconds kIdleCheck{250};

Error zmq_failure(const std::string& what, const zmq::error_t& e) {
  return make_error(ErrorCode::kUnavailable, "zmq_error", what + ": " + e.what());
}

}  // namespace

// ---- the I/O thread and its state ------------------------------------------------------------

struct KernelClient::Impl {
  struct Outgoing {
    Channel channel;
    protocol::Message msg;                    // unless `envelope` is set
    protocol::EnvelopePtr envelope;           // a client's message, forwarded as it is
    std::optional<RequestHandlers> handlers;  // register a route before sending
  };
  struct Route {
    RequestHandlers handlers;
    bool got_reply = false;
    bool got_idle = false;
    Clock::time_point reply_at;  // when got_reply became true
  };

  ConnectionInfo info;
  ClientOptions options;
  protocol::Session session;
  protocol::Signer signer;

  // ClientOptions::zmq_context (one per gateway), or the client's own; before the sockets, which
  // must close first.
  std::shared_ptr<ZmqContext> zmq_context;
  zmq::context_t& context;
  zmq::socket_t shell, control, stdin_sock, iopub, hb;
  // Disconnections of iopub (zmq_socket_monitor). libzmq drops the connection when a frame is
  // over maxmsgsize, before a byte of it is buffered: that is how an oversized output shows.
  zmq::socket_t iopub_monitor;
  UniqueFd wake_fd;

  std::mutex mu;  // guards `outgoing`, `stopping` and `dead_reason`
  std::deque<Outgoing> outgoing;
  bool stopping = false;

  std::atomic<bool> alive{true};
  std::string dead_reason;  // why declare_dead() was called; set before `alive` turns false
  std::atomic<bool> iopub_seen{false};
  std::atomic<std::size_t> wire_error_count{0};

  // I/O thread only.
  std::unordered_map<std::string, Route> routes;
  bool hb_outstanding = false;
  bool hb_ever_answered = false;
  int hb_misses = 0;        // unanswered pings in a row
  int hb_quiet_misses = 0;  // of those, the ones in a row the progress probe found no progress in
  bool hb_busy_logged = false;  // this silence was logged as busy, not dead
  bool kernel_busy = false;     // the kernel's last iopub status, whoever's request it was for
  json busy_parent = json::object();  // parent_header of the last "busy" status
  // iopub was disconnected and the kernel has not yet been heard from since: see
  // note_iopub_disconnected().
  bool iopub_drop_pending = false;
  bool reopen_iopub_pending = false;
  int iopub_generation = 0;
  std::size_t oversized_count = 0;
  // ClientOptions::heartbeat_while_busy, once known (wait_ready() settles an unset one).
  std::atomic<bool> hb_while_busy{false};
  Clock::time_point hb_sent_at{};
  Clock::time_point hb_next_at{};

  std::thread thread;

  Impl(ConnectionInfo i, ClientOptions o, protocol::Signer s)
      : info(std::move(i)),
        options(std::move(o)),
        session(options.username),
        signer(std::move(s)),
        zmq_context(options.zmq_context ? options.zmq_context : make_zmq_context()),
        context(zmq_context->context) {
    hb_while_busy.store(options.heartbeat_while_busy.value_or(false));
  }

  void configure(zmq::socket_t& s) {
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::reconnect_ivl, kReconnectIvlMs);
    s.set(zmq::sockopt::reconnect_ivl_max, kReconnectIvlMaxMs);
    // A frame larger than the whole-message limit is refused by libzmq before it is buffered.
    s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options.limits.max_message_bytes));
  }

  Result<void> open_sockets() {
    try {
      // The stdin socket must share the shell socket's routing id: the kernel sends
      // input_request to the identity that sent the execute_request.
      const std::string routing_id = session.id();
      shell = zmq::socket_t(context, zmq::socket_type::dealer);
      control = zmq::socket_t(context, zmq::socket_type::dealer);
      stdin_sock = zmq::socket_t(context, zmq::socket_type::dealer);
      for (auto* s : {&shell, &control, &stdin_sock}) {
        configure(*s);
      }
      shell.set(zmq::sockopt::routing_id, routing_id);
      stdin_sock.set(zmq::sockopt::routing_id, routing_id);
      open_iopub();
      shell.connect(info.endpoint(Channel::kShell));
      control.connect(info.endpoint(Channel::kControl));
      stdin_sock.connect(info.endpoint(Channel::kStdin));
      open_heartbeat();
    } catch (const zmq::error_t& e) {
      return zmq_failure("connecting to the kernel's sockets", e);
    }
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) {
      return errno_error(ErrorCode::kInternal, "eventfd", "eventfd()", errno);
    }
    wake_fd.reset(fd);
    return {};
  }

  // The iopub SUB and the monitor that sees it disconnected (a new pair each time: see
  // drain_iopub_monitor). Throws zmq::error_t.
  void open_iopub() {
    iopub = zmq::socket_t(context, zmq::socket_type::sub);
    configure(iopub);
    iopub.set(zmq::sockopt::subscribe, "");
    // Few messages wait in the gateway: when it parses slower than a kernel prints, the rest
    // waits in the kernel's own PUB queue (its cgroup's memory), so a cell printing a gigabyte
    // in 1 MiB pieces costs the gateway tens of MiB, not the default 1000 messages' worth.
    iopub.set(zmq::sockopt::rcvhwm, kIopubReceiveHwm);
    const std::string monitor_endpoint =
        "inproc://iopub-monitor-" + session.id() + "-" + std::to_string(++iopub_generation);
    if (zmq_socket_monitor(iopub.handle(), monitor_endpoint.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
      throw zmq::error_t();
    }
    iopub_monitor = zmq::socket_t(context, zmq::socket_type::pair);
    iopub_monitor.set(zmq::sockopt::linger, 0);
    iopub_monitor.connect(monitor_endpoint);
    iopub.connect(info.endpoint(Channel::kIopub));
  }

  // libzmq ends an iopub session on a protocol error (an oversized frame is one) and does not
  // reconnect it, so iopub would stay silent for the rest of the kernel's life. A disconnect()
  // and connect() on the same socket can abort libzmq (fq.cpp `!_more`) when the cut left part
  // of a message in its queue; a new socket has no such state.
  void reopen_iopub() {
    reopen_iopub_pending = false;
    // Set only now: what the old socket still held (drained just before) was published before
    // the cut and proves nothing; a message on the new socket means the kernel lives on.
    iopub_drop_pending = true;
    zmq_socket_monitor(iopub.handle(), nullptr, 0);
    iopub_monitor.close();
    iopub.close();
    try {
      open_iopub();
    } catch (const zmq::error_t& e) {
      spdlog::warn("reopening a kernel's iopub ({}) failed: {}", info.endpoint(Channel::kIopub),
                   e.what());
    }
  }

  void open_heartbeat() {
    hb = zmq::socket_t(context, zmq::socket_type::req);
    configure(hb);
    // After a lost ping the REQ socket may send again; replies to old pings are dropped.
    hb.set(zmq::sockopt::req_relaxed, 1);
    hb.set(zmq::sockopt::req_correlate, 1);
    hb.connect(info.endpoint(Channel::kHeartbeat));
  }

  void wake() {
    uint64_t one = 1;
    // A full eventfd counter still wakes the reader; nothing to handle on failure.
    [[maybe_unused]] ssize_t n = ::write(wake_fd.get(), &one, sizeof one);
  }

  void enqueue(Outgoing out) {
    {
      std::lock_guard lock(mu);
      outgoing.push_back(std::move(out));
    }
    wake();
  }

  // ---- the loop ----

  // The loop waits in epoll on each socket's ZMQ_FD and the wake fd, not in zmq::poll: zmq::poll
  // asks every socket for its events before and after it sleeps, and each ask is a poll and a
  // getpid system call (libzmq's mailbox check), ~14 per wakeup for six sockets. Here a socket
  // is asked only when its fd fired, or after something that may have taken its notification
  // without reading its messages: a send on it, or the socket being new. A socket read until
  // EAGAIN signals its fd again when more arrives.
  enum Sock : std::size_t {
    kShellSock,
    kControlSock,
    kStdinSock,
    kIopubSock,
    kHbSock,
    kMonitorSock,
    kSockCount
  };

  zmq::socket_t& sock(std::size_t i) {
    switch (i) {
      case kShellSock:
        return shell;
      case kControlSock:
        return control;
      case kStdinSock:
        return stdin_sock;
      case kIopubSock:
        return iopub;
      case kHbSock:
        return hb;
      default:
        return iopub_monitor;
    }
  }

  static std::size_t sock_of(Channel channel) {
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

  // Keeps the epoll set on the current sockets: iopub and its monitor are replaced on a cut,
  // which open_iopub counts in iopub_generation (a new socket may reuse the old one's address,
  // so the handle alone does not tell). Returns false when the context is gone.
  bool sync_epoll(int ep, std::array<void*, kSockCount>& registered,
                  std::array<int, kSockCount>& fds, std::array<bool, kSockCount>& dirty,
                  int& registered_generation) {
    const bool replaced = registered_generation != iopub_generation;
    registered_generation = iopub_generation;
    std::array<bool, kSockCount> changed{};
    // Every old fd out first: a closed one's number may already belong to a new socket.
    for (std::size_t i = 0; i < kSockCount; ++i) {
      changed[i] =
          sock(i).handle() != registered[i] || (replaced && (i == kIopubSock || i == kMonitorSock));
      if (changed[i] && fds[i] >= 0) {
        ::epoll_ctl(ep, EPOLL_CTL_DEL, fds[i], nullptr);  // gone already if libzmq closed it
        fds[i] = -1;
      }
    }
    for (std::size_t i = 0; i < kSockCount; ++i) {
      if (!changed[i]) {
        continue;
      }
      registered[i] = sock(i).handle();
      dirty[i] = true;
      if (registered[i] == nullptr) {
        continue;
      }
      try {
        fds[i] = sock(i).get(zmq::sockopt::fd);
      } catch (const zmq::error_t&) {
        return false;
      }
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = i;
      if (::epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
        spdlog::warn("kernel client: epoll_ctl(ADD) failed: {}", std::strerror(errno));
      }
    }
    return true;
  }

  bool readable(std::size_t i) {
    if (sock(i).handle() == nullptr) {
      return false;
    }
    return (sock(i).get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  }

  void run() {
    UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
    if (ep.get() < 0) {
      spdlog::error("kernel client: epoll_create1 failed: {}", std::strerror(errno));
      end_all(RequestEnd::kCancelled);
      return;
    }
    {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kSockCount;
      ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev);
    }
    std::array<void*, kSockCount> registered{};
    std::array<int, kSockCount> fds;
    fds.fill(-1);
    std::array<bool, kSockCount> dirty{};
    int registered_generation = -1;
    std::array<epoll_event, kSockCount + 1> events{};
    try {
      for (;;) {
        if (!sync_epoll(ep.get(), registered, fds, dirty, registered_generation)) {
          break;
        }
        const bool hb_was_outstanding = hb_outstanding;
        auto timeout = heartbeat_tick();
        if (hb_outstanding && !hb_was_outstanding) {
          dirty[kHbSock] = true;  // the ping's send may have taken the reply's notification
        }
        if (awaiting_idle() && (timeout.count() < 0 || timeout > kIdleCheck)) {
          timeout = kIdleCheck;
        }
        std::array<bool, kSockCount> ready{};
        bool any = false;
        for (std::size_t i = 0; i < kSockCount; ++i) {
          if (dirty[i]) {
            dirty[i] = false;
            ready[i] = readable(i);
            any = any || ready[i];
          }
        }
        const int n = ::epoll_wait(ep.get(), events.data(), static_cast<int>(events.size()),
                                   any ? 0 : static_cast<int>(timeout.count()));
        if (n < 0 && errno != EINTR) {
          spdlog::error("kernel client: epoll_wait failed: {}", std::strerror(errno));
          break;
        }
        for (int e = 0; e < n; ++e) {
          const std::size_t i = events[e].data.u64;
          if (i == kSockCount) {
            uint64_t value = 0;
            [[maybe_unused]] ssize_t got = ::read(wake_fd.get(), &value, sizeof value);
          } else if (!ready[i]) {
            ready[i] = readable(i);  // also takes the notification that fired the fd
          }
        }
        if (!drain_outgoing(dirty)) {
          break;
        }
        if (ready[kMonitorSock]) {
          drain_iopub_monitor();
        }
        if (ready[kShellSock]) {
          drain(shell, Channel::kShell);
        }
        if (ready[kControlSock]) {
          drain(control, Channel::kControl);
        }
        if (ready[kStdinSock]) {
          drain(stdin_sock, Channel::kStdin);
        }
        if (ready[kIopubSock] || reopen_iopub_pending) {
          drain(iopub, Channel::kIopub);
        }
        if (reopen_iopub_pending) {
          reopen_iopub();  // what the old socket still held was taken just above
        }
        if (ready[kHbSock]) {
          drain_heartbeat();
        }
        complete_lost_idles();
      }
    } catch (const zmq::error_t&) {
      // the context is gone; nothing more can be done on these sockets
    }
    end_all(RequestEnd::kCancelled);
  }

  // Sends what callers queued. Returns false when the client is stopping.
  // A socket sent on is marked in `dirty` (a send may take the notification of a message
  // that arrived meanwhile).
  bool drain_outgoing(std::array<bool, kSockCount>& dirty) {
    std::deque<Outgoing> batch;
    bool stop = false;
    {
      std::lock_guard lock(mu);
      batch.swap(outgoing);
      stop = stopping;
    }
    if (stop) {
      return false;
    }
    for (auto& out : batch) {
      const std::string id = out.envelope ? out.envelope->header().msg_id : out.msg.msg_id();
      if (out.handlers) {
        if (!alive.load()) {
          if (out.handlers->on_end) {
            out.handlers->on_end(RequestEnd::kKernelDead);
          }
          continue;
        }
        routes.emplace(id, Route{std::move(*out.handlers), false, false, {}});
      }
      std::vector<std::string> frames =
          out.envelope ? out.envelope->to_wire(signer) : protocol::encode(out.msg, signer);
      zmq::multipart_t multipart;
      for (auto& f : frames) {
        multipart.addstr(std::move(f));
      }
      try {
        // DEALER queues while the peer is away (up to the high-water mark); dontwait keeps a
        // full queue from blocking the loop.
        const std::size_t i = sock_of(out.channel);
        dirty[i] = true;
        if (!multipart.send(sock(i), ZMQ_DONTWAIT)) {
          fail_route(id, RequestEnd::kKernelDead);
        }
      } catch (const zmq::error_t&) {
        fail_route(id, RequestEnd::kKernelDead);
      }
    }
    return true;
  }

  void drain(zmq::socket_t& socket, Channel channel) {
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
      if (channel == Channel::kIopub && iopub_drop_pending) {
        notify_oversized();  // the kernel is alive and publishing: it was no death
      }
      std::vector<std::string_view> views;
      views.reserve(parts.size());
      for (auto& p : parts) {
        views.emplace_back(static_cast<const char*>(p.data()), p.size());
      }
      auto env = protocol::Envelope::from_wire(channel, std::span<const std::string_view>(views),
                                               signer, options.limits);
      if (!env) {
        wire_error_count.fetch_add(1);
        if (options.on_wire_error) {
          options.on_wire_error(channel, env.error());
        }
        if (channel == Channel::kIopub) {
          tell_dropped(views, env.error());
        }
        continue;
      }
      parts.clear();  // the envelope owns copies; free the frames before dispatching
      dispatch(channel, std::move(env).value());
    }
  }

  // Routes on the header alone: the content is parsed only by a handler that asks for it (and
  // for status messages, whose execution_state completes requests).
  void dispatch(Channel channel, const protocol::EnvelopePtr& env) {
    if (channel == Channel::kIopub) {
      iopub_seen.store(true);
      if (!hb_while_busy.load(std::memory_order_relaxed) && env->header().msg_type == "status") {
        const bool busy = env->message().content.value("execution_state", "") == "busy";
        if (kernel_busy && !busy) {
          hb_misses = 0;  // pings lost while it ran the cell are not held against it
        }
        kernel_busy = busy;
      }
      if (env->header().msg_type == "status" &&
          env->message().content.value("execution_state", "") == "busy") {
        busy_parent = env->message().parent_header;
      }
      if (options.on_iopub) {
        options.on_iopub(env);
      }
    }
    auto it = routes.find(env->parent().msg_id);
    if (it == routes.end() || env->parent().msg_id.empty()) {
      if (options.on_unrouted && channel != Channel::kIopub) {
        options.on_unrouted(env);
      }
      return;
    }
    Route& route = it->second;
    if (route.handlers.on_envelope) {
      route.handlers.on_envelope(env);
    } else if (route.handlers.on_message) {
      route.handlers.on_message(channel, env->message());
    }
    if (channel == Channel::kShell || channel == Channel::kControl) {
      route.got_reply = true;
      route.reply_at = Clock::now();
    } else if (channel == Channel::kIopub && env->header().msg_type == "status" &&
               env->message().content.value("execution_state", "") == "idle") {
      route.got_idle = true;
    }
    if (route.got_reply && (route.got_idle || !route.handlers.wait_for_idle)) {
      RequestHandlers handlers = std::move(route.handlers);
      routes.erase(it);
      if (handlers.on_end) {
        handlers.on_end(RequestEnd::kComplete);
      }
    }
  }

  // The kernel's PUB socket drops messages when the gateway's iopub queue is full, so the idle
  // status of a request may never come. A request whose reply is in completes kIdleGrace after
  // it, idle or not (jupyter_client's nbclient does the same with its iopub_timeout).
  bool awaiting_idle() const {
    for (const auto& [id, r] : routes) {
      if (r.got_reply && !r.got_idle && r.handlers.wait_for_idle) {
        return true;
      }
    }
    return false;
  }

  void complete_lost_idles() {
    const auto now = Clock::now();
    for (auto it = routes.begin(); it != routes.end();) {
      Route& r = it->second;
      if (r.got_reply && !r.got_idle && r.handlers.wait_for_idle &&
          now - r.reply_at >= kIdleGrace) {
        RequestHandlers handlers = std::move(r.handlers);
        it = routes.erase(it);
        if (handlers.on_end) {
          handlers.on_end(RequestEnd::kComplete);
        }
      } else {
        ++it;
      }
    }
  }

  void fail_route(const std::string& id, RequestEnd end) {
    auto it = routes.find(id);
    if (it == routes.end()) {
      return;
    }
    RequestHandlers handlers = std::move(it->second.handlers);
    routes.erase(it);
    if (handlers.on_end) {
      handlers.on_end(end);
    }
  }

  void end_all(RequestEnd end) {
    auto taken = std::move(routes);
    routes.clear();
    for (auto& [id, route] : taken) {
      if (route.handlers.on_end) {
        route.handlers.on_end(end);
      }
    }
  }

  // ---- heartbeat ----

  // Sends a ping when one is due, counts misses, and returns how long poll may sleep.
  std::chrono::milliseconds heartbeat_tick() {
    const auto interval = options.heartbeat_interval;
    if (!alive.load()) {
      return std::chrono::milliseconds(-1);
    }
    auto now = Clock::now();
    if (hb_outstanding && now - hb_sent_at >= interval) {
      hb_outstanding = false;
      const bool excused = !hb_while_busy.load(std::memory_order_relaxed) && kernel_busy;
      if (hb_ever_answered && !excused && count_miss()) {
        return std::chrono::milliseconds(-1);
      }
      now = Clock::now();  // the probe read files
      hb_next_at = now;
    }
    if (!hb_outstanding && now >= hb_next_at) {
      try {
        if (hb.send(zmq::str_buffer("ping"), zmq::send_flags::dontwait)) {
          hb_outstanding = true;
          hb_sent_at = now;
        } else {
          hb_next_at = now + interval;
        }
      } catch (const zmq::error_t&) {
        hb_next_at = now + interval;
      }
    }
    auto due = hb_outstanding ? hb_sent_at + interval : hb_next_at;
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(due - now);
    return std::max(wait, std::chrono::milliseconds(1));
  }

  // One more unanswered ping. Returns true when it made the kernel dead: `heartbeat_misses` in a
  // row while the progress probe (if any) found the process making no progress.
  bool count_miss() {
    ++hb_misses;
    Progress progress{Progress::State::kStalled, ""};
    if (options.progress) {
      progress = options.progress();
    }
    if (progress.state == Progress::State::kRunning) {
      hb_quiet_misses = 0;
      // Said once a silence is as long as one that would have been a death without the probe.
      if (!hb_busy_logged && hb_misses >= options.heartbeat_misses) {
        hb_busy_logged = true;
        spdlog::info("kernel {}: no answer to {} heartbeats in a row, but {}: busy, not dead",
                     name(), hb_misses, progress.why);
      }
      return false;
    }
    if (++hb_quiet_misses < options.heartbeat_misses) {
      return false;
    }
    const auto interval = options.heartbeat_interval.count();
    std::string reason = "no answer to " + std::to_string(hb_misses) + " heartbeats in a row (" +
                         std::to_string(hb_misses * interval) + " ms)";
    if (options.progress) {
      reason += ", and for the last " + std::to_string(hb_quiet_misses * interval) + " ms " +
                progress.why;
    }
    declare_dead(reason);
    return true;
  }

  std::string name() const {
    return options.log_name.empty() ? info.endpoint(Channel::kShell) : options.log_name;
  }

  // ---- oversized messages ----

  void drain_iopub_monitor() {
    for (;;) {
      std::vector<zmq::message_t> parts;
      std::optional<size_t> got;
      try {
        got = zmq::recv_multipart(iopub_monitor, std::back_inserter(parts),
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
      if (event == ZMQ_EVENT_DISCONNECTED && alive.load()) {
        // A kernel that dies disconnects too: the notice waits until the kernel publishes again
        // on the reopened socket, so a death is never called a drop.
        reopen_iopub_pending = true;  // after this pass of the loop: reopen_iopub()
        return;
      }
    }
  }

  // iopub was cut while the kernel lives: libzmq refused a frame over maxmsgsize (nothing else
  // makes a live PUB drop its subscriber). The message, and whatever the kernel queued behind it
  // on the cut connection, is gone; the clients are told so on iopub, as stderr of the request
  // that was running (a notice the agent API's cell result keeps like any output).
  void notify_oversized() {
    iopub_drop_pending = false;
    ++oversized_count;
    const std::size_t limit = options.limits.max_message_bytes;
    const std::string limit_text = limit >= (1u << 20) && limit % (1u << 20) == 0
                                       ? std::to_string(limit >> 20) + " MiB"
                                       : std::to_string(limit) + " bytes";
    spdlog::warn(
        "a kernel's iopub connection was cut while it ran on (a message over {}, "
        "maxmsgsize?); clients told",
        limit_text);
    protocol::Message msg = session.make(
        "stream", json{{"name", "stderr"},
                       {"text",
                        "[cellgate] output dropped: the connection carrying the kernel's "
                        "output was cut while the kernel ran on, most likely by a message "
                        "over the " +
                            limit_text +
                            " limit (--max-kernel-message-bytes); "
                            "that output and any queued behind it were lost\n"},
                       {kDroppedMark, true}});
    msg.parent_header = busy_parent;  // the request that ran last: the likely sender
    dispatch(Channel::kIopub, protocol::Envelope::from_message(Channel::kIopub, std::move(msg)));
  }

  // A signed iopub message the gateway cannot pass on (a frame that is not JSON, or nests deeper
  // than protocol::kMaxJsonDepth): the clients of the request it answers read why on stderr,
  // as a kernel's own output, instead of losing it without a word. Unsigned or malformed
  // envelopes are not the kernel's and are only counted.
  void tell_dropped(std::span<const std::string_view> frames, const Error& why) {
    if (why.reason != "invalid_json" && why.reason != "bad_shape" && why.reason != "too_deep") {
      return;
    }
    auto raw = protocol::split(frames, options.limits);
    if (!raw || !protocol::verify(*raw, signer)) {
      return;
    }
    auto header = protocol::peek_header(raw->header);
    json parent = busy_parent;
    if (protocol::is_valid_json(raw->parent_header)) {  // simdjson: depth checked first
      json p = json::parse(raw->parent_header, nullptr, /*allow_exceptions=*/false);
      if (p.is_object()) {
        parent = std::move(p);
      }
    }
    std::string type = header ? header->msg_type : std::string("a");
    if (type.size() > 64) {
      type = type.substr(0, 64) + "...";
    }
    protocol::Message msg = session.make(
        "stream", json{{"name", "stderr"},
                       {"text", "[cellgate] a " + type +
                                    " message from the kernel was dropped: " + why.message + "\n"},
                       {kDroppedMark, true}});
    msg.parent_header = std::move(parent);
    dispatch(Channel::kIopub, protocol::Envelope::from_message(Channel::kIopub, std::move(msg)));
  }

  void drain_heartbeat() {
    for (;;) {
      zmq::message_t reply;
      std::optional<size_t> got;
      try {
        got = hb.recv(reply, zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        return;
      }
      if (!got) {
        return;
      }
      // Not a sign of life after an iopub cut: a reply the kernel sent before it died may still
      // be on its way. Only iopub traffic on the reopened socket is (drain()).
      if (hb_outstanding) {
        hb_outstanding = false;
        hb_ever_answered = true;
        if (hb_busy_logged) {
          spdlog::info("kernel {}: answers heartbeats again after {} missed", name(), hb_misses);
        }
        hb_misses = 0;
        hb_quiet_misses = 0;
        hb_busy_logged = false;
        hb_next_at = hb_sent_at + options.heartbeat_interval;
      }
    }
  }

  void declare_dead(const std::string& reason) {
    {
      std::lock_guard lock(mu);
      if (!alive.load()) {
        return;
      }
      dead_reason = reason;  // before `alive` turns false: death_reason() is read after it
      alive.store(false);
    }
    if (options.on_dead) {
      options.on_dead(reason);
    }
    end_all(RequestEnd::kKernelDead);
  }
};

// ---- public API ------------------------------------------------------------------------------

KernelClient::KernelClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<KernelClient>> KernelClient::connect(const ConnectionInfo& info,
                                                            ClientOptions options) {
  CELLGATE_ASSIGN_OR_RETURN(protocol::Signer signer,
                            protocol::Signer::create(info.signature_scheme, info.key));
  auto impl = std::make_unique<Impl>(info, std::move(options), std::move(signer));
  CELLGATE_TRY(impl->open_sockets());
  Impl* raw = impl.get();
  raw->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<KernelClient>(new KernelClient(std::move(impl)));
}

KernelClient::~KernelClient() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake();
  if (impl_->thread.joinable()) {
    if (impl_->thread.get_id() == std::this_thread::get_id()) {
      // The last owner was a handler on the I/O thread itself: joining would deadlock. The loop
      // sees `stopping` and returns; its state must outlive it, so it is left allocated.
      spdlog::error("kernel client destroyed from its own I/O thread; leaking its state");
      impl_->thread.detach();
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
  impl_->enqueue(Impl::Outgoing{channel, std::move(msg), nullptr, std::move(handlers)});
  return id;
}

void KernelClient::post(Channel channel, protocol::EnvelopePtr msg) {
  impl_->enqueue(Impl::Outgoing{channel, {}, std::move(msg), std::nullopt});
}

void KernelClient::send_input(const protocol::Message& input_request, std::string value) {
  protocol::Message reply =
      impl_->session.make_reply(input_request, "input_reply", json{{"value", std::move(value)}});
  reply.identities.clear();  // a DEALER adds its own routing id
  impl_->enqueue(Impl::Outgoing{Channel::kStdin, std::move(reply), nullptr, std::nullopt});
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
      if (!impl_->options.heartbeat_while_busy) {
        // ipykernel ("ipython") answers heartbeats from a thread of its own, busy or not; of any
        // other kernel the gateway assumes only what IRkernel does: answers between requests.
        impl_->hb_while_busy.store(info->is_object() &&
                                   info->value("implementation", "") == "ipython");
      }
      for (int i = 0; i < 20 && !impl_->iopub_seen.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (impl_->iopub_seen.load()) {
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
  return impl_->alive.load();
}
std::string KernelClient::death_reason() const {
  std::lock_guard lock(impl_->mu);
  return impl_->dead_reason;
}
std::size_t KernelClient::wire_errors() const {
  return impl_->wire_error_count.load();
}

}  // namespace cellgate::kernel
