// The two WebSocket formats of /api/kernels/{id}/channels (gateway/protocol/src/ws_frames.cpp):
// every input is given to all three decoders, so a v1 seed, a legacy text seed and a legacy
// binary seed each exercise their own decoder and the others' refusals. Invariants:
//   - decode(encode(m)) == m for each format, once m is what the decoder made of the input;
//   - split_v1 accepts what decode_v1 accepts, with the same channel, and its frames re-encode
//     (encode_v1 from Frames) to a frame that decodes to the same message;
//   - the legacy form chosen by encode_legacy (text without buffers, binary with) decodes back.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cellgate/protocol/message.hpp"
#include "cellgate/protocol/ws_frames.hpp"
#include "fuzz_util.hpp"

namespace {

using cellgate::fuzz::check;
using namespace cellgate::protocol;

bool same(const Message& a, const Message& b) {
  return a.header == b.header && a.parent_header == b.parent_header && a.metadata == b.metadata &&
         a.content == b.content && a.buffers == b.buffers;
}

std::string show(const WsMessage& m) {
  return m.channel + "\n" + dump_json(m.message.header) + "\n" +
         dump_json(m.message.parent_header) + "\n" + dump_json(m.message.metadata) + "\n" +
         dump_json(m.message.content) + "\nbuffers: " + std::to_string(m.message.buffers.size());
}

void check_legacy(const WsMessage& in) {
  bool binary = false;
  const std::string frame = encode_legacy(in.channel, in.message, binary);
  check(binary == !in.message.buffers.empty(), "encode_legacy chose the wrong form");
  auto out = binary ? decode_legacy_binary(frame) : decode_legacy_json(frame);
  check(out.ok(), "a legacy frame we encoded does not decode",
        (out ? "" : out.error().describe()) + "\n" + show(in));
  check(out->channel == in.channel, "legacy round trip changed the channel",
        in.channel + " -> " + out->channel);
  check(same(out->message, in.message), "legacy decode(encode(m)) != m",
        show(in) + "\n---\n" + show(*out));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);

  auto v1 = decode_v1(frame);
  auto parts = split_v1(frame);
  if (v1) {
    check(parts.ok(), "split_v1 refuses a frame decode_v1 accepts",
          parts ? "" : parts.error().describe());
    check(parts->channel == v1->channel, "split_v1 and decode_v1 disagree on the channel");
    auto again = decode_v1(encode_v1(v1->channel, v1->message));
    check(again.ok(), "a v1 frame we encoded does not decode",
          again ? "" : again.error().describe());
    check(again->channel == v1->channel && same(again->message, v1->message),
          "v1 decode(encode(m)) != m", show(*v1) + "\n---\n" + show(*again));
    auto spliced = decode_v1(encode_v1(parts->channel, parts->frames));
    check(spliced.ok() && same(spliced->message, v1->message),
          "split_v1's frames re-encoded decode to another message");
    check_legacy(*v1);
  } else {
    check(v1.error().reason == "bad_frame", "a v1 decode error that is not bad_frame",
          v1.error().describe());
  }

  if (auto text = decode_legacy_json(frame)) {
    check(text->message.buffers.empty(), "a legacy text frame produced buffers");
    check_legacy(*text);
  }
  if (auto bin = decode_legacy_binary(frame)) {
    check(!bin->message.buffers.empty(), "a legacy binary frame without buffers");
    check_legacy(*bin);
  }
  return 0;
}
