// Internal: the per-connection session classes of the HTTP layer, templated on the stream so they
// run over TCP, TLS, and Beast's in-memory test::stream (tests/unit).
//
// Thread-safety: each session lives on its own strand (the stream's executor); WsSession's
// WsConnection methods may be called from any thread and post onto it.
#pragma once

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <functional>
#include <optional>
#include <sstream>
#include <type_traits>

#include "cellgate/http/handler.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/http/listener.hpp"

namespace cellgate::http::detail {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
namespace bhttp = beast::http;

// Stream capabilities, so one session template serves tcp_stream, ssl_stream and test::stream.
template <class Stream>
void set_deadline(Stream& stream, std::chrono::seconds d) {
  if constexpr (requires { beast::get_lowest_layer(stream).expires_after(d); }) {
    beast::get_lowest_layer(stream).expires_after(d);
  }
}
template <class Stream>
void clear_deadline(Stream& stream) {
  if constexpr (requires { beast::get_lowest_layer(stream).expires_never(); }) {
    beast::get_lowest_layer(stream).expires_never();
  }
}
template <class Stream>
void shutdown_send(Stream& stream) {
  beast::error_code ec;
  if constexpr (requires { stream.socket().shutdown(tcp::socket::shutdown_send, ec); }) {
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  } else if constexpr (requires { stream.close(); }) {
    stream.close();
  }
}
template <class Stream>
void close_stream(Stream& stream) {
  beast::error_code ec;
  if constexpr (requires { beast::get_lowest_layer(stream).socket().close(ec); }) {
    beast::get_lowest_layer(stream).socket().close(ec);
  } else if constexpr (requires { beast::get_lowest_layer(stream).close(); }) {
    beast::get_lowest_layer(stream).close();
  }
}
template <class Stream>
std::string peer_address(Stream& stream) {
  if constexpr (requires { beast::get_lowest_layer(stream).socket().remote_endpoint(); }) {
    beast::error_code ec;
    auto ep = beast::get_lowest_layer(stream).socket().remote_endpoint(ec);
    if (!ec) {
      return ep.address().to_string() + ":" + std::to_string(ep.port());
    }
  }
  return "";
}
template <class Stream>
constexpr bool kIsTls =
    requires(Stream& s) { s.async_handshake(ssl::stream_base::server, [](beast::error_code) {}); };

// ---- WebSocket: one client connection, bridged to a WsHandler ---------------------------------

template <class Stream>
class WsSession;

// The WsConnection a handler holds: a weak handle on the session plus its strand. Every call is
// posted to the strand, where the session is locked, so no other thread ever holds the session:
// it is destroyed on its strand, after its last handler, never under Beast's feet.
template <class Stream>
class WsOutbox : public WsConnection {
 public:
  WsOutbox(net::any_io_executor strand, std::weak_ptr<WsSession<Stream>> session)
      : strand_(std::move(strand)), session_(std::move(session)) {}
  void send(std::shared_ptr<const OutFrame> frame) override {
    net::post(strand_, [weak = session_, frame = std::move(frame)] {
      if (auto session = weak.lock()) {
        session->enqueue(frame);
      }
    });
  }
  void close(std::uint16_t code, std::string reason) override {
    net::post(strand_, [weak = session_, code, reason = std::move(reason)] {
      if (auto session = weak.lock()) {
        session->begin_close(static_cast<websocket::close_code>(code), reason);
      }
    });
  }

 private:
  net::any_io_executor strand_;
  std::weak_ptr<WsSession<Stream>> session_;
};

template <class Stream>
class WsSession : public std::enable_shared_from_this<WsSession<Stream>> {
 public:
  WsSession(Stream&& stream, std::shared_ptr<WsHandler> handler, std::string subprotocol,
            const HttpOptions& options)
      : ws_(std::move(stream)),
        handler_(std::move(handler)),
        subprotocol_(std::move(subprotocol)),
        options_(options) {}
  WsSession(const WsSession&) = delete;
  WsSession& operator=(const WsSession&) = delete;
  ~WsSession() {
    if (dropped_for_memory_) {
      // Tens of MiB just went back to malloc, in the arenas of whichever threads allocated
      // them; without a trim the gateway's RSS stays at its high-water mark after the attack.
      queue_.clear();
      in_flight_.reset();
      buffer_ = beast::flat_buffer();
      ::malloc_trim(0);
    }
  }

  void hold(std::shared_ptr<void> slot) { slot_ = std::move(slot); }

  void run(Request req) {
    websocket::stream_base::timeout timeout{};
    timeout.handshake_timeout = std::chrono::seconds(30);
    timeout.idle_timeout =
        options_.ws_ping_interval > 0
            ? std::chrono::milliseconds(static_cast<long long>(options_.ws_ping_interval * 3000))
            : websocket::stream_base::none();
    timeout.keep_alive_pings = options_.ws_ping_interval > 0;
    ws_.set_option(timeout);
    ws_.set_option(websocket::stream_base::decorator(
        [subprotocol = subprotocol_](websocket::response_type& res) {
          res.set(bhttp::field::server, "cellgate");
          if (!subprotocol.empty()) {
            res.set(bhttp::field::sec_websocket_protocol, subprotocol);
          }
        }));
    ws_.read_message_max(options_.max_ws_message_bytes);
    if (options_.ws_budget) {
      account_ =
          options_.ws_budget->open([strand = ws_.get_executor(), weak = this->weak_from_this()] {
            net::post(strand, [weak] {
              if (auto self = weak.lock()) {
                self->on_shed();
              }
            });
          });
    }
    // One frame per message: Beast's default splits outgoing messages into 4 KiB frames, one
    // write each, which costs more CPU than the whole route of a large output.
    ws_.auto_fragment(false);
    clear_deadline(ws_);
    ws_.async_accept(req,
                     beast::bind_front_handler(&WsSession::on_accept, this->shared_from_this()));
  }

 private:
  friend class WsOutbox<Stream>;

  void on_accept(beast::error_code ec) {
    if (ec) {
      return finish();
    }
    open_ = true;
    handler_->on_open(
        std::make_shared<WsOutbox<Stream>>(ws_.get_executor(), this->weak_from_this()));
    do_read();
  }

  // A message is read a piece at a time, so that the bytes of an unfinished one are counted in
  // the shared budget as they arrive (a whole-message read would hold up to the per-message
  // limit on every connection before anything could be counted).
  //
  // The buffer is grown here, not by the read: a read doubles it, and the doubling would only be
  // counted after it happened, so connections growing at once overshot the budget by their
  // doublings (and the copies they left in malloc's arenas). Here it grows by a quarter, and the
  // shared budget is told before the memory is taken; a connection it sheds reads no more.
  void do_read() {
    if (buffer_.capacity() - buffer_.size() < kReadPiece) {
      const std::size_t want = buffer_.size() + std::max(kReadPiece, buffer_.size() / 4);
      if (account_) {
        account_->set(queued_bytes_ + want);
        if (account_->shed()) {
          return on_shed();
        }
      }
      buffer_.max_size(want);  // the cap makes flat_buffer allocate exactly `want`, no doubling
      buffer_.reserve(want);
    }
    ws_.async_read_some(buffer_, kReadPiece,
                        beast::bind_front_handler(&WsSession::on_read, this->shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec) {
      if (ec == websocket::error::message_too_big) {
        spdlog::warn("a WebSocket client sent a message over {} bytes; closing it",
                     options_.max_ws_message_bytes);
      }
      return finish();
    }
    if (!ws_.is_message_done()) {
      account();
      if (!finished_ && !closing_) {
        do_read();
      }
      return;
    }
    const auto data = buffer_.cdata();
    handler_->on_message(std::string_view(static_cast<const char*>(data.data()), data.size()),
                         ws_.got_text());
    buffer_.consume(buffer_.size());
    if (buffer_.capacity() > kKeptReadCapacity) {
      buffer_.shrink_to_fit();  // one large message must not pin its size for the connection
    }
    account();
    if (!finished_ && !closing_) {
      do_read();
    }
  }

  // What this connection holds, told to the shared budget (which may shed the largest holder).
  void account() {
    if (account_) {
      account_->set(queued_bytes_ + buffer_.capacity());
    }
  }

  // The shared budget is over its limit and this connection holds the most: let go of it all.
  void on_shed() {
    if (finished_ || dropped_for_memory_) {  // (do_read may have run it before the posted call)
      return;
    }
    count_drop("memory_budget");
    dropped_for_memory_ = true;
    spdlog::warn(
        "WebSocket connections hold more than the budget of {} bytes (--max-ws-total-bytes); "
        "dropping the one holding the most ({} bytes: {} unsent, {} of an unfinished message)",
        options_.ws_budget->limit(), queued_bytes_ + buffer_.capacity(), queued_bytes_,
        buffer_.capacity());
    queue_.clear();
    queued_bytes_ = in_flight_ ? in_flight_->bytes().size() : 0;
    if (writing_ || buffer_.size() > 0) {
      // A write the client does not read, or a message it is still sending: a close handshake
      // would wait on that client, so the connection is cut at once and its memory let go.
      closing_ = true;
      close_stream(ws_.next_layer());
      account();
      return;
    }
    begin_close(websocket::close_code::policy_error, "gateway memory budget exceeded");
    account();
  }

  void count_drop(const char* why) {
    if (options_.stats) {
      options_.stats->ws_dropped.add(why);
    }
  }

  void enqueue(const std::shared_ptr<const OutFrame>& frame) {
    if (closing_ || finished_) {
      return;
    }
    // Made here, on this connection's strand, the first time any connection asks for it.
    const std::size_t size = frame->bytes().size();
    queued_bytes_ += size;
    if (queued_bytes_ > options_.max_ws_queue_bytes) {
      // A client that does not read must not grow the gateway's memory without bound.
      count_drop("slow_reader");
      dropped_for_memory_ = true;
      spdlog::warn("a WebSocket client fell {} bytes behind (limit {}); disconnecting it",
                   queued_bytes_, options_.max_ws_queue_bytes);
      queued_bytes_ -= size;
      for (const auto& queued : queue_) {
        queued_bytes_ -= queued->bytes().size();
      }
      queue_.clear();
      begin_close(websocket::close_code::policy_error, "client too slow: output queue full");
      // The close frame goes out after the frame being written, which this client is not
      // reading: if it has not read that within 10 s, the connection is cut (the blocked write
      // fails with a timeout), so a client that never reads cannot keep it, and its frame, open.
      set_deadline(ws_.next_layer(), std::chrono::seconds(10));
      account();
      return;
    }
    queue_.push_back(frame);
    if (!writing_) {
      do_write();
    }
    // After the write started: a frame of a client that keeps up is in flight, not queued.
    account();
  }

  void do_write() {
    writing_ = true;
    // The frame being written is held apart from the queue, which may be cleared meanwhile.
    in_flight_ = std::move(queue_.front());
    queue_.pop_front();
    ws_.binary(in_flight_->binary());
    ws_.async_write(net::buffer(in_flight_->bytes()),
                    beast::bind_front_handler(&WsSession::on_write, this->shared_from_this()));
  }

  void on_write(beast::error_code ec, std::size_t) {
    writing_ = false;
    if (in_flight_) {
      queued_bytes_ -= std::min(queued_bytes_, in_flight_->bytes().size());
      in_flight_.reset();
      account();
    }
    if (ec || finished_) {
      return finish();
    }
    if (close_reason_) {
      do_close();
      return;
    }
    if (!queue_.empty()) {
      do_write();
    }
  }

  void begin_close(websocket::close_code code, const std::string& reason) {
    if (closing_ || finished_) {
      return;
    }
    closing_ = true;
    close_reason_ = websocket::close_reason(code, reason.substr(0, 120));
    if (!open_) {
      return finish();
    }
    if (!writing_) {
      do_close();
    }
  }

  void do_close() {
    queue_.clear();
    queued_bytes_ = 0;
    in_flight_.reset();  // no write is in flight: do_close runs only when none is
    account();
    ws_.async_close(*close_reason_,
                    [self = this->shared_from_this()](beast::error_code) { self->finish(); });
  }

  // The connection is over: the handler hears it once, and lets go of us.
  void finish() {
    if (finished_) {
      return;
    }
    finished_ = true;
    queue_.clear();
    queued_bytes_ = in_flight_ ? in_flight_->bytes().size() : 0;
    if (account_) {
      account_->set(queued_bytes_);  // the read buffer goes with the session, soon
    }
    if (auto handler = std::move(handler_)) {
      handler->on_close();
    }
  }

  static constexpr std::size_t kReadPiece = 64u << 10;
  static constexpr std::size_t kKeptReadCapacity = 1u << 20;

  // First, so destroyed last: the budget hears the session let go only once its buffers are
  // freed (its drained callback may trim malloc then).
  std::unique_ptr<ByteBudget::Account> account_;  // in options_.ws_budget; null: none
  websocket::stream<Stream> ws_;
  beast::flat_buffer buffer_;
  bool dropped_for_memory_ = false;  // a slow reader or over the budget: trim when gone
  std::shared_ptr<WsHandler> handler_;
  std::string subprotocol_;
  const HttpOptions& options_;
  std::deque<std::shared_ptr<const OutFrame>> queue_;
  std::shared_ptr<const OutFrame> in_flight_;  // being written; counted in queued_bytes_
  std::size_t queued_bytes_ = 0;
  bool open_ = false;
  bool writing_ = false;
  bool closing_ = false;
  bool finished_ = false;
  std::optional<websocket::close_reason> close_reason_;
  std::shared_ptr<void> slot_;
};

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
               std::shared_ptr<const std::atomic<bool>> gone, std::string peer)
      : session_(std::move(session)), gone_(std::move(gone)), peer_(std::move(peer)) {}
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
    net::post(session_->stream_.get_executor(), [s = session_, data = std::move(data)]() mutable {
      s->stream_chunk(std::move(data));
    });
    return true;
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
  std::string peer_;
};

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
    if (!ec) {
      do_read();
    }
  }

  void do_read() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);  // narrowed per route once the head is in
    parser_->header_limit(static_cast<std::uint32_t>(options_.max_header_bytes));
    // A connection that has not had a request answered (not yet authenticated) gets a short
    // time for its request head: idle sockets must not hold descriptors for long.
    set_deadline(stream_, trusted_ ? std::chrono::seconds(60)
                                   : std::chrono::seconds(options_.header_timeout_seconds));
    read_head();
  }

  // Gathers the request head in buffer_ before Beast parses it, to see its raw lines: Beast
  // accepts obs-fold (RFC 9112 5.2) and folds it into the value, which a proxy in front may not.
  void read_head() {
    const std::string_view data(static_cast<const char*>(buffer_.cdata().data()), buffer_.size());
    const auto end = data.find("\r\n\r\n");
    if (end == std::string_view::npos && data.size() <= options_.max_header_bytes) {
      // Not a whole head yet. Bytes that cannot begin one (https:// to this port, a bare LF,
      // binary) are answered now: waiting for the CRLFCRLF such a client never sends kept it
      // in silence until the header deadline.
      if (auto start = check_head_start(data, options_.max_header_bytes); !start) {
        return reject(Status::bad_request, "Bad Request", start.error().message);
      }
      stream_.async_read_some(
          buffer_.prepare(4096),
          beast::bind_front_handler(&HttpSession::on_head_bytes, this->shared_from_this()));
      return;
    }
    const std::string_view head = data.substr(0, end);
    // A line of the head that starts with SP or HTAB (not the first: leading whitespace there
    // is a malformed request line, which Beast refuses).
    if (head.find("\n ") != std::string_view::npos || head.find("\n\t") != std::string_view::npos) {
      return reject(Status::bad_request, "Bad Request",
                    "obsolete line folding (a header line starting with a space or tab)");
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
    if (options_.stats) {
      options_.stats->rejected.add(status == Status::payload_too_large ? "body_too_large"
                                                                       : "malformed_request");
    }
    Request stub;
    stub.version(11);
    auto res = json_response(stub, status, {{"reason", reason}, {"message", message}});
    res.keep_alive(false);
    answering_ = true;
    send(std::move(res));
  }

  void reject_body(std::size_t limit) {
    reject(Status::payload_too_large, "Payload Too Large",
           "the request body is over the limit of " + std::to_string(limit) + " bytes");
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec == bhttp::error::end_of_stream) {
      return do_eof();
    }
    if (ec == bhttp::error::body_limit) {
      return reject_body(
          parser_->is_header_done()
              ? body_limit_for(options_, parser_->get().method(), parser_->get().target())
              : options_.max_body_bytes);
    }
    if (ec == bhttp::error::header_limit) {
      return reject(Status::request_header_fields_too_large, "Request Header Fields Too Large",
                    "the request headers are over the limit");
    }
    if (ec && ec.category() == bhttp::make_error_code(bhttp::error::bad_target).category() &&
        ec != bhttp::error::partial_message) {
      // A malformed request line, header or body framing: say so before closing.
      return reject(Status::bad_request, "Bad Request", "malformed request: " + ec.message());
    }
    if (ec) {
      return;  // timeouts, resets, a request cut short: drop the connection
    }
    Request req = parser_->release();
    if (websocket::is_upgrade(req)) {
      Upgrade upgrade = handler_.upgrade(req);
      if (upgrade.refusal || !upgrade.handler) {
        Response refusal = upgrade.refusal
                               ? std::move(*upgrade.refusal)
                               : error_response(req, make_error(ErrorCode::kNotFound, "not_found",
                                                                "no WebSocket here"));
        refusal.keep_alive(false);
        answering_ = true;
        return send(std::move(refusal));
      }
      auto ws = std::make_shared<WsSession<Stream>>(std::move(stream_), std::move(upgrade.handler),
                                                    std::move(upgrade.subprotocol), options_);
      ws->hold(std::move(slot_));
      ws->run(std::move(req));
      return;
    }
    // The answer may take as long as a cell runs: no deadline until it is written.
    clear_deadline(stream_);
    answering_ = true;
    keep_alive_ = req.keep_alive();
    gone_flag_ = std::make_shared<std::atomic<bool>>(false);
    watch_client();
    handler_.handle(std::move(req),
                    std::make_shared<HttpExchange<Stream>>(this->shared_from_this(), gone_flag_,
                                                           peer_address(stream_)));
  }

  // ---- noticing a client that leaves mid-answer ----

  void watch_client() {
    // Bytes already waiting (a pipelined request) show the client is there; the next request
    // is parsed from them once this answer is out, so there is nothing to watch for.
    if (watching_ || !answering_ || buffer_.size() > 0) {
      return;
    }
    watching_ = true;
    stream_.async_read_some(
        buffer_.prepare(4096),
        beast::bind_front_handler(&HttpSession::on_watch, this->shared_from_this()));
  }

  void on_watch(beast::error_code ec, std::size_t n) {
    watching_ = false;
    if (ec) {
      client_gone();
      return;
    }
    buffer_.commit(n);
    if (answering_) {
      watch_client();
    } else if (resume_) {
      resume_ = false;
      do_read();
    }
  }

  void client_gone() {
    if (!answering_ || gone_flag_->exchange(true)) {
      return;
    }
    stream_queue_.clear();
    if (on_gone_) {
      auto f = std::move(on_gone_);
      on_gone_ = nullptr;
      f();
    }
  }

  void set_on_gone(std::function<void()> f) {
    if (gone_flag_->load()) {
      f();
    } else if (answering_) {
      on_gone_ = std::move(f);
    }
  }

  // The answer is complete: read the next request once the watching read is back.
  void answered() {
    answering_ = false;
    on_gone_ = nullptr;
    if (gone_flag_ && gone_flag_->load()) {
      return;
    }
    if (!keep_alive_) {
      return do_eof();
    }
    if (watching_) {
      resume_ = true;
      set_deadline(stream_, std::chrono::seconds(60));
    } else {
      do_read();
    }
  }

  // A request answered with anything but 401/403 shows the client holds the token (or needs
  // none): from then on its connection gets the long idle deadline.
  void note_status(Status status) {
    if (status != Status::unauthorized && status != Status::forbidden &&
        status != Status::bad_request && status != Status::payload_too_large) {
      trusted_ = true;
    }
  }

  // ---- a whole response ----

  void send(Response res) {
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
    note_status(head.result());
    head.body().clear();
    head.chunked(true);
    keep_alive_ = keep_alive_ && head.keep_alive();
    std::ostringstream os;
    os << head.base();
    stream_push(os.str());
  }

  void stream_chunk(std::string data) {
    if (data.empty()) {
      return;
    }
    std::ostringstream os;
    os << std::hex << data.size() << "\r\n";
    stream_push(os.str() + data + "\r\n");
  }

  void stream_end() {
    stream_ending_ = true;
    stream_push("0\r\n\r\n");
  }

  void stream_push(std::string bytes) {
    if (gone_flag_->load()) {
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
    if (!stream_writing_) {
      stream_write_next();
    }
  }

  void stream_write_next() {
    stream_writing_ = true;
    // The piece being written is held apart from the queue, which client_gone() may clear.
    stream_in_flight_ = std::move(stream_queue_.front());
    stream_queue_.pop_front();
    net::async_write(
        stream_, net::buffer(stream_in_flight_),
        beast::bind_front_handler(&HttpSession::on_stream_write, this->shared_from_this()));
  }

  void on_stream_write(beast::error_code ec, std::size_t) {
    stream_writing_ = false;
    stream_queued_ -= std::min(stream_queued_, stream_in_flight_.size());
    stream_in_flight_.clear();
    if (ec) {
      client_gone();
      return;
    }
    if (gone_flag_->load()) {
      return;  // dropped meanwhile
    }
    if (!stream_queue_.empty()) {
      return stream_write_next();
    }
    if (stream_ending_) {
      stream_ending_ = false;
      stream_queued_ = 0;
      answered();
    }
  }

  void do_eof() {
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

  bool trusted_ = false;    // a request was answered with other than 401/403: see note_status
  bool answering_ = false;  // a request is being answered
  bool keep_alive_ = true;
  bool watching_ = false;  // a read is posted to notice the client leaving
  bool resume_ = false;    // read the next request when the watching read completes
  std::shared_ptr<std::atomic<bool>> gone_flag_ = std::make_shared<std::atomic<bool>>(false);
  std::function<void()> on_gone_;
  std::deque<std::string> stream_queue_;
  std::string stream_in_flight_;
  std::size_t stream_queued_ = 0;
  bool stream_writing_ = false;
  bool stream_ending_ = false;
};

}  // namespace cellgate::http::detail
