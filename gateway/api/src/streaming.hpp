// Internal: answering an agent cell — one JSON object, or a stream of events as they happen
// (NDJSON for `Accept: application/x-ndjson`, Server-Sent Events for `text/event-stream`, E2B's
// NDJSON lines on the E2B listener) — and stopping the cell when the client leaves. Every agent
// route (execute, one-shot, E2B /execute) answers through answer_cell().
#pragma once

#include <cctype>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/execute/executor.hpp"
#include "cellgate/http/message.hpp"
#include "cellgate/protocol/message.hpp"

namespace cellgate::api::detail {

// How a cell's events and its end are written to a streamed answer.
class EventEncoder {
 public:
  virtual ~EventEncoder() = default;
  virtual std::string content_type() const = 0;
  // One event's bytes ("" : nothing to send for it).
  virtual std::string event(const nlohmann::json& event) = 0;
  // The last bytes, from the answer (or the error that stopped the cell).
  virtual std::string end(const execute::Answer& answer) = 0;
};

enum class StreamFormat { kJson, kNdjson, kSse };

inline StreamFormat stream_format(const http::Request& req) {
  auto it = req.find(http::Field::accept);
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

using protocol::dump_json;

// cellgate's own events: {"type": …} per line (NDJSON) or per SSE event, and last
// {"type":"end","answer":{…}} — or {"type":"end","answer":null,"error":{reason,message}}.
class JupyterEventEncoder : public EventEncoder {
 public:
  explicit JupyterEventEncoder(bool sse) : sse_(sse) {}
  std::string content_type() const override {
    return sse_ ? "text/event-stream" : "application/x-ndjson";
  }
  std::string event(const nlohmann::json& event) override { return frame(event); }
  std::string end(const execute::Answer& answer) override {
    nlohmann::json end = {{"type", "end"}, {"answer", nullptr}};
    if (answer) {
      end["answer"] = answer->to_json();
    } else {
      end["error"] = {{"reason", answer.error().reason}, {"message", answer.error().message}};
    }
    return frame(end);
  }

 private:
  std::string frame(const nlohmann::json& event) const {
    if (sse_) {
      return "event: " + event.value("type", std::string("message")) +
             "\ndata: " + dump_json(event) + "\n\n";
    }
    return dump_json(event) + "\n";
  }
  bool sse_;
};

// A streamed answer's header: 200, the event media type, never cached or buffered by proxies.
inline http::Response stream_head(const http::Request& req, const std::string& content_type) {
  http::Response head{http::Status::ok, req.version()};
  head.set(http::Field::server, "cellgate");
  head.set(http::Field::content_type, content_type);
  head.set(http::Field::cache_control, "no-cache");
  head.set("X-Accel-Buffering", "no");
  head.keep_alive(req.keep_alive());
  return head;
}

// Who asked, for the audit log: the peer address and the User-Agent.
inline std::string describe_client(const http::Request& req, const http::Exchange& exchange) {
  std::string who = exchange.peer();
  if (auto ua = req.find(http::Field::user_agent); ua != req.end()) {
    who += (who.empty() ? "" : " ") + std::string(ua->value().substr(0, 120));
  }
  return who;
}

// Starts a cell through `start(RunOptions, Done) -> shared_ptr<CellHandle>` and answers it:
// with `encoder`, streamed (its header sent at once, events as they come, then its end); without
// one, as one JSON object (the answer, or the error's status). The cell is cancelled if the
// client leaves first.
template <class Start>
void answer_cell(const http::Request& req, std::shared_ptr<http::Exchange> exchange,
                 std::shared_ptr<EventEncoder> encoder, std::chrono::milliseconds keepalive,
                 Start start) {
  execute::RunOptions run;
  run.client = describe_client(req, *exchange);
  execute::Done done;
  if (!encoder) {
    done = [exchange, head = http::Request(req.base(), "")](execute::Answer answer) {
      exchange->reply(answer ? http::json_response(head, http::Status::ok, answer->to_json())
                             : http::error_response(head, answer.error()));
    };
  } else {
    exchange->begin(stream_head(req, encoder->content_type()));
    run.keepalive = keepalive;
    run.on_event = [exchange, encoder](const nlohmann::json& event) {
      if (std::string bytes = encoder->event(event); !bytes.empty()) {
        exchange->write(std::move(bytes));
      }
    };
    done = [exchange, encoder](execute::Answer answer) {
      exchange->write(encoder->end(answer));
      exchange->end();
    };
  }
  std::shared_ptr<execute::CellHandle> cell = start(std::move(run), std::move(done));
  exchange->watch([cell] { cell->cancel(); });
}

// The encoder a Jupyter-API request asks for with its Accept header; null for plain JSON.
inline std::shared_ptr<EventEncoder> encoder_for(const http::Request& req) {
  switch (stream_format(req)) {
    case StreamFormat::kJson:
      return nullptr;
    case StreamFormat::kNdjson:
      return std::make_shared<JupyterEventEncoder>(false);
    case StreamFormat::kSse:
      return std::make_shared<JupyterEventEncoder>(true);
  }
  return nullptr;
}

}  // namespace cellgate::api::detail
