// This gateway as one node of a cluster (docs/scale-out.md): its identity and drain switch
// (GET /api/node, POST /api/node/drain), and the lists that answer the same from any node (GET
// /api/kernels and /api/sessions merge every peer's own list, asked with ?scope=local, within a
// short deadline each; the peers that did not answer are named in X-Cellgate-Missing-Peers).
#include <netdb.h>
#include <sys/socket.h>

#include <future>
#include <set>

#include "cellgate/api/api.hpp"
#include "cellgate/http/client.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/http/message.hpp"
#include "peers.hpp"
#include "spdlog/spdlog.h"

namespace cellgate::api {
namespace {

using http::Response;
using http::Status;
using nlohmann::json;

constexpr std::size_t kMaxPeers = 256;                // endpoints asked per list
constexpr std::size_t kMaxPeerListBytes = 64u << 20;  // one peer's answer

// "host[:port]" → host and port ("[v6]:port" too); no port: `own`.
std::pair<std::string, std::string> split_host_port(const std::string& spec, int own) {
  if (!spec.empty() && spec.front() == '[') {
    const auto close = spec.find(']');
    if (close != std::string::npos) {
      const std::string host = spec.substr(1, close - 1);
      if (close + 1 < spec.size() && spec[close + 1] == ':') {
        return {host, spec.substr(close + 2)};
      }
      return {host, std::to_string(own)};
    }
  }
  const auto colon = spec.rfind(':');
  if (colon != std::string::npos && spec.find(':') == colon) {
    return {spec.substr(0, colon), spec.substr(colon + 1)};
  }
  return {spec, std::to_string(own)};
}

std::string peer_name(const http::client::Url& url) {
  return (url.host.find(':') != std::string::npos ? "[" + url.host + "]" : url.host) + ":" +
         url.port;
}

}  // namespace

std::vector<http::client::Url> resolve_peers(const NodeOptions& node, const std::string& base,
                                             std::vector<std::string>& unresolved) {
  std::vector<http::client::Url> out;
  std::set<std::string> seen;
  for (const auto& spec : node.peers) {
    auto [host, port] = split_host_port(spec, node.own_port);
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
      unresolved.push_back(spec);
      continue;
    }
    for (addrinfo* a = found; a != nullptr && out.size() < kMaxPeers; a = a->ai_next) {
      char addr[NI_MAXHOST];
      if (::getnameinfo(a->ai_addr, a->ai_addrlen, addr, sizeof addr, nullptr, 0, NI_NUMERICHOST) !=
          0) {
        continue;
      }
      const std::string key = std::string(addr) + " " + port;
      if (seen.insert(key).second) {
        out.push_back(http::client::Url{false, addr, port, base});
      }
    }
    ::freeaddrinfo(found);
  }
  return out;
}

bool Api::fans_out(const http::Target& target) const {
  if (options_.node.peers.empty()) {
    return false;
  }
  auto scope = target.query.find("scope");
  return scope == target.query.end() || scope->second != "local";
}

json Api::merge_peer_lists(const std::string& path, json local,
                           std::vector<std::string>& missing) const {
  std::string base = options_.base_url;
  while (!base.empty() && base.back() == '/') {
    base.pop_back();
  }
  auto peers = resolve_peers(options_.node, base, missing);
  std::vector<std::future<Result<http::client::Response>>> asked;
  asked.reserve(peers.size());
  for (const auto& url : peers) {
    asked.push_back(std::async(std::launch::async, [this, url, &path] {
      http::client::Client client(url, options_.token, "cellgate-peer");
      return client.request("GET", path + "?scope=local", "", options_.node.peer_deadline,
                            "application/json", kMaxPeerListBytes);
    }));
  }
  std::set<std::string> ids;
  for (const auto& item : local) {
    if (item.is_object() && item.contains("id") && item["id"].is_string()) {
      ids.insert(item["id"].get<std::string>());
    }
  }
  for (std::size_t i = 0; i < asked.size(); ++i) {
    auto answer = asked[i].get();
    json list = answer && answer->status == 200 ? http::parse_json(answer->body) : json();
    if (!list.is_array()) {
      missing.push_back(peer_name(peers[i]));
      continue;
    }
    for (auto& item : list) {
      if (!item.is_object() || !item.contains("id") || !item["id"].is_string()) {
        continue;
      }
      if (ids.insert(item["id"].get<std::string>()).second) {
        local.push_back(std::move(item));
      }
    }
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing) {
      names += (names.empty() ? "" : ", ") + m;
    }
    spdlog::warn("{}: merged without peers that did not answer within {} ms: {}", path,
                 options_.node.peer_deadline.count(), names);
  }
  return local;
}

void Api::reply_list(http::Call& c, const std::string& path, json local) {
  if (!fans_out(c.target)) {
    return c.reply(http::json_response(c.req, Status::ok, local));
  }
  offload(
      [this, req = c.req, path, local = std::move(local)]() mutable {
        std::vector<std::string> missing;
        json merged = merge_peer_lists(path, std::move(local), missing);
        Response res = http::json_response(req, Status::ok, merged);
        if (!missing.empty()) {
          std::string names;
          for (const auto& m : missing) {
            names += (names.empty() ? "" : ",") + m;
          }
          res.set("X-Cellgate-Missing-Peers", names);
        }
        return res;
      },
      [ex = c.exchange](Response r) { ex->reply(std::move(r)); });
}

void Api::add_node_routes() {
  router_.add(Verb::get, "/api/node", [this](Call& c) {
    c.reply(http::json_response(c.req, Status::ok,
                                json{{"tag", node_tag_},
                                     {"epoch", node_epoch_},
                                     {"draining", registry_.draining()},
                                     {"room_percent", registry_.room_percent()},
                                     {"kernels", registry_.list().size()},
                                     {"peers", options_.node.peers}}));
  });
  // {"drain": true} (the default) stops kernel starts here, {"drain": false} resumes them. The
  // agent-check port says "drain" meanwhile, so a router sends creates elsewhere.
  router_.add(Verb::post, "/api/node/drain", [this](Call& c) {
    json body = c.req.body().empty() ? json::object() : http::parse_json(c.req.body());
    if (!body.is_object() || (body.contains("drain") && !body["drain"].is_boolean())) {
      return c.fail(make_error(ErrorCode::kInvalidArgument, "bad_request",
                               "the body is {\"drain\": true|false}"));
    }
    registry_.set_draining(body.value("drain", true));
    c.reply(http::json_response(
        c.req, Status::ok,
        json{{"draining", registry_.draining()}, {"kernels", registry_.list().size()}}));
  });
}

}  // namespace cellgate::api
