// This node's peers (NodeOptions::peers) as addresses to ask: node.cpp's lists and moves.cpp's
// choice of where a kernel goes.
#pragma once

#include <string>
#include <vector>

#include "cellgate/api/api.hpp"
#include "cellgate/http/client.hpp"

namespace cellgate::api {

// Every address each peer spec names now (a headless Service's name gives one per pod), below
// `base` (the base URL without its trailing slash); the specs that resolved to nothing go to
// `unresolved`. At most 256.
std::vector<http::client::Url> resolve_peers(const NodeOptions& node, const std::string& base,
                                             std::vector<std::string>& unresolved);

}  // namespace cellgate::api
