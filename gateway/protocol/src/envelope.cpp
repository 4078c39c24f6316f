#include "cellgate/protocol/envelope.hpp"

#include <simdjson.h>

#include <nlohmann/json.hpp>

#include "cellgate/protocol/ws_frames.hpp"

namespace cellgate::protocol {
namespace {

using nlohmann::json;

constexpr std::array<const char*, 4> kEnvelopeFrameNames = {"header", "parent_header", "metadata",
                                                            "content"};

Error envelope_error(const char* reason, std::string message) {
  return make_error(ErrorCode::kInvalidArgument, reason, std::move(message));
}

// One parser per thread: it keeps its buffers between messages, and the depth limit of its first
// allocation (growing its buffers keeps it). Whether it has that limit is for the caller to
// check: an allocation that failed leaves simdjson's default.
simdjson::dom::parser& parser() {
  thread_local simdjson::dom::parser p;
  if (p.max_depth() != kMaxJsonDepth) {
    // Out of memory leaves it as it was; json_kind() then refuses, and the next call tries again.
    (void)(p.allocate(simdjson::dom::MINIMAL_DOCUMENT_CAPACITY, kMaxJsonDepth) ==
           simdjson::SUCCESS);
  }
  return p;
}

enum class JsonKind { kInvalid, kTooDeep, kObject, kOther };

JsonKind json_kind(std::string_view text) {
  // parse() copies into a padded buffer when the input lacks simdjson's padding. Its depth limit
  // (kMaxJsonDepth) is what keeps nlohmann's recursive dump() and copies of a kernel's JSON on
  // the stack.
  if (parser().max_depth() != kMaxJsonDepth) {
    return JsonKind::kInvalid;  // fail closed: without its depth limit it checks nothing
  }
  auto doc = parser().parse(text.data(), text.size(), /*realloc_if_needed=*/true);
  if (doc.error() == simdjson::DEPTH_ERROR) {
    return JsonKind::kTooDeep;
  }
  if (doc.error()) {
    return JsonKind::kInvalid;
  }
  return doc.value_unsafe().is_object() ? JsonKind::kObject : JsonKind::kOther;
}

std::string envelope_string_field(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string envelope_dump_object(const json& value) {
  return value.is_null() ? "{}" : dump_json(value);
}

}  // namespace

bool is_valid_json(std::string_view text) {
  const JsonKind kind = json_kind(text);
  return kind != JsonKind::kInvalid && kind != JsonKind::kTooDeep;
}

Envelope::Envelope(Channel channel, Frames frames, HeaderInfo header, ParentInfo parent)
    : channel_(channel),
      frames_(std::move(frames)),
      header_(std::move(header)),
      parent_(std::move(parent)) {}

Result<EnvelopePtr> Envelope::checked(Channel channel, Frames frames) {
  const std::string* texts[] = {&frames.header, &frames.parent_header, &frames.metadata,
                                &frames.content};
  for (std::size_t i = 0; i < 4; ++i) {
    switch (json_kind(*texts[i])) {
      case JsonKind::kInvalid:
        return envelope_error("invalid_json", std::string(kEnvelopeFrameNames[i]) +
                                                  " frame is not valid JSON (or UTF-8)");
      case JsonKind::kTooDeep:
        return envelope_error("too_deep", std::string(kEnvelopeFrameNames[i]) +
                                              " frame nests JSON deeper than " +
                                              std::to_string(parser().max_depth()) + " levels");
      case JsonKind::kOther:
        return envelope_error("bad_shape",
                              std::string(kEnvelopeFrameNames[i]) + " frame is not a JSON object");
      case JsonKind::kObject:
        break;
    }
  }
  CELLGATE_ASSIGN_OR_RETURN(HeaderInfo header, peek_header(frames.header));
  // The parent header is small (a copy of the request's header): parsing it is cheap.
  ParentInfo parent;
  const json p = json::parse(frames.parent_header, nullptr, /*allow_exceptions=*/false);
  if (p.is_object()) {
    parent.msg_id = envelope_string_field(p, "msg_id");
    parent.msg_type = envelope_string_field(p, "msg_type");
    parent.session = envelope_string_field(p, "session");
  }
  return EnvelopePtr(
      new Envelope(channel, std::move(frames), std::move(header), std::move(parent)));
}

Result<EnvelopePtr> Envelope::from_wire(Channel channel, std::span<const std::string_view> wire,
                                        const Signer& signer, const Limits& limits) {
  CELLGATE_ASSIGN_OR_RETURN(RawMessage raw, split(wire, limits));
  CELLGATE_TRY(verify(raw, signer));
  Frames frames;
  frames.header.assign(raw.header);
  frames.parent_header.assign(raw.parent_header);
  frames.metadata.assign(raw.metadata);
  frames.content.assign(raw.content);
  frames.buffers.reserve(raw.buffers.size());
  for (std::string_view b : raw.buffers) {
    frames.buffers.emplace_back(b);
  }
  CELLGATE_ASSIGN_OR_RETURN(EnvelopePtr env, checked(channel, std::move(frames)));
  const_cast<Envelope&>(*env).from_kernel_ = true;  // not yet shared: made just above
  return env;
}

Result<EnvelopePtr> Envelope::from_frames(Channel channel, Frames frames) {
  return checked(channel, std::move(frames));
}

EnvelopePtr Envelope::from_message(Channel channel, Message msg) {
  Frames frames;
  frames.header = envelope_dump_object(msg.header);
  frames.parent_header = envelope_dump_object(msg.parent_header);
  frames.metadata = envelope_dump_object(msg.metadata);
  frames.content = envelope_dump_object(msg.content);
  frames.buffers = std::move(msg.buffers);
  HeaderInfo header{msg.msg_id(), msg.msg_type(), envelope_string_field(msg.header, "session")};
  ParentInfo parent;
  if (msg.parent_header.is_object()) {
    parent.msg_id = envelope_string_field(msg.parent_header, "msg_id");
    parent.msg_type = envelope_string_field(msg.parent_header, "msg_type");
    parent.session = envelope_string_field(msg.parent_header, "session");
  }
  auto env = std::shared_ptr<Envelope>(
      new Envelope(channel, std::move(frames), std::move(header), std::move(parent)));
  // The parsed form is at hand: keep it rather than parse the frames again.
  std::call_once(env->message_once_, [&] {
    msg.identities.clear();
    msg.buffers = env->frames_.buffers;
    env->message_ = std::move(msg);
  });
  return env;
}

std::size_t Envelope::size() const {
  std::size_t n = frames_.header.size() + frames_.parent_header.size() + frames_.metadata.size() +
                  frames_.content.size();
  for (const auto& b : frames_.buffers) {
    n += b.size();
  }
  return n;
}

const Message& Envelope::message() const {
  std::call_once(message_once_, [this] {
    // The frames were checked to be JSON objects, so these parses succeed.
    json* targets[] = {&message_.header, &message_.parent_header, &message_.metadata,
                       &message_.content};
    const std::string* sources[] = {&frames_.header, &frames_.parent_header, &frames_.metadata,
                                    &frames_.content};
    for (std::size_t i = 0; i < 4; ++i) {
      *targets[i] = json::parse(*sources[i], nullptr, /*allow_exceptions=*/false);
      if (!targets[i]->is_object()) {
        *targets[i] = json::object();
      }
    }
    message_.buffers = frames_.buffers;
  });
  return message_;
}

std::vector<std::string> Envelope::to_wire(const Signer& signer) const {
  std::vector<std::string> out;
  out.reserve(6 + frames_.buffers.size());
  out.emplace_back(kDelimiter);
  out.push_back(signer.enabled() ? signer.sign(frames_.header, frames_.parent_header,
                                               frames_.metadata, frames_.content)
                                 : std::string());
  out.push_back(frames_.header);
  out.push_back(frames_.parent_header);
  out.push_back(frames_.metadata);
  out.push_back(frames_.content);
  for (const auto& b : frames_.buffers) {
    out.push_back(b);
  }
  return out;
}

const std::string& Envelope::ws_v1() const {
  std::call_once(v1_once_, [this] { v1_ = encode_v1(to_string(channel_), frames_); });
  return v1_;
}

const std::string& Envelope::ws_legacy(bool* binary) const {
  std::call_once(legacy_once_, [this] {
    bool b = false;
    legacy_ = encode_legacy(to_string(channel_), frames_, header_.msg_id, header_.msg_type, b);
  });
  if (binary != nullptr) {
    *binary = !frames_.buffers.empty();
  }
  return legacy_;
}

}  // namespace cellgate::protocol
