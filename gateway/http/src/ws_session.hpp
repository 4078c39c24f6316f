// Internal: one WebSocket client connection, bridged to a WsHandler (WsSession), and the
// WsConnection handle its handler holds (WsOutbox). Templated on the stream so it runs over TCP,
// TLS and Beast's in-memory test::stream; HttpSession (sessions.hpp) makes one on an upgrade.
//
//   auto ws = std::make_shared<WsSession<Stream>>(std::move(stream), handler, subprotocol, opts);
//   ws->run(std::move(upgrade_request));
//
// Thread-safety: a session lives on its strand (the stream's executor); WsOutbox's methods may be
// called from any thread and post onto it.
#pragma once

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <memory>
#include <optional>

#include "cellgate/http/handler.hpp"
#include "cellgate/http/listener.hpp"
#include "session_parts.hpp"
#include "stream_ops.hpp"

namespace cellgate::http::detail {

namespace websocket = beast::websocket;

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
    ws_.set_option(ws_timeouts(options_));
    ws_.set_option(websocket::stream_base::decorator(
        [subprotocol = subprotocol_,
         &extra = options_.response_headers](websocket::response_type& res) {
          decorate_ws_handshake(res, subprotocol);
          for (const auto& [name, value] : extra) {
            res.set(name, value);
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
    count_dropped(options_, "memory_budget");
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

  void enqueue(const std::shared_ptr<const OutFrame>& frame) {
    if (closing_ || finished_) {
      return;
    }
    // Made here, on this connection's strand, the first time any connection asks for it.
    const std::size_t size = frame->bytes().size();
    queued_bytes_ += size;
    if (queued_bytes_ > options_.max_ws_queue_bytes) {
      // A client that does not read must not grow the gateway's memory without bound.
      count_dropped(options_, "slow_reader");
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
      if (!ec) {
        in_flight_->written();
      }
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

}  // namespace cellgate::http::detail
