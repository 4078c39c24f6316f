// Signed /files URLs (signature.hpp).
#include "cellgate/envd/signature.hpp"

#include "cellgate/http/digest.hpp"

namespace cellgate::envd {

Result<std::optional<FileSignature>> parse_file_signature(
    http::Verb method, const std::map<std::string, std::string>& query) {
  auto sig = query.find("signature");
  if (sig == query.end()) {
    return std::optional<FileSignature>();
  }
  FileSignature out;
  out.signature = sig->second;
  out.operation = method == http::Verb::post ? "write" : "read";
  if (auto p = query.find("path"); p != query.end()) {
    out.path = p->second;
  }
  if (auto u = query.find("username"); u != query.end()) {
    out.user = u->second;
  }
  if (auto e = query.find("signature_expiration"); e != query.end()) {
    const std::string& text = e->second;
    if (text.empty() || text.size() > 12 ||
        text.find_first_not_of("0123456789") != std::string::npos) {
      return make_error(ErrorCode::kInvalidArgument, "bad_signature",
                        "signature_expiration must be unix seconds");
    }
    out.expiration = std::stoll(text);
  }
  return std::optional<FileSignature>(std::move(out));
}

std::string file_signature(std::string_view path, std::string_view operation, std::string_view user,
                           std::string_view token, std::optional<std::int64_t> expiration) {
  std::string raw;
  raw.append(path).append(":").append(operation).append(":").append(user).append(":").append(token);
  if (expiration) {
    raw.append(":").append(std::to_string(*expiration));
  }
  const std::string digest = http::sha256_base64_unpadded(raw);
  return digest.empty() ? "" : "v1_" + digest;  // "": matches nothing (check_file_signature)
}

SignatureCheck check_file_signature(const FileSignature& sig, std::string_view token,
                                    std::int64_t now_s) {
  if (token.empty()) {
    return SignatureCheck::kWrong;  // nothing to sign with
  }
  const std::string expected =
      file_signature(sig.path, sig.operation, sig.user, token, sig.expiration);
  if (expected.empty() || !http::token_equals(sig.signature, expected)) {
    return SignatureCheck::kWrong;
  }
  if (sig.expiration && *sig.expiration < now_s) {
    return SignatureCheck::kExpired;
  }
  return SignatureCheck::kValid;
}

}  // namespace cellgate::envd
