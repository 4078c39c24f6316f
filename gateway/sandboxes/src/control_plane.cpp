// E2B's control plane on the E2B port (front.hpp): the routes E2B's SDK calls with its API key,
// their shapes in model.hpp, the work in registry.hpp. docs/e2b.md, "The control plane".
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "cellgate/sandboxes/front.hpp"
#include "front_support.hpp"

namespace cellgate::sandboxes {
namespace {

using http::Call;
using http::Status;
using http::Verb;
using nlohmann::json;

std::optional<SystemTime> unix_seconds(const std::map<std::string, std::string>& query,
                                       const char* name) {
  auto it = query.find(name);
  if (it == query.end() || it->second.empty()) {
    return std::nullopt;
  }
  long long v = 0;
  auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
  if (ec != std::errc() || end != it->second.data() + it->second.size()) {
    return std::nullopt;
  }
  return SystemTime(std::chrono::seconds(v));
}

}  // namespace

void E2bFront::add_routes() {
  // Every route runs after handle() found a caller (front.cpp).
  auto caller = [this](const Call& c) { return *caller_of(c.req); };
  const Shape& shape = sandboxes_.options().shape;

  auto create = [this, caller, &shape](Call& c) {
    auto request = parse_create_request(c.req.body());
    if (!request) {
      return c.reply(e2b_error(c.req, request.error()));
    }
    offload_([this, who = caller(c), req = c.req, ex = c.exchange, body = *request, &shape] {
      auto made = sandboxes_.create(who, body);
      ex->reply(made ? http::json_response(req, Status::created, sandbox_json(*made, shape))
                     : e2b_error(req, made.error()));
    });
  };
  router_.add(Verb::post, "/sandboxes", create);
  router_.add(Verb::post, "/v2/sandboxes", create);

  auto list = [this, caller, &shape](Call& c) {
    auto query = parse_list_query(c.target.query);
    if (!query) {
      return c.reply(e2b_error(c.req, query.error()));
    }
    Page page = list_page(sandboxes_.visible(caller(c)), *query);
    json items = json::array();
    for (const auto& s : page.items) {
      items.push_back(listed_json(s, shape));
    }
    auto res = http::json_response(c.req, Status::ok, items);
    if (!page.next_token.empty()) {
      res.set("X-Next-Token", page.next_token);
    }
    c.reply(std::move(res));
  };
  router_.add(Verb::get, "/v2/sandboxes", list);
  router_.add(Verb::get, "/sandboxes", list);

  router_.add(Verb::get, "/sandboxes/{id}", [this, caller, &shape](Call& c) {
    auto s = sandboxes_.get(caller(c), c.param("id"));
    c.reply(s ? http::json_response(c.req, Status::ok, detail_json(*s, shape))
              : e2b_error(c.req, s.error()));
  });

  router_.add(Verb::delete_, "/sandboxes/{id}", [this, caller](Call& c) {
    offload_([this, who = caller(c), req = c.req, ex = c.exchange, id = c.param("id")] {
      auto killed = sandboxes_.kill(who, id);
      ex->reply(killed ? http::text_response(req, Status::no_content, "")
                       : e2b_error(req, killed.error()));
    });
  });

  router_.add(Verb::post, "/sandboxes/{id}/pause", [this, caller](Call& c) {
    offload_([this, who = caller(c), req = c.req, ex = c.exchange, id = c.param("id")] {
      auto paused = sandboxes_.pause(who, id);
      if (!paused) {
        return ex->reply(e2b_error(req, paused.error()));
      }
      ex->reply(*paused ? http::text_response(req, Status::no_content, "")
                        : e2b_error(req, Status::conflict, "sandbox " + id + " is already paused",
                                    "paused"));
    });
  });

  auto connect = [this, caller, &shape](Call& c) {
    auto body = http::body_object(c.req);
    auto timeout = body ? parse_timeout(*body, kDefaultTimeoutSeconds) : Result<int>(body.error());
    if (!timeout) {
      return c.reply(e2b_error(c.req, timeout.error()));
    }
    offload_([this, who = caller(c), req = c.req, ex = c.exchange, id = c.param("id"),
              seconds = *timeout, &shape] {
      auto connected = sandboxes_.connect(who, id, seconds);
      if (!connected) {
        return ex->reply(e2b_error(req, connected.error()));
      }
      ex->reply(http::json_response(req, connected->resumed ? Status::created : Status::ok,
                                    sandbox_json(connected->sandbox, shape)));
    });
  };
  router_.add(Verb::post, "/sandboxes/{id}/connect", connect);
  router_.add(Verb::post, "/v2/sandboxes/{id}/connect", connect);
  router_.add(Verb::post, "/sandboxes/{id}/resume", connect);

  router_.add(Verb::post, "/sandboxes/{id}/timeout", [this, caller](Call& c) {
    auto body = http::body_object(c.req);
    auto timeout = body ? parse_timeout(*body, -1) : Result<int>(body.error());
    if (timeout && *timeout < 0) {
      timeout = make_error(ErrorCode::kInvalidArgument, "bad_timeout", "timeout is required");
    }
    if (!timeout) {
      return c.reply(e2b_error(c.req, timeout.error()));
    }
    auto set = sandboxes_.set_timeout(caller(c), c.param("id"), *timeout);
    c.reply(set ? http::text_response(c.req, Status::no_content, "")
                : e2b_error(c.req, set.error()));
  });

  router_.add(Verb::put, "/sandboxes/{id}/network", [this, caller](Call& c) {
    if (auto s = sandboxes_.get(caller(c), c.param("id")); !s) {
      return c.reply(e2b_error(c.req, s.error()));
    }
    c.reply(e2b_error(c.req, Status::bad_request,
                      "sandboxes here have no network at all (the jail's), so there are no "
                      "egress rules to change",
                      "no_network"));
  });

  router_.add(Verb::post, "/sandboxes/{id}/snapshots", [this, caller](Call& c) {
    auto body = http::body_object(c.req);
    std::string name;
    if (body) {
      if (auto it = body->find("name"); it != body->end() && it->is_string()) {
        name = it->get<std::string>().substr(0, 128);
      }
    }
    offload_([this, who = caller(c), req = c.req, ex = c.exchange, id = c.param("id"), name] {
      auto snap = sandboxes_.snapshot(who, id, name);
      ex->reply(snap ? http::json_response(req, Status::created, snap->to_json())
                     : e2b_error(req, snap.error()));
    });
  });

  // E2B's events API: the caller's sandboxes' lifecycle events, newest first by default.
  auto events = [this, caller](Call& c) {
    auto q = parse_event_query(c.req.target());
    if (!q) {
      return c.reply(e2b_error(c.req, q.error()));
    }
    if (c.params.count("id") != 0) {
      q->sandbox_id = c.param("id");
    }
    c.reply(http::json_response(
        c.req, Status::ok,
        sandboxes_.events().query(caller(c), *q, std::chrono::system_clock::now())));
  };
  router_.add(Verb::get, "/events/sandboxes", events);
  router_.add(Verb::get, "/events/sandboxes/{id}", events);

  router_.add(Verb::get, "/snapshots", [this, caller](Call& c) {
    auto limit = parse_limit(c.target.query);
    if (!limit) {
      return c.reply(e2b_error(c.req, limit.error()));
    }
    auto param = [&c](const char* name) {
      auto it = c.target.query.find(name);
      return it == c.target.query.end() ? std::string() : it->second;
    };
    const std::string sandbox = param("sandboxID"), name = param("name"),
                      token = param("nextToken");
    std::uint64_t after = 0;
    if (!token.empty()) {
      auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), after);
      if (ec != std::errc() || end != token.data() + token.size()) {
        return c.reply(e2b_error(c.req, Status::bad_request, "bad nextToken", "bad_query"));
      }
    }
    auto all = sandboxes_.snapshots(caller(c));  // newest first
    std::erase_if(all, [&](const SnapshotRecord& s) {
      return (!sandbox.empty() && s.sandbox_id != sandbox) ||
             (!name.empty() && std::find(s.names.begin(), s.names.end(), name) == s.names.end()) ||
             (after != 0 && s.seq >= after);
    });
    std::string next;
    if (all.size() > *limit) {
      all.resize(*limit);
      next = std::to_string(all.back().seq);
    }
    json items = json::array();
    for (const auto& s : all) {
      items.push_back(s.to_json());
    }
    auto res = http::json_response(c.req, Status::ok, items);
    if (!next.empty()) {
      res.set("X-Next-Token", next);
    }
    c.reply(std::move(res));
  });

  router_.add(Verb::delete_, "/templates/{id}", [this, caller](Call& c) {
    offload_([this, who = caller(c), req = c.req, ex = c.exchange, id = c.param("id")] {
      auto gone = sandboxes_.delete_snapshot(who, id);
      ex->reply(gone ? http::text_response(req, Status::no_content, "")
                     : e2b_error(req, gone.error()));
    });
  });

  router_.add(Verb::post, "/sandboxes/{id}/fork", [this, caller, &shape](Call& c) {
    auto request = parse_fork_request(c.req.body());
    if (!request) {
      return c.reply(e2b_error(c.req, request.error()));
    }
    offload_([this, who = caller(c), req = c.req, ex = c.exchange, id = c.param("id"),
              body = *request, &shape] {
      auto forks = sandboxes_.fork(who, id, body);
      if (!forks) {
        return ex->reply(e2b_error(req, forks.error()));
      }
      json out = json::array();
      for (const auto& f : *forks) {
        if (f) {
          out.push_back({{"sandbox", sandbox_json(*f, shape)}});
        } else {
          out.push_back({{"error",
                          {{"code", static_cast<int>(e2b_status(f.error()))},
                           {"message", f.error().message}}}});
        }
      }
      ex->reply(http::json_response(req, Status::created, out));
    });
  });

  router_.add(Verb::get, "/sandboxes/{id}/metrics", [this, caller, &shape](Call& c) {
    offload_([this, who = caller(c), req = c.req, ex = c.exchange, id = c.param("id"),
              start = unix_seconds(c.target.query, "start"),
              end = unix_seconds(c.target.query, "end"), &shape] {
      auto metrics = sandboxes_.metrics(who, id, start, end);
      if (!metrics) {
        return ex->reply(e2b_error(req, metrics.error()));
      }
      json out = json::array();
      for (const auto& m : *metrics) {
        out.push_back(m.to_json(shape.cpu_count));
      }
      ex->reply(http::json_response(req, Status::ok, out));
    });
  });

  router_.add(Verb::get, "/templates/aliases/{alias}", [this, caller](Call& c) {
    auto found = sandboxes_.template_alias(caller(c), c.param("alias"));
    c.reply(found ? http::json_response(c.req, Status::ok, *found)
                  : e2b_error(c.req, found.error()));
  });
}

}  // namespace cellgate::sandboxes
