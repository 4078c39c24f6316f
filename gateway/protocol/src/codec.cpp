#include "cellgate/protocol/codec.hpp"

#include <algorithm>
#include <exception>
#include <xeus/xauthentication.hpp>

namespace cellgate::protocol {
namespace {

using nlohmann::json;

Error wire_error(std::string reason, std::string message) {
  return make_error(ErrorCode::kInvalidArgument, std::move(reason), std::move(message));
}

xeus::xraw_buffer raw(std::string_view s) {
  return {reinterpret_cast<const unsigned char*>(s.data()), s.size()};
}

constexpr const char* kFrameNames[] = {"header", "parent_header", "metadata", "content"};

}  // namespace

// ---- Signer ----------------------------------------------------------------------------------

Signer::Signer() = default;
Signer::~Signer() = default;
Signer::Signer(Signer&&) noexcept = default;
Signer& Signer::operator=(Signer&&) noexcept = default;

Result<Signer> Signer::create(std::string_view scheme, std::string key) {
  auto unsupported = [&](const std::string& why) {
    return make_error(
        ErrorCode::kInvalidArgument, "bad_signature_scheme",
        "unsupported signature_scheme '" + std::string(scheme) + "' (use hmac-sha256)" + why);
  };
  // Only HMAC schemes sign anything; xeus would accept others and then verify nothing.
  if (!scheme.starts_with("hmac-")) {
    return unsupported("");
  }
  Signer signer;
  // The scheme is checked even when the key is empty and nothing will be signed.
  // xeus looks the digest up with std::map::at: an unknown one throws out_of_range, which the
  // adapter turns into an error value.
  try {
    signer.auth_ = xeus::make_xauthentication(std::string(scheme), key);
    signer.signature_size_ = signer.auth_->sign(raw(""), raw(""), raw(""), raw("")).size();
  } catch (const std::exception& e) {
    return unsupported(std::string(": ") + e.what());
  }
  if (key.empty()) {
    signer.auth_.reset();
    signer.signature_size_ = 0;
  }
  return signer;
}

std::string Signer::sign(std::string_view header, std::string_view parent_header,
                         std::string_view metadata, std::string_view content) const {
  if (!auth_) {
    return {};
  }
  return auth_->sign(raw(header), raw(parent_header), raw(metadata), raw(content));
}

bool Signer::verify(std::string_view signature, std::string_view header,
                    std::string_view parent_header, std::string_view metadata,
                    std::string_view content) const {
  if (!auth_) {
    return true;
  }
  // xeus compares only as many bytes as its own hex digest has: a shorter frame would be read
  // past its end and a longer one would pass with junk appended. The length is not secret.
  if (signature.size() != signature_size_) {
    return false;
  }
  // xeus compares with CRYPTO_memcmp (constant time) after hex-encoding its own digest.
  return auth_->verify(raw(signature), raw(header), raw(parent_header), raw(metadata),
                       raw(content));
}

// ---- decoding --------------------------------------------------------------------------------

Result<RawMessage> split(std::span<const std::string_view> frames, const Limits& limits) {
  std::size_t total = 0;
  for (auto f : frames) {
    total += f.size();
  }
  if (total > limits.max_message_bytes) {
    return wire_error("too_large", "message of " + std::to_string(total) +
                                       " bytes is over the limit of " +
                                       std::to_string(limits.max_message_bytes));
  }
  auto delim = std::find(frames.begin(), frames.end(), kDelimiter);
  if (delim == frames.end()) {
    return wire_error("missing_delimiter", "no '<IDS|MSG>' delimiter among " +
                                               std::to_string(frames.size()) + " frames");
  }
  const auto n_ids = static_cast<std::size_t>(delim - frames.begin());
  if (n_ids > limits.max_identities) {
    return wire_error("too_many_identities",
                      std::to_string(n_ids) + " routing identities, at most " +
                          std::to_string(limits.max_identities) + " allowed");
  }
  const std::size_t after = frames.size() - n_ids - 1;
  if (after < 5) {
    return wire_error("too_few_frames",
                      "need signature, header, parent_header, metadata and content after the "
                      "delimiter; got " +
                          std::to_string(after) + " frame(s)");
  }
  if (after - 5 > limits.max_buffers) {
    return wire_error("too_many_buffers", std::to_string(after - 5) + " buffers, at most " +
                                              std::to_string(limits.max_buffers) + " allowed");
  }
  RawMessage raw_msg;
  raw_msg.identities.assign(frames.begin(), delim);
  auto it = delim + 1;
  raw_msg.signature = *it++;
  raw_msg.header = *it++;
  raw_msg.parent_header = *it++;
  raw_msg.metadata = *it++;
  raw_msg.content = *it++;
  raw_msg.buffers.assign(it, frames.end());
  return raw_msg;
}

Result<void> verify(const RawMessage& raw_msg, const Signer& signer) {
  if (!signer.verify(raw_msg.signature, raw_msg.header, raw_msg.parent_header, raw_msg.metadata,
                     raw_msg.content)) {
    return wire_error("bad_signature", raw_msg.signature.empty()
                                           ? "message is not signed but the connection has a key"
                                           : "HMAC signature does not match the message");
  }
  return {};
}

Result<HeaderInfo> peek_header(std::string_view header_frame) {
  json header = json::parse(header_frame, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return wire_error("invalid_json", "header frame is not valid JSON");
  }
  if (!header.is_object()) {
    return wire_error("bad_shape", "header frame is not a JSON object");
  }
  HeaderInfo info;
  auto str = [&](const char* key, std::string& out) {
    auto f = header.find(key);
    if (f != header.end() && f->is_string()) {
      out = f->get<std::string>();
    }
  };
  str("msg_id", info.msg_id);
  str("msg_type", info.msg_type);
  str("session", info.session);
  if (info.msg_type.empty()) {
    return wire_error("bad_shape", "header has no msg_type");
  }
  return info;
}

Result<Message> parse(const RawMessage& raw_msg) {
  Message msg;
  json* targets[] = {&msg.header, &msg.parent_header, &msg.metadata, &msg.content};
  std::string_view sources[] = {raw_msg.header, raw_msg.parent_header, raw_msg.metadata,
                                raw_msg.content};
  for (std::size_t i = 0; i < 4; ++i) {
    *targets[i] = json::parse(sources[i], nullptr, /*allow_exceptions=*/false);
    if (targets[i]->is_discarded()) {
      return wire_error("invalid_json", std::string(kFrameNames[i]) + " frame is not valid JSON");
    }
    if (!targets[i]->is_object()) {
      return wire_error("bad_shape", std::string(kFrameNames[i]) + " frame is not a JSON object");
    }
  }
  if (msg.msg_type().empty()) {
    return wire_error("bad_shape", "header has no msg_type");
  }
  msg.identities.assign(raw_msg.identities.begin(), raw_msg.identities.end());
  msg.buffers.assign(raw_msg.buffers.begin(), raw_msg.buffers.end());
  return msg;
}

Result<Message> decode(std::span<const std::string_view> frames, const Signer& signer,
                       const Limits& limits) {
  CELLGATE_ASSIGN_OR_RETURN(RawMessage raw_msg, split(frames, limits));
  CELLGATE_TRY(verify(raw_msg, signer));
  return parse(raw_msg);
}

Result<Message> decode(const std::vector<std::string>& frames, const Signer& signer,
                       const Limits& limits) {
  std::vector<std::string_view> views(frames.begin(), frames.end());
  return decode(std::span<const std::string_view>(views), signer, limits);
}

// ---- encoding --------------------------------------------------------------------------------

std::vector<std::string> encode(const Message& msg, const Signer& signer) {
  std::vector<std::string> frames;
  frames.reserve(msg.identities.size() + 6 + msg.buffers.size());
  frames.insert(frames.end(), msg.identities.begin(), msg.identities.end());
  frames.emplace_back(kDelimiter);
  std::string header = dump_json(msg.header);
  std::string parent = dump_json(msg.parent_header);
  std::string metadata = dump_json(msg.metadata);
  std::string content = dump_json(msg.content);
  frames.push_back(signer.sign(header, parent, metadata, content));
  frames.push_back(std::move(header));
  frames.push_back(std::move(parent));
  frames.push_back(std::move(metadata));
  frames.push_back(std::move(content));
  frames.insert(frames.end(), msg.buffers.begin(), msg.buffers.end());
  return frames;
}

}  // namespace cellgate::protocol
