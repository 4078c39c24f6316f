// Internal: a gateway's streamed cell answer (POST /api/kernels/{id}/execute or /api/execute with
// Accept: application/x-ndjson: events ({"type": …}) until {"type": "end", "answer": {…}}, or
// "answer": null and an "error"), read as hostile input (issue 24). It is read a line at a time,
// a line holding at most kMaxNdjsonLineBytes (a longer one is skipped to its newline, so a
// gateway that streams without end costs that much); a line is depth-checked
// (http::check_json_depth) before nlohmann builds it. Each event goes to `on_event` as it comes;
// the end line becomes the typed answer, with what was dropped said in its notices.
//
//   NdjsonAnswer lines([&](nlohmann::json event) { … });
//   client.stream(…, [&lines](std::string_view piece) { lines.feed(piece); }, …);
//   CELLGATE_ASSIGN_OR_RETURN(execute::CellResult answer, lines.answer());
//
// Thread-safety: none; the thread that reads the answer.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cellgate/execute/cell_result.hpp"
#include "cellgate/result.hpp"

namespace cellgate::client {

// The end line repeats the cell's outputs, stdout and stderr beside the events that came before
// it: room for that, four times what `cellgate run` keeps of a cell's events (64 MiB).
inline constexpr std::size_t kMaxNdjsonLineBytes = std::size_t{256} << 20;
// What a notebook can hold (notebooks' notebook::kMaxDepth) and more than any answer nests.
inline constexpr std::size_t kMaxAnswerDepth = 256;

// `text` as JSON; a discarded value when it is not JSON or nests deeper than kMaxAnswerDepth
// (checked before parsing: what is then done with the value recurses once per level).
nlohmann::json parse_bounded(std::string_view text);

class NdjsonAnswer {
 public:
  using OnEvent = std::function<void(nlohmann::json event)>;
  explicit NdjsonAnswer(OnEvent on_event, std::size_t max_line_bytes = kMaxNdjsonLineBytes)
      : on_event_(std::move(on_event)), max_line_(max_line_bytes) {}

  // The next bytes of the body, cut anywhere.
  void feed(std::string_view piece);
  // The body has ended: its last line, if it had no newline, is read now.
  void finish();
  bool fed() const { return fed_; }
  // The end line was read (after finish(), also when it was the unterminated last line).
  bool ended() const { return end_.is_object(); }
  // finish(), then the end line's answer (CellResult::from_json, with what was dropped in its
  // notices), or kUnavailable: "bad_answer" when there is none, "execute_failed" when the
  // gateway said why it could not run the cell.
  Result<execute::CellResult> answer();

 private:
  void line(std::string_view text);

  OnEvent on_event_;
  const std::size_t max_line_;
  bool fed_ = false;
  std::string pending_;    // the line so far
  bool skipping_ = false;  // the line so far is over max_line_: dropped up to its newline
  std::size_t too_long_ = 0;
  std::size_t too_deep_ = 0;  // lines deeper than kMaxAnswerDepth
  nlohmann::json end_;
};

}  // namespace cellgate::client
