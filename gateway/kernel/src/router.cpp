#include "router.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace cellgate::kernel {
namespace {

using nlohmann::json;

// The field that marks a stream message the gateway made to say output was lost (clients ignore
// content fields they do not know; the agent API's collector makes a notice of it).
constexpr const char* kDroppedMark = "cellgate_dropped";

}  // namespace

Router::Router(const ClientOptions& options, const protocol::Session& session,
               const protocol::Signer& signer, Transport& transport,
               std::function<Clock::time_point()> clock)
    : options_(options),
      session_(session),
      signer_(signer),
      transport_(transport),
      clock_(std::move(clock)),
      heartbeat_(options, options.log_name.empty() ? transport.name() : options.log_name) {
  hb_while_busy_.store(options.heartbeat_while_busy.value_or(false));
}

std::string Router::death_reason() const {
  MutexLock lock(mu_);
  return dead_reason_;
}

void Router::settle_heartbeat(const json& kernel_info) {
  if (!options_.heartbeat_while_busy) {
    hb_while_busy_.store(kernel_info.is_object() &&
                         kernel_info.value("implementation", "") == "ipython");
  }
}

// ---- requests out ----------------------------------------------------------------------------

void Router::send(Outgoing out) {
  const std::string id = out.envelope ? out.envelope->header().msg_id : out.msg.msg_id();
  if (out.handlers) {
    if (!alive_.load()) {
      if (out.handlers->on_end) {
        out.handlers->on_end(RequestEnd::kKernelDead);
      }
      return;
    }
    routes_.emplace(id, Route{std::move(*out.handlers), false, false, {}});
    count_routes();
  }
  std::vector<std::string> frames =
      out.envelope ? out.envelope->to_wire(signer_) : protocol::encode(out.msg, signer_);
  if (!transport_.send(out.channel, std::move(frames))) {
    end_route(id, RequestEnd::kKernelDead);
  }
}

// ---- what comes back -------------------------------------------------------------------------

void Router::on_frames(Channel channel, std::span<const std::string_view> frames,
                       const std::function<void()>& release) {
  if (stopped_.load()) {
    return;
  }
  if (channel == Channel::kIopub && iopub_drop_pending_) {
    notify_oversized();  // the kernel is alive and publishing: it was no death
  }
  auto env = protocol::Envelope::from_wire(channel, frames, signer_, options_.limits);
  if (!env) {
    wire_errors_.fetch_add(1);
    if (options_.on_wire_error) {
      options_.on_wire_error(channel, env.error());
    }
    if (channel == Channel::kIopub) {
      tell_dropped(frames, env.error());
    }
    return;
  }
  release();  // the envelope owns copies; free the frames before dispatching
  dispatch(channel, env.value());
}

// Routes on the header alone: the content is parsed only by a handler that asks for it (and for
// status messages, whose execution_state completes requests).
void Router::dispatch(Channel channel, const protocol::EnvelopePtr& env) {
  // A status message's execution_state, read once ("" for any other message).
  const bool status = channel == Channel::kIopub && env->header().msg_type == "status";
  const std::string state = status ? env->message().content.value("execution_state", "") : "";
  if (channel == Channel::kIopub) {
    iopub_seen_.store(true);
    if (!hb_while_busy_.load(std::memory_order_relaxed) && status) {
      const bool busy = state == "busy";
      if (kernel_busy_ && !busy) {
        heartbeat_.forgive();
      }
      kernel_busy_ = busy;
    }
    if (state == "busy") {
      busy_parent_ = env->message().parent_header;
    }
    if (options_.on_iopub) {
      options_.on_iopub(env);
    }
  }
  const std::string& parent = env->parent().msg_id;
  auto it = parent.empty() ? routes_.end() : routes_.find(parent);
  if (it == routes_.end()) {
    // iopub went to on_iopub above; what else answers no request of ours is a client's (post()).
    if (options_.on_unrouted && channel != Channel::kIopub) {
      options_.on_unrouted(env);
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
    route.reply_at = clock_();
  } else if (state == "idle") {
    route.got_idle = true;
  }
  if (route.got_reply && (route.got_idle || !route.handlers.wait_for_idle)) {
    end_route(parent, RequestEnd::kComplete);
  }
}

void Router::on_pong() {
  const auto sent = heartbeat_.on_pong();
  // The echo of a ping sent after iopub was reopened: the kernel lived on after the cut, even when
  // it published nothing more (its last output and idle may have gone out before the new
  // connection was up, and a slow machine makes that likely).
  if (sent && iopub_drop_pending_ && *sent >= reopened_at_) {
    notify_oversized();
  }
}

bool Router::on_iopub_cut() {
  return alive_.load() && !stopped_.load();
}

void Router::on_iopub_reopened() {
  // What the old connection still held was delivered before this: it was published before the
  // cut and proves nothing; a message on the new connection means the kernel lives on, and so
  // does the echo of a ping sent from now on (asked for at once).
  iopub_drop_pending_ = true;
  reopened_at_ = clock_();
  heartbeat_.ping_soon();
}

void Router::on_peer_gone(const std::string& reason) {
  if (stopped_.load()) {
    return;
  }
  declare_dead(reason);
}

// ---- time ------------------------------------------------------------------------------------

std::chrono::milliseconds Router::tick() {
  if (stopped_.load()) {
    return std::chrono::milliseconds(0);  // the loop ends at its next check
  }
  auto now = clock_();
  complete_lost_idles(now);
  if (!alive_.load()) {
    return std::chrono::milliseconds(-1);
  }
  const bool excused = !hb_while_busy_.load(std::memory_order_relaxed) && kernel_busy_;
  auto beat = heartbeat_.tick(
      now, excused, [this] { return transport_.ping(); }, clock_);
  if (beat.dead) {
    declare_dead(*beat.dead);
    return std::chrono::milliseconds(-1);
  }
  auto wait = beat.wait;
  if (auto idle = next_lost_idle()) {
    now = clock_();
    auto until = std::chrono::ceil<std::chrono::milliseconds>(*idle - now);
    wait = std::min(wait, std::max(until, std::chrono::milliseconds(1)));
  }
  return wait;
}

std::optional<Router::Clock::time_point> Router::next_lost_idle() const {
  std::optional<Clock::time_point> next;
  for (const auto& [id, r] : routes_) {
    if (r.got_reply && !r.got_idle && r.handlers.wait_for_idle) {
      const auto at = r.reply_at + kIdleGrace;
      next = next ? std::min(*next, at) : at;
    }
  }
  return next;
}

void Router::complete_lost_idles(Clock::time_point now) {
  std::vector<std::string> lost;
  for (const auto& [id, r] : routes_) {
    if (r.got_reply && !r.got_idle && r.handlers.wait_for_idle && now - r.reply_at >= kIdleGrace) {
      lost.push_back(id);
    }
  }
  for (const auto& id : lost) {
    end_route(id, RequestEnd::kComplete);
  }
}

// ---- endings ---------------------------------------------------------------------------------

void Router::end_route(const std::string& id, RequestEnd end) {
  auto it = routes_.find(id);
  if (it == routes_.end()) {
    return;
  }
  RequestHandlers handlers = std::move(it->second.handlers);
  routes_.erase(it);
  count_routes();
  if (handlers.on_end) {
    handlers.on_end(end);
  }
}

void Router::end_all(RequestEnd end) {
  auto taken = std::move(routes_);
  routes_.clear();
  count_routes();
  for (auto& [id, route] : taken) {
    if (route.handlers.on_end) {
      route.handlers.on_end(end);
    }
  }
}

void Router::declare_dead(const std::string& reason) {
  {
    MutexLock lock(mu_);
    if (!alive_.load()) {
      return;
    }
    dead_reason_ = reason;  // before alive_ turns false: death_reason() is read after it
    alive_.store(false);
  }
  if (options_.on_dead) {
    options_.on_dead(reason);
  }
  end_all(RequestEnd::kKernelDead);
}

// ---- output the gateway could not pass on ----------------------------------------------------

// iopub was cut while the kernel lives: libzmq refused a frame over maxmsgsize (nothing else
// makes a live PUB drop its subscriber). The message, and whatever the kernel queued behind it on
// the cut connection, is gone; the clients are told so on iopub, as stderr of the request that
// was running (a notice the agent API's cell result keeps like any output).
void Router::notify_oversized() {
  iopub_drop_pending_ = false;
  const std::size_t limit = options_.limits.max_message_bytes;
  const std::string limit_text = limit >= (1u << 20) && limit % (1u << 20) == 0
                                     ? std::to_string(limit >> 20) + " MiB"
                                     : std::to_string(limit) + " bytes";
  spdlog::warn(
      "a kernel's iopub connection was cut while it ran on (a message over {}, maxmsgsize?); "
      "clients told",
      limit_text);
  protocol::Message msg = session_.make(
      "stream", json{{"name", "stderr"},
                     {"text",
                      "[cellgate] output dropped: the connection carrying the kernel's output was "
                      "cut while the kernel ran on, most likely by a message over the " +
                          limit_text +
                          " limit (--max-kernel-message-bytes); that output and any queued "
                          "behind it were lost\n"},
                     {kDroppedMark, true}});
  msg.parent_header = busy_parent_;  // the request that ran last: the likely sender
  dispatch(Channel::kIopub, protocol::Envelope::from_message(Channel::kIopub, std::move(msg)));
}

// A signed iopub message the gateway cannot pass on (a frame that is not JSON, or nests deeper
// than protocol::kMaxJsonDepth): the clients of the request it answers read why on stderr, as a
// kernel's own output, instead of losing it without a word. Unsigned or malformed envelopes are
// not the kernel's and are only counted.
void Router::tell_dropped(std::span<const std::string_view> frames, const Error& why) {
  if (why.reason != "invalid_json" && why.reason != "bad_shape" && why.reason != "too_deep") {
    return;
  }
  auto raw = protocol::split(frames, options_.limits);
  if (!raw || !protocol::verify(*raw, signer_)) {
    return;
  }
  auto header = protocol::peek_header(raw->header);
  json parent = busy_parent_;
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
  protocol::Message msg = session_.make(
      "stream", json{{"name", "stderr"},
                     {"text", "[cellgate] a " + type +
                                  " message from the kernel was dropped: " + why.message + "\n"},
                     {kDroppedMark, true}});
  msg.parent_header = std::move(parent);
  dispatch(Channel::kIopub, protocol::Envelope::from_message(Channel::kIopub, std::move(msg)));
}

}  // namespace cellgate::kernel
