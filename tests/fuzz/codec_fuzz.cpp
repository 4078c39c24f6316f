// The Jupyter wire codec (gateway/protocol: codec.cpp, envelope.cpp, message.cpp) on ZeroMQ
// multipart frames (fuzz_util.hpp's framing). Each input is decoded twice: with the HMAC key of
// the seed corpus (the path a kernel's bytes take) and without a key (so mutated JSON reaches the
// parser instead of failing the signature). Invariants:
//   - decode(encode(m)) == m for every message decode accepts, signed and unsigned;
//   - an Envelope accepted from the wire decodes too, to the same message, and its to_wire(),
//     ws_v1() and ws_legacy() forms decode back to that message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/protocol/codec.hpp"
#include "cellgate/protocol/envelope.hpp"
#include "cellgate/protocol/ws_frames.hpp"
#include "fuzz_util.hpp"

namespace {

using cellgate::fuzz::check;
using namespace cellgate::protocol;

// The key the seeds in corpus/codec were signed with (tests/fuzz/make_seeds.py).
constexpr std::string_view kKey = "cellgate-fuzz-key";

bool same(const Message& a, const Message& b) {
  return a.header == b.header && a.parent_header == b.parent_header && a.metadata == b.metadata &&
         a.content == b.content && a.buffers == b.buffers;
}

std::string show(const Message& m) {
  return dump_json(m.header) + "\n" + dump_json(m.parent_header) + "\n" + dump_json(m.metadata) +
         "\n" + dump_json(m.content) + "\nbuffers: " + std::to_string(m.buffers.size());
}

void round_trip(const std::vector<std::string_view>& frames, const Signer& signer) {
  auto msg = decode(std::span<const std::string_view>(frames), signer);
  if (!msg) {
    check(!msg.error().reason.empty(), "a decode error without a reason");
    return;
  }
  const std::vector<std::string> wire = encode(*msg, signer);
  auto again = decode(wire, signer);
  check(again.ok(), "decode(encode(m)) failed",
        again ? "" : again.error().describe() + "\n" + show(*msg));
  check(same(*msg, *again), "decode(encode(m)) != m", show(*msg) + "\n---\n" + show(*again));
  check(again->identities == msg->identities, "identities changed in a round trip");
}

void envelope(const std::vector<std::string_view>& frames, const Signer& signer) {
  auto env =
      Envelope::from_wire(Channel::kIopub, std::span<const std::string_view>(frames), signer);
  if (!env) {
    return;
  }
  auto msg = decode(std::span<const std::string_view>(frames), signer);
  check(msg.ok(), "an Envelope accepted frames that decode refuses",
        msg ? "" : msg.error().describe());
  const Message& parsed = (*env)->message();
  check(same(parsed, *msg), "Envelope::message() differs from decode()",
        show(parsed) + "\n---\n" + show(*msg));
  check((*env)->header().msg_type == msg->msg_type(), "Envelope header msg_type differs");
  check((*env)->header().msg_id == msg->msg_id(), "Envelope header msg_id differs");

  auto rewired = decode((*env)->to_wire(signer), signer);
  check(rewired && same(*rewired, parsed), "Envelope::to_wire() does not decode to its message");

  auto v1 = decode_v1((*env)->ws_v1());
  check(v1.ok(), "Envelope::ws_v1() does not decode", v1 ? "" : v1.error().describe());
  check(v1->channel == "iopub", "ws_v1() lost the channel", v1->channel);
  check(same(v1->message, parsed), "ws_v1() decodes to another message",
        show(v1->message) + "\n---\n" + show(parsed));

  bool binary = false;
  const std::string& legacy = (*env)->ws_legacy(&binary);
  auto back = binary ? decode_legacy_binary(legacy) : decode_legacy_json(legacy);
  check(back.ok(), "Envelope::ws_legacy() does not decode",
        back ? "" : back.error().describe() + "\n" + legacy.substr(0, 2000));
  check(back->message.header == parsed.header && back->message.content == parsed.content &&
            back->message.parent_header == parsed.parent_header &&
            back->message.metadata == parsed.metadata && back->message.buffers == parsed.buffers,
        "ws_legacy() decodes to another message", show(back->message) + "\n---\n" + show(parsed));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Signer keyed = *Signer::create("hmac-sha256", std::string(kKey));
  static const Signer unkeyed;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string_view> frames = cellgate::fuzz::split_frames(input);

  round_trip(frames, keyed);
  round_trip(frames, unkeyed);
  envelope(frames, keyed);
  envelope(frames, unkeyed);
  // The steps on their own, as a router runs them.
  if (auto raw = split(std::span<const std::string_view>(frames))) {
    (void)peek_header(raw->header);
    (void)verify(*raw, keyed);
  }
  return 0;
}
