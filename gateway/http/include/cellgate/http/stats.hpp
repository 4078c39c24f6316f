// What the HTTP layer turned away or cut, by reason (GET /metrics): the listener's refusals,
// the sessions' 400/413/408s, WebSocket connections dropped for a budget, the Api's 401/403s;
// and every request's duration by method, route pattern and status code. Shared through
// HttpOptions::stats (null: nothing is counted).
//
//   auto timed = std::make_shared<TimedExchange>(stats, req.method_string(), exchange);
//   timed->set_route("/api/kernels/{id}");   // a pattern, never the path: bounded labels
//   timed->reply(res);                        // observed: GET /api/kernels/{id} 200
//
// Each observed request is also one access-log line, as jupyter_server writes them:
// "404 GET /api/kernels/x (127.0.0.1) 0.52ms", at debug for 1xx/2xx and 304, info for other 3xx,
// warn for 4xx, error for 5xx. The path is logged without its query (tokens travel there as
// ?token=), at most 256 bytes, bytes outside printable ASCII as '?'.
//
// Thread-safety: updated from every network thread at once.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "cellgate/http/message.hpp"
#include "cellgate/util/metrics.hpp"

namespace cellgate::http {

struct HttpStats {
  util::Counter accepted;           // connections accepted and served
  util::LabeledCounter rejected;    // requests or connections refused, by reason
  util::LabeledCounter ws_dropped;  // WebSocket connections the gateway closed, by reason
  // Seconds from a request's arrival at a handler to its whole answer (a streamed answer's end;
  // a WebSocket upgrade's decision), by method, route pattern ("other" for no route) and code.
  util::HistogramVec requests{{"method", "route", "code"},
                              {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
};

// The method as a label: the standard verbs by name, anything else "other" (Beast keeps an
// unknown method's text, which a client chooses).
std::string method_label(const Request& req);

// An Exchange that observes its request in stats->requests when the answer is complete (reply(),
// end(), or its destruction after begin() without end(): the client left mid-stream).
class TimedExchange : public Exchange {
 public:
  TimedExchange(std::shared_ptr<HttpStats> stats, std::string method,
                std::shared_ptr<Exchange> inner);
  ~TimedExchange() override;
  // The route pattern; "other" until set. Before the answer.
  void set_route(std::string route) { route_ = std::move(route); }
  // The request's path (no query) for the access log.
  void set_path(std::string_view path);

  void reply(Response res) override;
  void begin(Response head) override;
  bool write(std::string data) override { return inner_->write(std::move(data)); }
  void end() override;
  void watch(std::function<void()> on_gone) override { inner_->watch(std::move(on_gone)); }
  std::string peer() const override { return inner_->peer(); }
  std::size_t unsent() const override { return inner_->unsent(); }
  void abort() override {
    inner_->abort();
    observe();
  }

 private:
  void observe();
  std::shared_ptr<HttpStats> stats_;
  std::string method_;
  std::string route_ = "other";
  std::string path_;
  std::shared_ptr<Exchange> inner_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  unsigned code_ = 0;  // once begun or replied
  bool observed_ = false;
};

}  // namespace cellgate::http
