// Envelope: a message as it travels through the gateway — its frames as they came, checked once,
// routed on its header alone, and parsed or encoded only when someone needs it, once for all.
//
//   auto env = Envelope::from_wire(Channel::kIopub, frames, signer);   // split, verify, check
//   env.value()->header().msg_type;          // "stream": routing needs no parse
//   env.value()->parent().msg_id;            // which request it answers
//   env.value()->ws_v1();                    // the v1 WebSocket frame, made once, shared
//   env.value()->message().content["text"];  // parsed on first use (the executor does this)
//
// Checked means: the HMAC verified (from a kernel), every JSON frame valid JSON (UTF-8 included;
// simdjson, ~0.2 ms per MiB) and the header an object with string msg_id and msg_type. So an
// envelope can be forwarded byte for byte — to a v1 WebSocket, or spliced into a legacy JSON
// frame — without building a DOM, and a hostile kernel cannot make the gateway send a client
// bytes that are not JSON.
//
// Thread-safety: immutable once made; message(), ws_v1() and ws_legacy() compute on first call
// (std::call_once) and may be called from any threads at once.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/protocol/codec.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::protocol {

// The routing fields of a parent header ("" where absent: a message caused by no request).
struct ParentInfo {
  std::string msg_id;
  std::string msg_type;
  std::string session;
};

// How deep the JSON of a message may nest, from a kernel or a client. nlohmann::json's dump(),
// copies and comparisons recurse once per level (~8 KiB a level in a sanitizer build), so deeper
// JSON never becomes a DOM; Jupyter's own JSON (display data, widget state, a Vega or Plotly
// spec) nests a few dozen levels at most.
inline constexpr std::size_t kMaxJsonDepth = 256;

// Whether `text` is one valid JSON value (RFC 8259, valid UTF-8) nested at most kMaxJsonDepth
// deep.
bool is_valid_json(std::string_view text);

class Envelope;
using EnvelopePtr = std::shared_ptr<const Envelope>;

class Envelope {
 public:
  // From a kernel's ZeroMQ frames (split, verify, check). Errors as codec.hpp's (too_few_frames,
  // missing_delimiter, too_large, bad_signature, invalid_json, too_deep, bad_shape). Routing
  // identities are dropped: the gateway's sockets are DEALERs and SUBs.
  static Result<EnvelopePtr> from_wire(Channel channel, std::span<const std::string_view> frames,
                                       const Signer& signer, const Limits& limits = {});
  // From frames a client sent (a v1 WebSocket frame): checked as above, nothing to verify.
  static Result<EnvelopePtr> from_frames(Channel channel, Frames frames);
  // From a parsed message (the gateway's own status messages; legacy WebSocket input).
  static EnvelopePtr from_message(Channel channel, Message msg);

  Channel channel() const { return channel_; }
  const HeaderInfo& header() const { return header_; }
  const ParentInfo& parent() const { return parent_; }
  const Frames& frames() const { return frames_; }
  // Every byte of the frames and buffers.
  std::size_t size() const;
  // Made by from_wire(): a kernel sent it (not the gateway, not a client).
  bool from_kernel() const { return from_kernel_; }

  // The parsed message (identities empty). Made on the first call.
  const Message& message() const;
  // The frames as a kernel expects them: delimiter, signature (`signer`), the four JSON frames,
  // the buffers. Not cached (each kernel signs with its own key).
  std::vector<std::string> to_wire(const Signer& signer) const;
  // The v1.kernel.websocket.jupyter.org frame: channel, the four JSON frames byte for byte,
  // buffers. Made on the first call.
  const std::string& ws_v1() const;
  // The legacy WebSocket frame: JSON text (the four frames spliced in as they are, plus channel,
  // msg_id, msg_type and "buffers": []) when there are no buffers, else the legacy binary form.
  // Made on the first call.
  const std::string& ws_legacy(bool* binary) const;

 private:
  Envelope(Channel channel, Frames frames, HeaderInfo header, ParentInfo parent);
  static Result<EnvelopePtr> checked(Channel channel, Frames frames);

  Channel channel_;
  Frames frames_;
  HeaderInfo header_;
  ParentInfo parent_;
  bool from_kernel_ = false;

  mutable std::once_flag message_once_;
  mutable Message message_;
  mutable std::once_flag v1_once_;
  mutable std::string v1_;
  mutable std::once_flag legacy_once_;
  mutable std::string legacy_;
};

}  // namespace cellgate::protocol
