// E2B's signatures' form: the standard base64 of SHA-256(data) without its '=' padding, as
// envd's signed file URLs (envd/signature.hpp) and the lifecycle webhooks' e2b-signature use it.
//
//   std::string sig = "v1_" + http::sha256_base64_unpadded("<path>:read::<token>");
//
// Thread-safety: a pure function.
#pragma once

#include <string>
#include <string_view>

namespace cellgate::http {

// "" only if OpenSSL fails (out of memory): no signature matches it.
std::string sha256_base64_unpadded(std::string_view data);

}  // namespace cellgate::http
