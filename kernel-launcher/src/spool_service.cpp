#include "spool_service.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "cellgate/sys/error_text.hpp"

namespace cellgate::launcher {
namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// Waits for `events` on `fd` until `deadline`; false on timeout or error.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n > 0) {
      return true;
    }
    if (n == 0 || errno != EINTR) {
      return false;
    }
  }
}

bool send_all(int fd, const std::string& data, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && errno == EAGAIN && wait_for(fd, POLLOUT, deadline)) {
      continue;
    }
    return false;
  }
  return true;
}

void warn(const std::string& text) {
  std::cerr << "cellgate-kernel: warning: iopub spool: " << text << "\n";
}

}  // namespace

struct SpoolService::Zmq {
  zmq::context_t context{1};
  zmq::socket_t sub{context, zmq::socket_type::sub};
  int fd = -1;
};

SpoolService::SpoolService() = default;

SpoolService::~SpoolService() {
  if (listen_) {
    ::unlink(socket_path_.c_str());
  }
  if (zmq_) {
    zmq_->sub.close();
    zmq_->context.close();
  }
}

std::unique_ptr<SpoolService> SpoolService::start(const std::string& iopub_endpoint,
                                                  const std::string& socket_path,
                                                  std::optional<gid_t> access_gid) {
  if (socket_path.empty() || iopub_endpoint.empty()) {
    return nullptr;
  }
  std::unique_ptr<SpoolService> s(new SpoolService());
  s->socket_path_ = socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) {
    warn("the socket path " + socket_path + " is too long for a unix socket; no spool");
    return nullptr;
  }
  socket_path.copy(addr.sun_path, socket_path.size());
  s->listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  ::unlink(socket_path.c_str());
  if (!s->listen_ ||
      ::bind(s->listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    warn("bind('" + socket_path + "'): " + sys::error_text(errno) + "; no spool");
    s->listen_.reset();
    return nullptr;
  }
  // The gateway alone: root's, or an unprivileged gateway's access group.
  if (::chmod(socket_path.c_str(), access_gid ? 0660 : 0600) != 0 ||
      (access_gid && ::chown(socket_path.c_str(), static_cast<uid_t>(-1), *access_gid) != 0) ||
      ::listen(s->listen_.get(), 4) != 0) {
    warn("chmod/listen('" + socket_path + "'): " + sys::error_text(errno) + "; no spool");
    return nullptr;
  }
  s->iopub_endpoint_ = iopub_endpoint;
  if (!s->subscribe()) {
    return nullptr;
  }
  return s;
}

bool SpoolService::subscribe() {
  try {
    auto zmq = std::make_unique<Zmq>();
    auto& sub = zmq->sub;
    sub.set(zmq::sockopt::linger, 0);
    // No frame larger than the whole budget is ever kept: libzmq drops the connection instead
    // of buffering it (and reconnects).
    sub.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kSpoolBudgetBytes));
    // Few messages wait in the launcher, as in the gateway (zmq_transport.cpp): when it drains
    // slower than the kernel prints, the rest waits in the kernel's PUB queue (its cgroup's
    // memory), or is dropped for this subscriber alone. libzmq's default, 1,000 messages of up
    // to 8 MiB a frame, would let a kernel park gigabytes in its launcher while it answers a
    // request.
    sub.set(zmq::sockopt::rcvhwm, 32);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(iopub_endpoint_);
    zmq->fd = sub.get(zmq::sockopt::fd);
    zmq_ = std::move(zmq);
  } catch (const zmq::error_t& e) {
    warn(std::string("SUB on ") + iopub_endpoint_ + ": " + e.what() + "; no spool");
    return false;
  }
  backlog_ = true;  // ZMQ_FD is edge-triggered: drain once before waiting on it
  return true;
}

void SpoolService::add_pollfds(std::vector<pollfd>& fds) const {
  if (zmq_) {
    fds.push_back({zmq_->fd, POLLIN, 0});
  }
  fds.push_back({listen_.get(), POLLIN, 0});
}

void SpoolService::on_poll(const std::vector<pollfd>& fds) {
  drain();
  for (const auto& p : fds) {
    if (p.fd == listen_.get() && (p.revents & POLLIN) != 0) {
      serve_one();
      drain();  // the answer took a while: what came meanwhile
    }
  }
}

void SpoolService::drain() {
  backlog_ = false;
  if (!zmq_) {
    return;  // held
  }
  try {
    for (int n = 0; n < kDrainBatch; ++n) {
      std::vector<std::string> frames;
      for (bool more = true; more;) {
        zmq::message_t part;
        if (!zmq_->sub.recv(part, zmq::recv_flags::dontwait)) {
          if (frames.empty()) {
            return;  // nothing left: ZMQ_FD will signal again
          }
          // The rest of a multipart message is already queued (atomic delivery); not reached.
          break;
        }
        more = part.more();
        if (frames.size() <= IopubSpool::kMaxFrames) {
          frames.emplace_back(static_cast<const char*>(part.data()), part.size());
        }
      }
      spool_.add(std::move(frames));
    }
    backlog_ = true;
  } catch (const zmq::error_t& e) {
    warn(std::string("recv: ") + e.what());
  }
}

void SpoolService::serve_one() {
  UniqueFd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!conn) {
    return;
  }
  const auto read_deadline = Clock::now() + kRequestTimeout;
  std::string line;
  char buf[512];
  while (line.find('\n') == std::string::npos) {
    if (line.size() > kMaxRequestBytes || !wait_for(conn.get(), POLLIN, read_deadline)) {
      return;
    }
    const ssize_t n = ::read(conn.get(), buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
      return;
    }
    if (n > 0) {
      line.append(buf, static_cast<std::size_t>(n));
    }
  }
  line.resize(line.find('\n'));
  const auto request = nlohmann::json::parse(line, nullptr, false);
  if (!request.is_object()) {
    send_all(conn.get(), "{\"error\":\"a request is one JSON object on a line\"}\n",
             Clock::now() + kRequestTimeout);
    return;
  }
  const auto deadline = Clock::now() + kReplyTimeout;
  if (auto hold = request.find("hold"); hold != request.end() && hold->is_boolean()) {
    if (hold->get<bool>()) {
      // zmq_ctx_term (the context's destructor) returns once libzmq's I/O thread has closed
      // the socket's descriptors: the jail then has no stream leading here.
      zmq_.reset();
    } else if (!zmq_) {
      (void)subscribe();  // a failure leaves it held, and says so below
    }
    send_all(conn.get(), std::string("{\"held\":") + (zmq_ ? "false" : "true") + "}\n", deadline);
    return;
  }
  if (!zmq_) {
    (void)subscribe();  // a gateway that held it died before it let go
  }
  std::optional<std::string> after;
  if (auto it = request.find("after"); it != request.end() && it->is_string()) {
    after = it->get<std::string>();
  }
  drain();  // up to date before answering
  auto reply = spool_.after(after);
  if (auto it = request.find("head_only"); it != request.end() && it->is_boolean() && *it) {
    reply.messages.clear();
    reply.bytes = 0;
  }
  if (send_all(conn.get(), reply.head(kSpoolBudgetBytes), deadline)) {
    send_all(conn.get(), reply.body(), deadline);
  }
}

}  // namespace cellgate::launcher
