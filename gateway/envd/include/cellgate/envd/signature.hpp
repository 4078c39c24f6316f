// Signed /files URLs, as E2B's SDK makes them for a sandbox created `secure`
// (Sandbox.uploadUrl/downloadUrl): the query carries
//   signature=v1_<unpadded base64 of sha256("<path>:<read|write>:<user>:<token>[:<expiration>]")>
//   signature_expiration=<unix seconds>   (optional)
//   username=<user>                       (optional; "" in the signed string when absent)
// where <path> is the query's `path` exactly as given (no normalisation: the SDK signs what it
// puts in the URL) and <token> the sandbox's envdAccessToken.
//
//   auto sig = envd::parse_file_signature(http::Verb::get, target.query);   // nullopt: unsigned
//   switch (envd::check_file_signature(**sig, sandbox.access_token, now_s)) { … }
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "cellgate/http/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::envd {

struct FileSignature {
  std::string path, operation /* "read" | "write" */, user, signature;
  std::optional<std::int64_t> expiration;  // unix seconds
};

// The signature a query carries (GET: read, POST: write); nullopt when it has no `signature`;
// kInvalidArgument for a malformed `signature_expiration`.
Result<std::optional<FileSignature>> parse_file_signature(
    http::Verb method, const std::map<std::string, std::string>& query);

// "v1_…" for these fields under `token`.
std::string file_signature(std::string_view path, std::string_view operation, std::string_view user,
                           std::string_view token, std::optional<std::int64_t> expiration);

enum class SignatureCheck { kValid, kWrong, kExpired };
// Compares in constant time; kExpired only for a signature that is right but past its time.
SignatureCheck check_file_signature(const FileSignature& sig, std::string_view token,
                                    std::int64_t now_s);

}  // namespace cellgate::envd
