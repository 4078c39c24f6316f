// The one router: a request's path split into decoded segments and matched against patterns
// ("/api/kernels/{id}/execute"), so every API answers unknown paths (404) and wrong methods (405)
// the same way.
//
//   http::Router router;
//   router.add(Verb::get, "/api/kernels/{id}", [this](Call& c) { … c.param("id") … });
//   router.add(Verb::put, "/api/kernels/{id}/files/{path*}", …);   // {name*}: the rest
//   router.dispatch(std::move(req), exchange);                     // false: no route
//   router.pattern_of("/api/kernels/abc")                          // "/api/kernels/{id}"
//
// Thread-safety: add() before serving; dispatch() from any thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/http/message.hpp"

namespace cellgate::http {

// A request target: the path (percent-encoded, as received) and its decoded query.
struct Target {
  std::string path;
  std::map<std::string, std::string> query;
  static Target parse(std::string_view target);
};

// The path's segments, each percent-decoded; empty segments dropped.
std::vector<std::string> split_path(std::string_view path);
std::string percent_decode(std::string_view s, bool plus_is_space);

// One matched request.
struct Call {
  Request req;
  std::shared_ptr<Exchange> exchange;
  Target target;
  std::map<std::string, std::string> params;
  const std::string& param(const std::string& name) const;
  // Answers through the exchange.
  void reply(Response res) const { exchange->reply(std::move(res)); }
  void fail(const Error& error) const { exchange->reply(error_response(req, error)); }
};

class Router {
 public:
  using Route = std::function<void(Call&)>;
  void add(Verb method, std::string_view pattern, Route route);
  // Several methods on one pattern.
  void add(std::initializer_list<Verb> methods, std::string_view pattern, Route route);

  enum class Match { kFound, kNoPath, kNoMethod };
  // Runs the route for `call.req` (call.params filled in). kNoPath / kNoMethod: nothing ran.
  Match dispatch(Call& call) const;
  // The pattern as added of the first route whose path matches `path` (any method), "" for
  // none: a label whose values are bounded by the routes (GET /metrics), never the path itself.
  std::string pattern_of(std::string_view path) const;

 private:
  struct Entry {
    Verb method;
    std::string pattern;
    std::vector<std::string> segments;  // literal, "{name}", or a last "{name*}"
    Route route;
  };
  std::vector<Entry> entries_;
};

}  // namespace cellgate::http
