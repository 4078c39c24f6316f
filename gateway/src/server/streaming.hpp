// Internal: answering an agent execution either as one JSON object or as a stream of events
// (NDJSON for `Accept: application/x-ndjson`, Server-Sent Events for `text/event-stream`),
// and noticing a client that leaves so its cell is stopped. Used by the Api and the E2B routes.
#pragma once

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cctype>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/server/api.hpp"
#include "cellgate/server/execute.hpp"

namespace cellgate::server::detail {

enum class StreamFormat { kJson, kNdjson, kSse };

inline StreamFormat stream_format(const Request& req) {
  auto it = req.find(http::field::accept);
  if (it == req.end()) {
    return StreamFormat::kJson;
  }
  std::string accept(it->value());
  for (auto& c : accept) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (accept.find("application/x-ndjson") != std::string::npos ||
      accept.find("application/jsonl") != std::string::npos) {
    return StreamFormat::kNdjson;
  }
  if (accept.find("text/event-stream") != std::string::npos) {
    return StreamFormat::kSse;
  }
  return StreamFormat::kJson;
}

inline std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline std::string encode_event(StreamFormat format, const nlohmann::json& event) {
  if (format == StreamFormat::kSse) {
    return "event: " + event.value("type", std::string("message")) + "\ndata: " +
           dump_json(event) + "\n\n";
  }
  return dump_json(event) + "\n";
}

// A streamed answer's header: 200, the event media type, never cached or buffered by proxies.
inline Response stream_head(const Request& req, const std::string& content_type) {
  Response head{http::status::ok, req.version()};
  head.set(http::field::server, "cellgate");
  head.set(http::field::content_type, content_type);
  head.set(http::field::cache_control, "no-cache");
  head.set("X-Accel-Buffering", "no");
  head.keep_alive(req.keep_alive());
  return head;
}

// Who asked, for the audit log: the peer address and the User-Agent.
inline std::string describe_client(const Request& req, const Exchange& exchange) {
  std::string who = exchange.peer();
  if (auto ua = req.find(http::field::user_agent); ua != req.end()) {
    who += (who.empty() ? "" : " ") + std::string(ua->value().substr(0, 120));
  }
  return who;
}

// Runs `work(RunOptions)` → Result<json> on the pool and answers: one JSON object through
// `reply`, or (when the client asked for a stream) every event as it happens, then
// {"type":"end","answer":{...}} — or {"type":"end","answer":null,"error":{reason,message}}.
template <class Work>
void run_streamed(boost::asio::thread_pool& pool, const Request& req, Reply reply,
                  std::shared_ptr<Exchange> exchange, const Api& api,
                  std::chrono::milliseconds keepalive, Work work) {
  const StreamFormat format = stream_format(req);
  Request head_req(req.base(), "");
  const std::string client = describe_client(req, *exchange);
  boost::asio::post(pool, [format, head_req = std::move(head_req), client, reply = std::move(reply),
                           exchange = std::move(exchange), &api, keepalive,
                           work = std::move(work)]() mutable {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    exchange->watch([cancelled] { cancelled->store(true); });
    RunOptions run;
    run.cancelled = cancelled;
    run.client = client;
    if (format == StreamFormat::kJson) {
      auto answer = work(run);
      reply(answer ? Api::json_response(head_req, http::status::ok, *answer)
                   : Api::error_response(head_req, answer.error()));
      return;
    }
    Response head = stream_head(head_req, format == StreamFormat::kSse ? "text/event-stream"
                                                                       : "application/x-ndjson");
    api.decorate(head_req, head);
    exchange->begin(std::move(head));
    run.keepalive = keepalive;
    run.on_event = [exchange, format](const nlohmann::json& event) {
      exchange->write(encode_event(format, event));
    };
    auto answer = work(run);
    nlohmann::json end = {{"type", "end"}, {"answer", nullptr}};
    if (answer) {
      end["answer"] = std::move(answer).value();
    } else {
      end["error"] = {{"reason", answer.error().reason}, {"message", answer.error().message}};
    }
    exchange->write(encode_event(format, end));
    exchange->end();
  });
}

}  // namespace cellgate::server::detail
