// Internal: one HTTP connection, one request at a time (HttpSession), and the Exchange its
// handler answers through (HttpExchange). Templated on the stream so it runs over TCP, TLS
// (plain_session.cpp, tls_session.cpp) and Beast's in-memory test::stream (tests/unit,
// tests/fuzz); an upgrade hands the stream to a WsSession (ws_session.hpp).
//
//   std::make_shared<HttpSession<beast::tcp_stream>>(handler, options, std::move(socket))->run();
//
// Thread-safety: each session lives on its own strand (the stream's executor); HttpExchange's
// methods may be called from any thread and post onto it.
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cellgate/http/handler.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/http/listener.hpp"
#include "session_parts.hpp"
#include "stream_ops.hpp"
#include "ws_session.hpp"

namespace cellgate::http::detail {

namespace bhttp = beast::http;

// ---- HTTP: one connection, one request at a time ----------------------------------------------
//
// While a request is being answered the session keeps a read posted on the connection, so it
// learns when the client goes away mid-answer (an agent that gave up on a long cell) and can tell
// the handler through Exchange::watch(). Bytes that arrive meanwhile (a pipelined request) stay in
// the buffer for the next read, and end the watching.

template <class Stream>
class HttpSession;

// Exchange over one HttpSession: every call is posted onto the session's strand.
template <class Stream>
class HttpExchange : public Exchange {
 public:
  HttpExchange(std::shared_ptr<HttpSession<Stream>> session,
               std::shared_ptr<const std::atomic<bool>> gone,
               std::shared_ptr<std::atomic<std::size_t>> unsent, std::string peer)
      : session_(std::move(session)),
        gone_(std::move(gone)),
        unsent_(std::move(unsent)),
        peer_(std::move(peer)) {}
  // The exchange lives wherever the answer is made (an offload thread, a cell's strand): its
  // reference to the session is let go on the session's strand, so the session is never
  // destroyed on another thread.
  ~HttpExchange() override {
    auto strand = session_->stream_.get_executor();
    net::post(strand, [s = std::move(session_)] {});
  }
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;
  std::string peer() const override { return peer_; }

  void reply(Response res) override {
    net::post(session_->stream_.get_executor(),
              [s = session_, res = std::move(res)]() mutable { s->send(std::move(res)); });
  }
  void begin(Response head) override {
    net::post(session_->stream_.get_executor(), [s = session_, head = std::move(head)]() mutable {
      s->stream_begin(std::move(head));
    });
  }
  bool write(std::string data) override {
    if (gone_->load()) {
      return false;
    }
    if (data.empty()) {
      return true;  // a zero-size chunk would end the answer
    }
    std::string framed = chunk(data);
    unsent_->fetch_add(framed.size());
    net::post(session_->stream_.get_executor(),
              [s = session_, framed = std::move(framed)]() mutable {
                s->stream_push(std::move(framed));
              });
    return true;
  }
  std::size_t unsent() const override { return unsent_->load(); }
  void abort() override {
    net::post(session_->stream_.get_executor(), [s = session_] { s->stream_abort(); });
  }
  void end() override {
    net::post(session_->stream_.get_executor(), [s = session_] { s->stream_end(); });
  }
  void watch(std::function<void()> on_gone) override {
    net::post(session_->stream_.get_executor(),
              [s = session_, f = std::move(on_gone)]() mutable { s->set_on_gone(std::move(f)); });
  }

 private:
  std::shared_ptr<HttpSession<Stream>> session_;
  std::shared_ptr<const std::atomic<bool>> gone_;
  std::shared_ptr<std::atomic<std::size_t>> unsent_;
  std::string peer_;
};

// What an HttpSession is doing. One request at a time; while it is answered a read stays posted
// to notice the client leaving (kWatching), unless bytes of the next request already wait in
// the buffer (kAnswering: the client is there, and those bytes are parsed once the answer is out).
//
//   start ──▶ kReading ──a request──▶ kWatching ──the watching read brings bytes──▶ kAnswering
//             ▲  │  ▲                    │    (a 400/413/431, or a refused upgrade: kAnswering)
//             │  │  │                    ├──answered──▶ kResuming ──the read is back──┐
//             │  │  └──answered (kAnswering, keep-alive)─────────────────────────────┘│
//             │  └──end of stream, a dropped read, an upgrade (the WsSession has the  ││
//             │     stream), an answer with Connection: close ──▶ kClosed             ││
//             └────────────────────────────────────────────────────────────────────────┘
//   kWatching, kAnswering ──the client left, a write failed, too far behind──▶ kGone
//
// kGone and kClosed are final: nothing more is read, and the session ends with its last
// handler. kGone is what the exchange's `gone` flag tells other threads.
enum class HttpPhase {
  kReading,    // (the TLS handshake, then) a request head, then its body
  kWatching,   // answering, with a read posted to notice the client leaving
  kAnswering,  // answering, without a read posted
  kResuming,   // answered while the watching read was out: its completion starts the next read
  kGone,       // the client left mid-answer
  kClosed,     // no further request on this connection
};

// A streamed answer's writes, one in flight at a time:
//
//   kIdle ──a piece queued──▶ kWriting ──the queue drained──▶ kIdle
//                                │ end()
//                                ▼
//                           kWritingLast ──the queue drained──▶ kIdle, the answer is complete
enum class StreamWriter { kIdle, kWriting, kWritingLast };

template <class Stream>
class HttpSession : public std::enable_shared_from_this<HttpSession<Stream>> {
 public:
  static constexpr bool kTls = kIsTls<Stream>;
  // A streamed answer the client does not read: past this many unsent bytes it is dropped.
  static constexpr std::size_t kMaxStreamQueueBytes = 64u << 20;

  template <class... Args>
  HttpSession(Handler& handler, const HttpOptions& options, Args&&... args)
      : stream_(std::forward<Args>(args)...), handler_(handler), options_(options) {}

  // Something held as long as the connection is open, HTTP or WebSocket (the listener's count
  // of open connections).
  void hold(std::shared_ptr<void> slot) { slot_ = std::move(slot); }

  void run() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&HttpSession::start, this->shared_from_this()));
  }

 private:
  friend class HttpExchange<Stream>;

  bool answering() const {
    return phase_ == HttpPhase::kWatching || phase_ == HttpPhase::kAnswering;
  }
  bool gone() const { return phase_ == HttpPhase::kGone; }

  void start() {
    if constexpr (kTls) {
      set_deadline(stream_, std::chrono::seconds(30));
      stream_.async_handshake(
          ssl::stream_base::server,
          beast::bind_front_handler(&HttpSession::on_handshake, this->shared_from_this()));
    } else {
      do_read();
    }
  }

  void on_handshake(beast::error_code ec) {
    if (ec) {
      phase_ = HttpPhase::kClosed;
      return;
    }
    do_read();
  }

  void do_read() {
    phase_ = HttpPhase::kReading;
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);  // narrowed per route once the head is in
    parser_->header_limit(static_cast<std::uint32_t>(options_.max_header_bytes));
    // A connection that has not had a request answered (not yet authenticated) gets a short
    // time for its request head: idle sockets must not hold descriptors for long.
    set_deadline(stream_, trusted_ ? std::chrono::seconds(60)
                                   : std::chrono::seconds(options_.header_timeout_seconds));
    read_head();
  }

  // Gathers the request head in buffer_ before Beast parses it (scan_head says why).
  void read_head() {
    const std::string_view data(static_cast<const char*>(buffer_.cdata().data()), buffer_.size());
    auto scan = scan_head(data, options_.max_header_bytes);
    switch (scan.kind) {
      case HeadScan::Kind::kBad:
        return reject(Status::bad_request, "Bad Request", scan.message);
      case HeadScan::Kind::kPartial:
        stream_.async_read_some(
            buffer_.prepare(4096),
            beast::bind_front_handler(&HttpSession::on_head_bytes, this->shared_from_this()));
        return;
      case HeadScan::Kind::kComplete:
        break;
    }
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        beast::bind_front_handler(&HttpSession::on_header, this->shared_from_this()));
  }

  void on_head_bytes(beast::error_code ec, std::size_t n) {
    if (ec) {
      if (ec == net::error::eof && buffer_.size() == 0) {
        return do_eof();
      }
      phase_ = HttpPhase::kClosed;
      return;  // timeouts, resets, a head cut short: drop the connection
    }
    buffer_.commit(n);
    read_head();
  }

  void on_header(beast::error_code ec, std::size_t) {
    if (ec) {
      return on_read(ec, 0);
    }
    const auto& head = parser_->get();
    const std::size_t limit = body_limit_for(options_, head.method(), head.target());
    if (auto length = parser_->content_length(); length && *length > limit) {
      return reject_body(limit);  // before a byte of the body is read
    }
    parser_->body_limit(limit);  // a chunked body is cut off when it passes it
    set_deadline(stream_, std::chrono::seconds(60));
    bhttp::async_read(stream_, buffer_, *parser_,
                      beast::bind_front_handler(&HttpSession::on_read, this->shared_from_this()));
  }

  // An error answer, then the connection is closed (what follows on it cannot be trusted).
  void reject(Status status, const std::string& reason, const std::string& message) {
    count_rejected(options_, status);
    phase_ = HttpPhase::kAnswering;
    send(refusal(status, reason, message));
  }

  void reject_body(std::size_t limit) {
    reject(Status::payload_too_large, "Payload Too Large",
           "the request body is over the limit of " + std::to_string(limit) + " bytes");
  }

  void on_read(beast::error_code ec, std::size_t) {
    switch (classify_read(ec)) {
      case ReadFailure::kNone:
        break;
      case ReadFailure::kEnd:
        return do_eof();
      case ReadFailure::kBodyLimit:
        return reject_body(
            parser_->is_header_done()
                ? body_limit_for(options_, parser_->get().method(), parser_->get().target())
                : options_.max_body_bytes);
      case ReadFailure::kHeaderLimit:
        return reject(Status::request_header_fields_too_large, "Request Header Fields Too Large",
                      "the request headers are over the limit");
      case ReadFailure::kMalformed:
        return reject(Status::bad_request, "Bad Request", "malformed request: " + ec.message());
      case ReadFailure::kDrop:
        phase_ = HttpPhase::kClosed;
        return;
    }
    Request req = parser_->release();
    if (websocket::is_upgrade(req)) {
      Upgrade upgrade = handler_.upgrade(req);
      if (upgrade.refusal || !upgrade.handler) {
        Response refused = upgrade.refusal
                               ? std::move(*upgrade.refusal)
                               : error_response(req, make_error(ErrorCode::kNotFound, "not_found",
                                                                "no WebSocket here"));
        refused.keep_alive(false);
        phase_ = HttpPhase::kAnswering;
        return send(std::move(refused));
      }
      phase_ = HttpPhase::kClosed;  // the stream is the WebSocket session's now
      auto ws = std::make_shared<WsSession<Stream>>(std::move(stream_), std::move(upgrade.handler),
                                                    std::move(upgrade.subprotocol), options_);
      ws->hold(std::move(slot_));
      ws->run(std::move(req));
      return;
    }
    // The answer may take as long as a cell runs: no deadline until it is written.
    clear_deadline(stream_);
    phase_ = HttpPhase::kAnswering;
    keep_alive_ = req.keep_alive();
    gone_flag_ = std::make_shared<std::atomic<bool>>(false);
    unsent_ = std::make_shared<std::atomic<std::size_t>>(0);
    watch_client();
    handler_.handle(std::move(req),
                    std::make_shared<HttpExchange<Stream>>(this->shared_from_this(), gone_flag_,
                                                           unsent_, peer_address(stream_)));
  }

  // ---- noticing a client that leaves mid-answer ----

  void watch_client() {
    // Bytes already waiting (a pipelined request) show the client is there; the next request
    // is parsed from them once this answer is out, so there is nothing to watch for.
    if (phase_ != HttpPhase::kAnswering || buffer_.size() > 0) {
      return;
    }
    phase_ = HttpPhase::kWatching;
    stream_.async_read_some(
        buffer_.prepare(4096),
        beast::bind_front_handler(&HttpSession::on_watch, this->shared_from_this()));
  }

  void on_watch(beast::error_code ec, std::size_t n) {
    if (phase_ == HttpPhase::kWatching) {
      phase_ = HttpPhase::kAnswering;
    }
    if (ec) {
      client_gone();
      if (phase_ == HttpPhase::kResuming) {
        phase_ = HttpPhase::kClosed;  // answered, but the client left before its next request
      }
      return;
    }
    buffer_.commit(n);
    if (phase_ == HttpPhase::kAnswering) {
      watch_client();
    } else if (phase_ == HttpPhase::kResuming) {
      do_read();
    }
  }

  void client_gone() {
    if (!answering()) {
      return;
    }
    phase_ = HttpPhase::kGone;
    gone_flag_->store(true);
    stream_queue_.clear();
    if (on_gone_) {
      auto f = std::move(on_gone_);
      on_gone_ = nullptr;
      f();
    }
  }

  void set_on_gone(std::function<void()> f) {
    if (gone()) {
      f();
    } else if (answering()) {
      on_gone_ = std::move(f);
    }
  }

  // The answer is complete: read the next request once the watching read is back.
  void answered() {
    on_gone_ = nullptr;
    if (gone()) {
      return;
    }
    // (kResuming: a second answer to one request, which a handler must not give.)
    const bool watching = phase_ == HttpPhase::kWatching || phase_ == HttpPhase::kResuming;
    if (!keep_alive_) {
      return do_eof();
    }
    if (watching) {
      phase_ = HttpPhase::kResuming;
      set_deadline(stream_, std::chrono::seconds(60));
    } else {
      do_read();
    }
  }

  // A request answered with anything but 400/401/403/413 shows the client holds the token (or
  // needs none): from then on its connection gets the long idle deadline.
  void note_status(Status status) {
    if (proves_client(status)) {
      trusted_ = true;
    }
  }

  // ---- a whole response ----

  void stamp(Response& res) const {
    for (const auto& [name, value] : options_.response_headers) {
      res.set(name, value);
    }
  }

  void send(Response res) {
    stamp(res);
    note_status(res.result());
    keep_alive_ = keep_alive_ && res.keep_alive();
    response_ = std::make_shared<Response>(std::move(res));
    bhttp::async_write(stream_, *response_,
                       beast::bind_front_handler(&HttpSession::on_write, this->shared_from_this()));
  }

  void on_write(beast::error_code ec, std::size_t) {
    response_.reset();
    if (ec) {
      client_gone();
      return;
    }
    answered();
  }

  // ---- a streamed response (chunked transfer coding) ----

  void stream_begin(Response head) {
    stamp(head);
    note_status(head.result());
    keep_alive_ = keep_alive_ && head.keep_alive();
    stream_push(chunked_head(std::move(head)));
  }

  // The answer cut short: what was queued is dropped and the connection closed.
  void stream_abort() {
    if (gone()) {
      return;
    }
    client_gone();
    close_stream(stream_);
  }

  void stream_end() {
    stream_push(std::string(kLastChunk));
    if (writer_ == StreamWriter::kWriting) {
      writer_ = StreamWriter::kWritingLast;
    }
  }

  void stream_push(std::string bytes) {
    if (gone()) {
      return;
    }
    stream_queued_ += bytes.size();
    if (stream_queued_ > kMaxStreamQueueBytes) {
      spdlog::warn("a client fell {} bytes behind a streamed answer; disconnecting it",
                   stream_queued_);
      client_gone();
      close_stream(stream_);
      return;
    }
    stream_queue_.push_back(std::move(bytes));
    if (writer_ == StreamWriter::kIdle) {
      writer_ = StreamWriter::kWriting;
      stream_write_next();
    }
  }

  void stream_write_next() {
    // The piece being written is held apart from the queue, which client_gone() may clear.
    stream_in_flight_ = std::move(stream_queue_.front());
    stream_queue_.pop_front();
    net::async_write(
        stream_, net::buffer(stream_in_flight_),
        beast::bind_front_handler(&HttpSession::on_stream_write, this->shared_from_this()));
  }

  void on_stream_write(beast::error_code ec, std::size_t) {
    const StreamWriter was = std::exchange(writer_, StreamWriter::kIdle);
    stream_queued_ -= std::min(stream_queued_, stream_in_flight_.size());
    // What the exchange counted (its chunks; the head and the last chunk were never counted).
    for (std::size_t left = unsent_->load(), sent = stream_in_flight_.size();
         !unsent_->compare_exchange_weak(left, left - std::min(left, sent));) {
    }
    stream_in_flight_.clear();
    if (ec) {
      client_gone();
      return;
    }
    if (gone()) {
      return;  // dropped meanwhile
    }
    if (!stream_queue_.empty()) {
      writer_ = was;
      return stream_write_next();
    }
    if (was == StreamWriter::kWritingLast) {
      stream_queued_ = 0;
      answered();
    }
  }

  void do_eof() {
    phase_ = HttpPhase::kClosed;
    if constexpr (kTls) {
      set_deadline(stream_, std::chrono::seconds(5));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {});
    } else {
      shutdown_send(stream_);
    }
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<Response> response_;
  Handler& handler_;
  const HttpOptions& options_;
  std::shared_ptr<void> slot_;

  HttpPhase phase_ = HttpPhase::kReading;
  // Facts about the client and its request, not states: the client proved it holds the token
  // (note_status), and the request and its answer allow a next one on this connection.
  bool trusted_ = false;
  bool keep_alive_ = true;
  // kGone for the exchange's threads (HttpExchange::write), one flag per request.
  std::shared_ptr<std::atomic<bool>> gone_flag_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<std::size_t>> unsent_ = std::make_shared<std::atomic<std::size_t>>(0);
  std::function<void()> on_gone_;
  StreamWriter writer_ = StreamWriter::kIdle;
  std::deque<std::string> stream_queue_;
  std::string stream_in_flight_;
  std::size_t stream_queued_ = 0;
};

}  // namespace cellgate::http::detail
