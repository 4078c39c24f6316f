// The two WebSocket formats of /api/kernels/{id}/channels, in both directions.
//
// Legacy ("default", no subprotocol): a text frame of JSON — the message plus top-level
// "channel", "msg_id", "msg_type" and "buffers": [] — or, when the message has binary buffers,
// a binary frame: uint32 BE nbufs (= 1 + buffers), nbufs uint32 BE offsets from the frame start,
// the JSON (without "buffers") at offset 0, then each buffer (the last runs to the end).
//
// v1.kernel.websocket.jupyter.org: every frame binary: uint64 LE offset_number (= 6 + buffers),
// then offset_number uint64 LE absolute offsets; [o0,o1) channel name, [o1,o2) header JSON,
// [o2,o3) parent_header, [o3,o4) metadata, [o4,o5) content, then buffers; the last offset is the
// frame length. The JSON parts are exactly the ZeroMQ frames, so they can be forwarded as is.
//
// See ../shared/reference/jupyter-gateway-api.md §5.3–5.5.
//
//   std::string text = encode_legacy_json("iopub", msg);          // no buffers
//   std::string bin  = encode_legacy_binary("iopub", msg);        // with buffers
//   std::string v1   = encode_v1("iopub", msg);
//   auto in = decode_v1(frame);   // Result<WsMessage>
//
// Decoders never throw and never read out of bounds: every malformed frame is an error value
// with reason "bad_frame" and a message saying what is wrong.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "cellgate/protocol/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::protocol {

inline constexpr std::string_view kV1Subprotocol = "v1.kernel.websocket.jupyter.org";

struct WsMessage {
  std::string channel;  // "shell", "control", "stdin", "iopub"; legacy frames without one: "shell"
  protocol::Message message;  // identities always empty
};

// Legacy text frame (JSON). Buffers, if any, are dropped: use encode_legacy for the right form.
std::string encode_legacy_json(std::string_view channel, const protocol::Message& msg);
// Legacy binary frame; the message must have at least one buffer.
std::string encode_legacy_binary(std::string_view channel, const protocol::Message& msg);
// The right legacy form: text without buffers, binary with. `binary` tells which was produced.
std::string encode_legacy(std::string_view channel, const protocol::Message& msg, bool& binary);
std::string encode_v1(std::string_view channel, const protocol::Message& msg);

// The same forms from a message's frames as they came (each JSON frame an object, checked by
// the caller), spliced in byte for byte: nothing is parsed or serialised again.
std::string encode_v1(std::string_view channel, const Frames& frames);
std::string encode_legacy(std::string_view channel, const Frames& frames, std::string_view msg_id,
                          std::string_view msg_type, bool& binary);

// A text frame is legacy JSON; a binary frame is legacy binary or v1 depending on the
// negotiated subprotocol.
Result<WsMessage> decode_legacy_json(std::string_view frame);
Result<WsMessage> decode_legacy_binary(std::string_view frame);
Result<WsMessage> decode_v1(std::string_view frame);

// A v1 frame cut into its channel and parts without parsing them (the offsets and the channel
// checked as decode_v1 checks them; an empty or `null` parent_header, metadata or content
// becomes {}). The bridge forwards these to the kernel after Envelope::from_frames checks them.
struct WsFrames {
  std::string channel;
  Frames frames;
};
Result<WsFrames> split_v1(std::string_view frame);

}  // namespace cellgate::protocol
