// What the HTTP layer turned away or cut, by reason (GET /metrics): the listener's refusals,
// the sessions' 400/413/408s, WebSocket connections dropped for a budget, the Api's 401/403s.
// Shared through HttpOptions::stats (null: nothing is counted).
//
// Thread-safety: updated from every network thread at once.
#pragma once

#include "cellgate/util/metrics.hpp"

namespace cellgate::http {

struct HttpStats {
  util::Counter accepted;           // connections accepted and served
  util::LabeledCounter rejected;    // requests or connections refused, by reason
  util::LabeledCounter ws_dropped;  // WebSocket connections the gateway closed, by reason
};

}  // namespace cellgate::http
