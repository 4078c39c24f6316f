// The legacy and v1 WebSocket frame formats of /api/kernels/{id}/channels (ws_frames.hpp).
//
// Decisions where the references leave room (../shared/reference/jupyter-gateway-api.md §5.3–5.5):
// - Offsets may repeat (a zero-length part or buffer) but never go backwards.
// - Legacy binary: offset_0 must be exactly 4*(nbufs+1), as every known producer writes it
//   (JupyterLab serialize.ts, jupyter_server serialize_binary_message); bytes between the table
//   and the JSON would be data no one accounts for. The last buffer runs to the end of the frame,
//   so a legacy binary frame cut inside its last buffer cannot be told from a shorter buffer.
// - v1: offset_0 must be exactly 8*(1+offset_number) and the last offset exactly the frame length.
// - In every format the channel must be "shell", "control", "stdin" or "iopub" (a legacy frame
//   may leave it out: "shell"); anything else is a bad frame rather than a message to drop later.
// - The header must be an object with a non-empty string msg_type (as protocol::parse requires).
//   parent_header, metadata and content that are missing, null or (v1) empty bytes become {};
//   any other non-object is a bad frame.
#include "cellgate/protocol/ws_frames.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/protocol/envelope.hpp"

namespace cellgate::protocol {
namespace {

using nlohmann::json;

constexpr std::array<std::string_view, 4> kChannels = {"shell", "control", "stdin", "iopub"};

// The v1 parts after the channel, in frame order.
constexpr std::array<const char*, 4> kV1PartNames = {"header", "parent_header", "metadata",
                                                     "content"};

Error bad_frame(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "bad_frame", std::move(message));
}

bool known_channel(std::string_view channel) {
  for (std::string_view known : kChannels) {
    if (channel == known) {
      return true;
    }
  }
  return false;
}

// A JSON part of a message; null is written as {} (JupyterLab does the same for parent_header).
std::string dump_part(const json& value) {
  if (value.is_null()) {
    return "{}";
  }
  return dump_json(value);
}

// Shows a channel name in an error message: printable ASCII as is, other bytes as \xNN.
std::string printable(std::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < kMax; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      out += static_cast<char>(byte);
    } else {
      constexpr std::string_view kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  if (text.size() > kMax) {
    out += "...";
  }
  return out;
}

void put_u32_be(std::string& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out += static_cast<char>((value >> shift) & 0xffU);
  }
}

void put_u64_le(std::string& out, std::uint64_t value) {
  for (int shift = 0; shift < 64; shift += 8) {
    out += static_cast<char>((value >> shift) & 0xffU);
  }
}

// Callers check that [pos, pos + 4) / [pos, pos + 8) lies inside `frame`.
std::uint32_t get_u32_be(std::string_view frame, std::size_t pos) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    value = (value << 8) | static_cast<unsigned char>(frame[pos + i]);
  }
  return value;
}

std::uint64_t get_u64_le(std::string_view frame, std::size_t pos) {
  std::uint64_t value = 0;
  for (std::size_t i = 8; i-- > 0;) {
    value = (value << 8) | static_cast<unsigned char>(frame[pos + i]);
  }
  return value;
}

// Checks an offset table against a frame of `size` bytes: every offset inside the frame, none
// before its predecessor, the first one right after the table.
Result<void> check_offsets(const char* what, const std::vector<std::uint64_t>& offsets,
                           std::uint64_t size, std::uint64_t table_end) {
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] > size) {
      return bad_frame(std::string(what) + ": offset " + std::to_string(i) + " (" +
                       std::to_string(offsets[i]) + ") is past the end of the " +
                       std::to_string(size) + "-byte frame");
    }
    if (i > 0 && offsets[i] < offsets[i - 1]) {
      return bad_frame(std::string(what) + ": offset " + std::to_string(i) + " (" +
                       std::to_string(offsets[i]) + ") is before offset " + std::to_string(i - 1) +
                       " (" + std::to_string(offsets[i - 1]) + ")");
    }
  }
  if (offsets.empty() || offsets[0] != table_end) {
    return bad_frame(std::string(what) + ": offset 0 (" +
                     (offsets.empty() ? std::string("none") : std::to_string(offsets[0])) +
                     ") is not the end of the offset table (" + std::to_string(table_end) + ")");
  }
  return ok_result();
}

// Parses one JSON part without throwing, and only when it nests at most kMaxJsonDepth deep (a
// client's 1 MB of '[' would be half a million levels for the dump() that sends it on).
Result<json> parse_json(const char* what, const char* part, std::string_view text) {
  if (!is_valid_json(text)) {
    return bad_frame(std::string(what) + ": " + part + " is not valid JSON (or nests deeper than " +
                     std::to_string(kMaxJsonDepth) + " levels)");
  }
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return bad_frame(std::string(what) + ": " + part + " is not valid JSON");
  }
  return value;
}

// The header must be an object with a non-empty string msg_type.
Result<void> check_header(const char* what, const json& header) {
  if (!header.is_object()) {
    return bad_frame(std::string(what) + ": header is not a JSON object");
  }
  auto it = header.find("msg_type");
  if (it == header.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    return bad_frame(std::string(what) + ": header has no string msg_type");
  }
  return ok_result();
}

// parent_header, metadata and content: null becomes {}, other non-objects are errors.
Result<void> normalise_part(const char* what, const char* part, json& value) {
  if (value.is_null()) {
    value = json::object();
    return ok_result();
  }
  if (!value.is_object()) {
    return bad_frame(std::string(what) + ": " + part + " is not a JSON object");
  }
  return ok_result();
}

Result<void> check_channel(const char* what, std::string_view channel) {
  if (!known_channel(channel)) {
    return bad_frame(std::string(what) + ": unknown channel \"" + printable(channel) +
                     "\" (expected shell, control, stdin or iopub)");
  }
  return ok_result();
}

// The message of a legacy frame from its top-level JSON object (buffers are the caller's).
Result<WsMessage> from_legacy_json(const char* what, json&& object) {
  if (!object.is_object()) {
    return bad_frame(std::string(what) + ": the message is not a JSON object");
  }
  WsMessage out;
  auto channel = object.find("channel");
  if (channel == object.end()) {
    out.channel = "shell";
  } else if (!channel->is_string()) {
    return bad_frame(std::string(what) + ": channel is not a string");
  } else {
    out.channel = channel->get<std::string>();
    CELLGATE_TRY(check_channel(what, out.channel));
  }

  auto header = object.find("header");
  if (header == object.end()) {
    return bad_frame(std::string(what) + ": the message has no header");
  }
  CELLGATE_TRY(check_header(what, *header));
  out.message.header = std::move(*header);

  const std::pair<const char*, json*> parts[] = {
      {"parent_header", &out.message.parent_header},
      {"metadata", &out.message.metadata},
      {"content", &out.message.content},
  };
  for (const auto& [name, target] : parts) {
    auto it = object.find(name);
    if (it == object.end()) {
      *target = json::object();
      continue;
    }
    CELLGATE_TRY(normalise_part(what, name, *it));
    *target = std::move(*it);
  }
  return out;
}

// The four JSON texts of a message, in frame order.
using Parts = std::array<std::string_view, 4>;

// The legacy JSON text: the message with top-level msg_id, msg_type and channel, and
// "buffers": [] when `with_buffers_key`. Written by hand to keep the documented key order; the
// parts are spliced in as they are.
std::string legacy_json_text(std::string_view channel, const Parts& parts, std::string_view msg_id,
                             std::string_view msg_type, bool with_buffers_key) {
  const std::string id = dump_json(json(std::string(msg_id)));
  const std::string type = dump_json(json(std::string(msg_type)));
  const std::string chan = dump_json(json(std::string(channel)));
  std::string out;
  out.reserve(parts[0].size() + parts[1].size() + parts[2].size() + parts[3].size() + id.size() +
              type.size() + chan.size() + 128);
  out += "{\"header\":";
  out += parts[0];
  out += ",\"msg_id\":";
  out += id;
  out += ",\"msg_type\":";
  out += type;
  out += ",\"parent_header\":";
  out += parts[1];
  out += ",\"metadata\":";
  out += parts[2];
  out += ",\"content\":";
  out += parts[3];
  if (with_buffers_key) {
    out += ",\"buffers\":[]";
  }
  out += ",\"channel\":";
  out += chan;
  out += '}';
  return out;
}

std::string legacy_binary(const std::string& text, const std::vector<std::string>& buffers) {
  // With no buffers this still writes a well-formed nbufs = 1 frame, which decoders (ours and
  // JupyterLab's) reject; callers use encode_legacy to pick the form.
  const std::size_t nbufs = 1 + buffers.size();
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint32_t>::max();
  // Offsets are uint32: a frame whose last buffer starts past 4 GiB cannot be written. Far above
  // any WebSocket frame limit, so this is a programming error rather than a runtime condition.
  std::uint64_t table = 4 * (static_cast<std::uint64_t>(nbufs) + 1);
  std::uint64_t pos = table;
  std::vector<std::uint32_t> offsets;
  offsets.reserve(nbufs);
  for (std::size_t i = 0; i < nbufs; ++i) {
    if (table > kMax || pos > kMax) {
      throw std::length_error("legacy binary frame: offsets do not fit in 32 bits");
    }
    offsets.push_back(static_cast<std::uint32_t>(pos));
    pos += (i == 0 ? text.size() : buffers[i - 1].size());
  }
  std::string out;
  out.reserve(pos);
  put_u32_be(out, static_cast<std::uint32_t>(nbufs));
  for (std::uint32_t offset : offsets) {
    put_u32_be(out, offset);
  }
  out += text;
  for (const std::string& buffer : buffers) {
    out += buffer;
  }
  return out;
}

std::string v1_frame(std::string_view channel, const Parts& parts,
                     const std::vector<std::string>& buffers) {
  const std::uint64_t offset_number = 6 + static_cast<std::uint64_t>(buffers.size());
  std::vector<std::uint64_t> offsets;
  offsets.reserve(offset_number);
  std::uint64_t pos = 8 * (1 + offset_number);
  offsets.push_back(pos);
  pos += channel.size();
  offsets.push_back(pos);
  for (std::string_view part : parts) {
    pos += part.size();
    offsets.push_back(pos);
  }
  for (const std::string& buffer : buffers) {
    pos += buffer.size();
    offsets.push_back(pos);
  }
  std::string out;
  out.reserve(pos);
  put_u64_le(out, offset_number);
  for (std::uint64_t offset : offsets) {
    put_u64_le(out, offset);
  }
  out += channel;
  for (std::string_view part : parts) {
    out += part;
  }
  for (const std::string& buffer : buffers) {
    out += buffer;
  }
  return out;
}

struct DumpedParts {
  explicit DumpedParts(const protocol::Message& msg)
      : texts{dump_part(msg.header), dump_part(msg.parent_header), dump_part(msg.metadata),
              dump_part(msg.content)},
        parts{texts[0], texts[1], texts[2], texts[3]} {}
  std::array<std::string, 4> texts;
  Parts parts;
};

}  // namespace

std::string encode_legacy_json(std::string_view channel, const protocol::Message& msg) {
  DumpedParts d(msg);
  return legacy_json_text(channel, d.parts, msg.msg_id(), msg.msg_type(),
                          /*with_buffers_key=*/true);
}

std::string encode_legacy_binary(std::string_view channel, const protocol::Message& msg) {
  DumpedParts d(msg);
  return legacy_binary(
      legacy_json_text(channel, d.parts, msg.msg_id(), msg.msg_type(), /*with_buffers_key=*/false),
      msg.buffers);
}

std::string encode_legacy(std::string_view channel, const protocol::Message& msg, bool& binary) {
  binary = !msg.buffers.empty();
  return binary ? encode_legacy_binary(channel, msg) : encode_legacy_json(channel, msg);
}

std::string encode_v1(std::string_view channel, const protocol::Message& msg) {
  DumpedParts d(msg);
  return v1_frame(channel, d.parts, msg.buffers);
}

std::string encode_v1(std::string_view channel, const Frames& frames) {
  return v1_frame(channel, {frames.header, frames.parent_header, frames.metadata, frames.content},
                  frames.buffers);
}

std::string encode_legacy(std::string_view channel, const Frames& frames, std::string_view msg_id,
                          std::string_view msg_type, bool& binary) {
  const Parts parts = {frames.header, frames.parent_header, frames.metadata, frames.content};
  binary = !frames.buffers.empty();
  if (!binary) {
    return legacy_json_text(channel, parts, msg_id, msg_type, /*with_buffers_key=*/true);
  }
  return legacy_binary(legacy_json_text(channel, parts, msg_id, msg_type, false), frames.buffers);
}

Result<WsMessage> decode_legacy_json(std::string_view frame) {
  constexpr const char* kWhat = "legacy JSON frame";
  CELLGATE_ASSIGN_OR_RETURN(json object, parse_json(kWhat, "the message", frame));
  // Any "buffers" array is ignored: a text frame carries no binary data.
  return from_legacy_json(kWhat, std::move(object));
}

Result<WsMessage> decode_legacy_binary(std::string_view frame) {
  constexpr const char* kWhat = "legacy binary frame";
  const std::uint64_t size = frame.size();
  if (size < 4) {
    return bad_frame(std::string(kWhat) + ": " + std::to_string(size) +
                     " bytes is too short for the buffer count (4 bytes)");
  }
  const std::uint64_t nbufs = get_u32_be(frame, 0);
  if (nbufs < 2) {
    return bad_frame(std::string(kWhat) + ": buffer count " + std::to_string(nbufs) +
                     " is below 2 (the JSON part and at least one buffer)");
  }
  // 4 * (nbufs + 1) <= size, written so that nothing can overflow.
  if (nbufs > size / 4 - 1) {
    return bad_frame(std::string(kWhat) + ": an offset table of " + std::to_string(nbufs) +
                     " entries does not fit in the " + std::to_string(size) + "-byte frame");
  }
  const std::uint64_t table_end = 4 * (nbufs + 1);
  std::vector<std::uint64_t> offsets;
  offsets.reserve(nbufs);
  for (std::uint64_t i = 0; i < nbufs; ++i) {
    offsets.push_back(get_u32_be(frame, 4 * (i + 1)));
  }
  CELLGATE_TRY(check_offsets(kWhat, offsets, size, table_end));

  const std::string_view text = frame.substr(offsets[0], offsets[1] - offsets[0]);
  CELLGATE_ASSIGN_OR_RETURN(json object, parse_json(kWhat, "the JSON part", text));
  CELLGATE_ASSIGN_OR_RETURN(WsMessage out, from_legacy_json(kWhat, std::move(object)));
  out.message.buffers.reserve(nbufs - 1);
  for (std::uint64_t i = 1; i < nbufs; ++i) {
    const std::uint64_t stop = (i + 1 < nbufs) ? offsets[i + 1] : size;
    out.message.buffers.emplace_back(frame.substr(offsets[i], stop - offsets[i]));
  }
  return out;
}

Result<WsFrames> split_v1(std::string_view frame) {
  constexpr const char* kWhat = "v1 frame";
  const std::uint64_t size = frame.size();
  if (size < 8) {
    return bad_frame(std::string(kWhat) + ": " + std::to_string(size) +
                     " bytes is too short for the offset count (8 bytes)");
  }
  const std::uint64_t offset_number = get_u64_le(frame, 0);
  if (offset_number < 6) {
    return bad_frame(std::string(kWhat) + ": offset count " + std::to_string(offset_number) +
                     " is below 6 (channel, four message parts and the end)");
  }
  // 8 * (1 + offset_number) <= size, written so that nothing can overflow.
  if (offset_number > size / 8 - 1) {
    return bad_frame(std::string(kWhat) + ": an offset table of " + std::to_string(offset_number) +
                     " entries does not fit in the " + std::to_string(size) + "-byte frame");
  }
  const std::uint64_t table_end = 8 * (1 + offset_number);
  std::vector<std::uint64_t> offsets;
  offsets.reserve(offset_number);
  for (std::uint64_t i = 0; i < offset_number; ++i) {
    offsets.push_back(get_u64_le(frame, 8 * (i + 1)));
  }
  CELLGATE_TRY(check_offsets(kWhat, offsets, size, table_end));
  if (offsets.back() != size) {
    return bad_frame(std::string(kWhat) + ": the last offset (" + std::to_string(offsets.back()) +
                     ") is not the frame length (" + std::to_string(size) + ")");
  }
  auto part = [&](std::size_t i) { return frame.substr(offsets[i], offsets[i + 1] - offsets[i]); };

  WsFrames out;
  out.channel = std::string(part(0));
  CELLGATE_TRY(check_channel(kWhat, out.channel));
  std::string* targets[] = {&out.frames.header, &out.frames.parent_header, &out.frames.metadata,
                            &out.frames.content};
  for (std::size_t i = 0; i < kV1PartNames.size(); ++i) {
    targets[i]->assign(part(i + 1));
    // An empty or null parent_header, metadata or content is {} (as decode_v1 reads them).
    if (i > 0 && (targets[i]->empty() || *targets[i] == "null")) {
      *targets[i] = "{}";
    }
  }
  out.frames.buffers.reserve(offset_number - 6);
  for (std::size_t i = 5; i + 1 < offset_number; ++i) {
    out.frames.buffers.emplace_back(part(i));
  }
  return out;
}

Result<WsMessage> decode_v1(std::string_view frame) {
  constexpr const char* kWhat = "v1 frame";
  // The offsets and the channel are checked once, in split_v1; an empty or null part is {}.
  CELLGATE_ASSIGN_OR_RETURN(WsFrames parts, split_v1(frame));
  WsMessage out;
  out.channel = std::move(parts.channel);
  json* targets[] = {&out.message.header, &out.message.parent_header, &out.message.metadata,
                     &out.message.content};
  const std::string* texts[] = {&parts.frames.header, &parts.frames.parent_header,
                                &parts.frames.metadata, &parts.frames.content};
  for (std::size_t i = 0; i < kV1PartNames.size(); ++i) {
    CELLGATE_ASSIGN_OR_RETURN(*targets[i], parse_json(kWhat, kV1PartNames[i], *texts[i]));
    if (i > 0) {
      CELLGATE_TRY(normalise_part(kWhat, kV1PartNames[i], *targets[i]));
    }
  }
  CELLGATE_TRY(check_header(kWhat, out.message.header));
  out.message.buffers = std::move(parts.frames.buffers);
  return out;
}

}  // namespace cellgate::protocol
