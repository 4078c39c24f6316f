#include "cellgate/sandboxes/webhooks.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "cellgate/http/digest.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::sandboxes {

Result<std::unique_ptr<Webhooks>> Webhooks::create(WebhookOptions options, util::Offload offload) {
  std::vector<http::client::Url> urls;
  for (const auto& text : options.urls) {
    auto url = http::client::parse_url(text);
    if (!url) {
      return make_error(ErrorCode::kInvalidArgument, "webhook",
                        "--e2b-webhook " + text + ": " + url.error().message);
    }
    urls.push_back(std::move(url).value());
  }
  if (options.secret.size() < 16) {
    return make_error(ErrorCode::kInvalidArgument, "webhook",
                      "webhooks are signed: give a secret of 16 characters at least "
                      "(--e2b-webhook-secret-file)");
  }
  CELLGATE_ASSIGN_OR_RETURN(auto signer, protocol::Signer::create("hmac-sha256", options.secret));
  return std::unique_ptr<Webhooks>(
      new Webhooks(std::move(options), std::move(urls), std::move(signer), std::move(offload)));
}

Webhooks::Webhooks(WebhookOptions options, std::vector<http::client::Url> urls,
                   protocol::Signer signer, util::Offload offload)
    : options_(std::move(options)),
      urls_(std::move(urls)),
      signer_(std::move(signer)),
      offload_(std::move(offload)) {}

nlohmann::json Webhooks::event(std::string_view label, const Sandbox& sandbox) {
  return nlohmann::json{{"version", "v1"},
                        {"id", protocol::new_uuid()},
                        {"type", "sandbox.lifecycle." + std::string(label)},
                        {"eventCategory", "lifecycle"},
                        {"eventLabel", label},
                        {"eventData", nullptr},
                        {"sandboxId", sandbox.id},
                        {"sandboxTemplateId", sandbox.template_id},
                        {"sandboxTeamId", sandbox.tenant.empty() ? "operator" : sandbox.tenant},
                        {"sandboxMetadata", sandbox.metadata},
                        {"timestamp", iso8601(std::chrono::system_clock::now())}};
}

std::string Webhooks::body(std::string_view label, const Sandbox& sandbox) {
  return event(label, sandbox).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Webhooks::signature(std::string_view body) const {
  return "sha256=" + signer_.sign(body, "", "", "");
}

std::string Webhooks::e2b_signature(std::string_view body) const {
  std::string data = options_.secret;
  data.append(body);
  return http::sha256_base64_unpadded(data);
}

void Webhooks::send(const nlohmann::json& event) {
  const std::string payload = event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string label = event.value("eventLabel", std::string());
  const std::string sandbox_id = event.value("sandboxId", std::string());
  const std::string signed_as = signature(payload);
  const std::string e2b_signed = e2b_signature(payload);
  for (std::size_t i = 0; i < urls_.size(); ++i) {
    const auto& url = urls_[i];
    const std::string webhook_id = "cellgate-webhook-" + std::to_string(i + 1);
    if (in_flight_->fetch_add(1) >= options_.max_in_flight) {
      in_flight_->fetch_sub(1);
      spdlog::warn("webhook {}:{}{}: {} deliveries wait already; {} of sandbox {} dropped",
                   url.host, url.port, url.base, options_.max_in_flight, label, sandbox_id);
      continue;
    }
    offload_([url, payload, signed_as, e2b_signed, webhook_id, timeout = options_.timeout,
              in_flight = in_flight_, what = label + " of sandbox " + sandbox_id] {
      // The URL's path is its base: the target below it is empty.
      http::client::Client client(url, "", "cellgate-webhook",
                                  {{"X-Cellgate-Signature", signed_as},
                                   {"e2b-signature-version", "v1"},
                                   {"e2b-signature", e2b_signed},
                                   {"e2b-webhook-id", webhook_id},
                                   {"e2b-delivery-id", protocol::new_uuid()}});
      auto sent = client.request("POST", url.base.empty() ? "/" : "", payload, timeout);
      if (!sent) {
        spdlog::warn("webhook: {}: {}", what, sent.error().message);
      } else if (sent->status < 200 || sent->status >= 300) {
        spdlog::warn("webhook {}:{}{}: {} answered {}", url.host, url.port, url.base, what,
                     sent->status);
      }
      in_flight->fetch_sub(1);
    });
  }
}

}  // namespace cellgate::sandboxes
