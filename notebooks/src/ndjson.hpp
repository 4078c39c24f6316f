// Internal: a remote gateway's answers, read as hostile input (issue 24). A JSON answer is
// depth-checked before nlohmann builds it (http::check_json_depth, notebook::kMaxDepth); the
// streamed execute answer (POST /api/kernels/{id}/execute as NDJSON: events ({"type": …}) until
// {"type": "end", "answer": {…}}, or "answer": null and an "error") is read a line at a time, a
// line holding at most kMaxNdjsonLineBytes (a longer one is skipped to its newline, so a gateway
// that streams without end costs that much), its events kept by CellEvents (events.hpp).
//
//   NdjsonAnswer lines;
//   client.stream(…, [&lines](std::string_view piece) { lines.feed(piece); }, …);
//   CELLGATE_ASSIGN_OR_RETURN(CellAnswer answer, lines.answer());   // with its events
//
// Thread-safety: none; the thread that reads the answer.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cellgate/result.hpp"
#include "events.hpp"

namespace cellgate::notebooks {

// The end line repeats the cell's outputs, stdout and stderr beside the events that came
// before it (each kept up to kMaxCellEventBytes): room for that, four times the events' budget.
inline constexpr std::size_t kMaxNdjsonLineBytes = std::size_t{256} << 20;

// `text` as JSON; a discarded value when it is not JSON or nests deeper than notebook::kMaxDepth
// (checked before parsing: what is then done with the value recurses once per level).
nlohmann::json parse_bounded(std::string_view text);

class NdjsonAnswer {
 public:
  explicit NdjsonAnswer(std::size_t max_line_bytes = kMaxNdjsonLineBytes,
                        std::size_t max_event_bytes = kMaxCellEventBytes)
      : max_line_(max_line_bytes), events_(max_event_bytes) {}

  // The next bytes of the body, cut anywhere.
  void feed(std::string_view piece);
  // At the end of the body: the end line's answer (CellResult::from_json) with its events (and
  // what was cut in its notices), or kUnavailable when there is none.
  Result<CellAnswer> answer();

  const CellEvents& events() const { return events_; }

 private:
  void line(std::string_view text);

  const std::size_t max_line_;
  std::string pending_;    // the line so far
  bool skipping_ = false;  // the line so far is over max_line_: dropped up to its newline
  std::size_t too_long_ = 0;
  std::size_t too_deep_ = 0;  // lines deeper than notebook::kMaxDepth
  CellEvents events_;
  nlohmann::json end_;
};

}  // namespace cellgate::notebooks
