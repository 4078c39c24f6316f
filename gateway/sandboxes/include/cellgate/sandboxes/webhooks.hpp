// Lifecycle webhooks: what E2B's events API reports about a sandbox (created, paused, resumed,
// snapshotted, killed), POSTed as JSON to every URL the operator configured (`serve
// --e2b-webhook URL --e2b-webhook-secret-file FILE`), signed: `X-Cellgate-Signature:
// sha256=<hex>`, the HMAC-SHA256 of the body under the shared secret (protocol::Signer, the
// Jupyter wire's own signer). Each delivery also carries E2B's own headers, so a receiver written
// for E2B's webhooks verifies it unchanged: `e2b-signature-version: v1`, `e2b-signature` (the
// unpadded base64 of SHA-256 over the secret followed by the body), `e2b-webhook-id` (one per
// configured URL) and `e2b-delivery-id` (one per delivery). The body:
//
//   {"version": "v1", "id", "type": "sandbox.lifecycle.killed", "eventCategory": "lifecycle",
//    "eventLabel": "killed", "eventData": null, "sandboxId", "sandboxTemplateId",
//    "sandboxTeamId" (the tenant, or "operator"), "sandboxMetadata", "timestamp"}
//
// Each delivery is one attempt on the offload pool with a deadline (5 s); a receiver that fails
// or is slow is logged, never retried, and at most `max_in_flight` deliveries wait at once (the
// rest are dropped and counted in the log): a webhook can never hold a sandbox's lifecycle up.
//
//   auto hooks = Webhooks::create({.urls = {"http://127.0.0.1:9000/hook"}, .secret = s}, offload);
//   hooks.value()->send(Webhooks::event("created", sandbox));
//
// Thread-safety: send() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/http/client.hpp"
#include "cellgate/protocol/codec.hpp"
#include "cellgate/result.hpp"
#include "cellgate/sandboxes/model.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::sandboxes {

struct WebhookOptions {
  std::vector<std::string> urls;  // http:// or https://
  std::string secret;             // 16 characters at least
  std::chrono::milliseconds timeout{5000};
  int max_in_flight = 64;
};

class Webhooks {
 public:
  // kInvalidArgument for a URL that is not http(s), or a secret shorter than 16 characters.
  static Result<std::unique_ptr<Webhooks>> create(WebhookOptions options, util::Offload offload);
  // Delivers one event (event()'s) to every URL.
  void send(const nlohmann::json& event);
  // One lifecycle event, as the webhooks and the events API (events.hpp) show it. `label`:
  // created | paused | resumed | snapshotted | killed.
  static nlohmann::json event(std::string_view label, const Sandbox& sandbox);
  // The body send() sends for event(label, sandbox) and its signature header's value (tests;
  // receivers' documentation).
  static std::string body(std::string_view label, const Sandbox& sandbox);
  std::string signature(std::string_view body) const;
  // E2B's `e2b-signature`: base64 of SHA-256(secret ‖ body), without its `=` padding.
  std::string e2b_signature(std::string_view body) const;

 private:
  Webhooks(WebhookOptions options, std::vector<http::client::Url> urls, protocol::Signer signer,
           util::Offload offload);

  const WebhookOptions options_;
  const std::vector<http::client::Url> urls_;
  const protocol::Signer signer_;
  util::Offload offload_;
  std::shared_ptr<std::atomic<int>> in_flight_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace cellgate::sandboxes
