#include "ndjson.hpp"

#include "cellgate/http/limits.hpp"

namespace cellgate::client {

using nlohmann::json;

json parse_bounded(std::string_view text) {
  if (!http::check_json_depth(text, kMaxAnswerDepth)) {
    return json(json::value_t::discarded);
  }
  return json::parse(text, nullptr, false);
}

void NdjsonAnswer::feed(std::string_view piece) {
  fed_ = fed_ || !piece.empty();
  while (!piece.empty()) {
    const auto nl = piece.find('\n');
    const std::string_view part = piece.substr(0, nl);
    if (!skipping_) {
      if (pending_.size() + part.size() > max_line_) {
        skipping_ = true;
        ++too_long_;
        std::string().swap(pending_);  // its memory too
      } else {
        pending_.append(part);
      }
    }
    if (nl == std::string_view::npos) {
      return;
    }
    if (!skipping_) {
      line(pending_);
    }
    skipping_ = false;
    if (pending_.capacity() > (std::size_t{1} << 20)) {
      std::string().swap(pending_);  // a big line's buffer is not kept for the small ones
    } else {
      pending_.clear();
    }
    piece.remove_prefix(nl + 1);
  }
}

void NdjsonAnswer::line(std::string_view text) {
  if (text.find_first_not_of(" \r\t") == std::string_view::npos) {
    return;
  }
  if (!http::check_json_depth(text, kMaxAnswerDepth)) {
    ++too_deep_;
    return;
  }
  json event = json::parse(text, nullptr, false);
  if (!event.is_object()) {
    return;
  }
  const auto type = event.find("type");
  if (type != event.end() && *type == "end") {
    end_ = std::move(event);
  } else if (on_event_) {
    on_event_(std::move(event));
  }
}

void NdjsonAnswer::finish() {
  if (!pending_.empty() && !skipping_) {
    line(pending_);
  }
  pending_.clear();
  skipping_ = false;
}

Result<execute::CellResult> NdjsonAnswer::answer() {
  finish();
  std::string dropped;
  if (too_long_ > 0) {
    dropped += "; " + std::to_string(too_long_) + " of its lines were over " +
               std::to_string(max_line_) + " bytes and were dropped";
  }
  if (too_deep_ > 0) {
    dropped += "; " + std::to_string(too_deep_) + " of its lines nest deeper than " +
               std::to_string(kMaxAnswerDepth) + " levels and were dropped";
  }
  if (!end_.is_object()) {
    return make_error(
        ErrorCode::kUnavailable, "bad_answer",
        "POST /api/kernels/{id}/execute: the stream ended without the answer" + dropped);
  }
  auto answer = end_.find("answer");
  if (answer == end_.end() || !answer->is_object() || !answer->contains("status")) {
    // Not value("message", …): it throws when the member is there but not a string.
    std::string message;
    if (const auto error = end_.find("error"); error != end_.end() && error->is_object()) {
      if (const auto said = error->find("message"); said != error->end() && said->is_string()) {
        message = said->get<std::string>();
      }
    }
    return make_error(ErrorCode::kUnavailable, "execute_failed",
                      "POST /api/kernels/{id}/execute: " +
                          (message.empty() ? std::string("no answer") : message) + dropped);
  }
  auto result = execute::CellResult::from_json(*answer);
  end_ = json();
  if (!result) {
    return make_error(ErrorCode::kUnavailable, "execute_failed",
                      "POST /api/kernels/{id}/execute: " + result.error().message + dropped);
  }
  if (!dropped.empty()) {
    result->notices.push_back("the gateway's answer was cut" + dropped);
  }
  return result;
}

}  // namespace cellgate::client
