// The Jupyter wire format: ZeroMQ multipart frames <-> messages, with HMAC signatures.
//
//   [identities...] "<IDS|MSG>" signature header parent_header metadata content [buffers...]
//
// Decoding runs in three steps, so that a router can stop early: split() checks the shape and
// the size limit without parsing JSON, verify() checks the HMAC over the four raw JSON frames,
// parse() turns them into nlohmann::json. peek_header() parses the header frame alone, which is
// all the gateway needs to route a message whose bytes it forwards unchanged.
//
//   Signer signer = *Signer::create("hmac-sha256", key);
//   auto msg = decode(frames, signer);               // Result<Message>
//   if (!msg) { log(msg.error().describe()); }       // "bad_signature: ..."
//   std::vector<std::string> out = encode(*msg, signer);
//
// Every error is a value with a reason: too_few_frames, missing_delimiter, too_large,
// bad_signature, invalid_json, bad_shape. Nothing here throws or aborts on untrusted input.
//
// Thread-safety: functions are pure; a Signer is immutable and may be shared between threads.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/protocol/message.hpp"
#include "cellgate/result.hpp"

namespace xeus {
class xauthentication;
}

namespace cellgate::protocol {

inline constexpr std::string_view kDelimiter = "<IDS|MSG>";

// Signs and verifies the four JSON frames. Built on xeus::make_xauthentication (OpenSSL HMAC,
// constant-time comparison with CRYPTO_memcmp). An empty key means no signing: the signature
// frame is empty and is not checked, as in jupyter_client.
class Signer {
 public:
  // scheme is the connection file's signature_scheme, e.g. "hmac-sha256".
  static Result<Signer> create(std::string_view scheme, std::string key);
  Signer();  // no key: no signing
  ~Signer();
  Signer(Signer&&) noexcept;
  Signer& operator=(Signer&&) noexcept;

  bool enabled() const { return auth_ != nullptr; }
  std::string sign(std::string_view header, std::string_view parent_header,
                   std::string_view metadata, std::string_view content) const;
  bool verify(std::string_view signature, std::string_view header, std::string_view parent_header,
              std::string_view metadata, std::string_view content) const;

 private:
  std::unique_ptr<xeus::xauthentication> auth_;
  std::size_t signature_size_ = 0;  // hex digest length: 64 for hmac-sha256
};

struct Limits {
  std::size_t max_message_bytes = 256u << 20;  // all frames together
  std::size_t max_identities = 16;
  std::size_t max_buffers = 1024;
};

// Frames as received, JSON unparsed. Views point into the caller's frames.
struct RawMessage {
  std::vector<std::string_view> identities;
  std::string_view signature;
  std::string_view header;
  std::string_view parent_header;
  std::string_view metadata;
  std::string_view content;
  std::vector<std::string_view> buffers;
};

// The routing fields of a header, parsed from the header frame alone.
struct HeaderInfo {
  std::string msg_id;
  std::string msg_type;
  std::string session;
};

// Checks shape and size; parses nothing.
Result<RawMessage> split(std::span<const std::string_view> frames, const Limits& limits = {});
Result<void> verify(const RawMessage& raw, const Signer& signer);
Result<HeaderInfo> peek_header(std::string_view header_frame);
Result<Message> parse(const RawMessage& raw);

// split + verify + parse.
Result<Message> decode(std::span<const std::string_view> frames, const Signer& signer,
                       const Limits& limits = {});
Result<Message> decode(const std::vector<std::string>& frames, const Signer& signer,
                       const Limits& limits = {});

// Serializes and signs. JSON that is not valid UTF-8 is replaced (U+FFFD), never thrown.
std::vector<std::string> encode(const Message& msg, const Signer& signer);

}  // namespace cellgate::protocol
