// Internal: the launcher's side of "no output lost" — a ZeroMQ SUB socket on its kernel's iopub
// that fills an IopubSpool (spool.hpp), and a unix socket (--spool-socket, in the kernel's
// runtime dir, which only the gateway reaches) where a gateway asks for what it missed.
//
//   auto spool = SpoolService::start(iopub_endpoint, socket_path, access_gid);   // after started
//   std::vector<pollfd> fds = {...};  spool->add_pollfds(fds);
//   poll(fds.data(), fds.size(), spool->poll_timeout_ms(timeout));
//   spool->on_poll(fds);            // drains iopub, answers a request
//
// Created only once the kernel has started, after the launcher's last fork: libzmq's I/O thread
// (the launcher's only other thread, all signals blocked in it) never sees a fork. A request is
// answered in place, bounded: its line must come within kRequestTimeout and be at most
// kMaxRequestBytes, and the reply is cut off after kReplyTimeout, so a stuck reader delays the
// launcher's signal forwarding by seconds at most. Nothing fails the launch: a spool that cannot
// start is logged and the kernel runs without one.
//
// A checkpoint holds the spool: CRIU cannot dump a jail whose unix stream leads out of it, and
// the SUB socket is one. `{"hold":true}\n` closes the SUB socket and ends libzmq's I/O thread
// (zmq_ctx_term waits for the descriptors to close) before it answers `{"held":true}\n`;
// `{"hold":false}\n` connects again and answers `{"held":false}\n`. What the kernel publishes
// while held is not spooled (the gateway holds it only while its own sockets are closed too, for
// the dump). Any other request ends a hold first: a gateway killed mid-snapshot leaves none for
// the next one to find.
//
// Thread-safety: the launcher's one thread.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/unique_fd.hpp"
#include "spool.hpp"

namespace cellgate::launcher {

class SpoolService {
 public:
  static constexpr std::size_t kMaxRequestBytes = 4096;
  static constexpr std::chrono::milliseconds kRequestTimeout{2000};
  static constexpr std::chrono::milliseconds kReplyTimeout{10000};
  // Messages drained per wake-up before signals and requests get their turn.
  static constexpr int kDrainBatch = 256;

  // nullptr (and a line on stderr) when it cannot start; `socket_path` "" : no spool.
  static std::unique_ptr<SpoolService> start(const std::string& iopub_endpoint,
                                             const std::string& socket_path,
                                             std::optional<gid_t> access_gid);
  ~SpoolService();
  SpoolService(const SpoolService&) = delete;
  SpoolService& operator=(const SpoolService&) = delete;

  // Appends its descriptors (the SUB socket's ZMQ_FD, the listening socket).
  void add_pollfds(std::vector<pollfd>& fds) const;
  // 0 while iopub has messages left from the last batch, else `timeout_ms`.
  int poll_timeout_ms(int timeout_ms) const { return backlog_ ? 0 : timeout_ms; }
  // After poll(): drains iopub (a batch), answers at most one request.
  void on_poll(const std::vector<pollfd>& fds);

  const IopubSpool& spool() const { return spool_; }
  bool held() const { return !zmq_; }

 private:
  struct Zmq;
  SpoolService();
  // Connects the SUB socket; false (with a line on stderr) when it cannot.
  bool subscribe();
  void drain();
  void serve_one();

  std::string iopub_endpoint_;
  std::unique_ptr<Zmq> zmq_;  // null while held
  UniqueFd listen_;
  std::string socket_path_;
  IopubSpool spool_{kSpoolBudgetBytes};
  bool backlog_ = true;  // drain once at the start: ZMQ_FD is edge-triggered
};

}  // namespace cellgate::launcher
