// Internal: one cell's events, kept from the first to the last so that the runner can build the
// cell's outputs as nbclient does (outputs.hpp), within bounds. Everything here comes from the
// kernel, or from a gateway over the network (issue 24: hostile input): a cell may send
// update_display_data 100,000 times with 1 MB each, show an 8 MiB image 10,000 times, or a remote
// gateway may stream without end. What is kept:
//
//   * an update_display_data for a display id that an event kept for this cell shows is folded
//     into the latest such event (an update only ever replaces data and metadata: the outputs
//     come out the same), so an update loop keeps one event;
//   * a clear_output (at once, or with wait=True when the next output arrives) drops the events
//     before it, except per display id one update_display_data with its last data and metadata:
//     what they still do to earlier cells' displays. An animation loop keeps one frame;
//   * consecutive text of one stream is one event (apply() joins it anyway);
//   * events nested deeper than kMaxEventDepth, and events past kMaxCellEventBytes (the
//     approximate bytes held, not dump()'s size), are dropped: take() then ends the events with a
//     stderr stream that says what was cut, and notices() says it for the run's warnings.
//
//   CellEvents events;
//   run.on_event = [&events](const json& e) { events.add(e); };
//   …
//   events.finish(answer);   // answer.events, and what was cut added to answer.result.notices
//
// Thread-safety: none; a cell's events arrive one at a time (on the cell's strand, or on the
// thread reading a remote answer).
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/notebooks/backend.hpp"
#include "cellgate/notebooks/notebook.hpp"

namespace cellgate::notebooks {

// What one cell's events may hold: the embedded gateway's cap per stream and per output
// (backend.cpp), here for all of a cell's outputs together. A run keeps this much per notebook
// running (--jobs), besides the notebooks themselves.
inline constexpr std::size_t kMaxCellEventBytes = std::size_t{64} << 20;

// An event's data becomes an output four levels deeper in the notebook (notebook, cells, cell,
// outputs; the event object is the output object): an event this deep still makes a notebook
// that notebook::parse() reads back.
inline constexpr std::size_t kMaxEventDepth = notebook::kMaxDepth - 4;

// The memory a JSON value holds, approximately (strings' bytes, plus a fixed cost per value and
// per object member), and its nesting depth (arrays and objects; a scalar is 0). Walks the value
// with a stack on the heap: nlohmann's own walks recurse once per level.
struct JsonSize {
  std::size_t bytes = 0;
  std::size_t depth = 0;
};
JsonSize json_size(const nlohmann::json& value);

class CellEvents {
 public:
  explicit CellEvents(std::size_t max_bytes = kMaxCellEventBytes) : max_bytes_(max_bytes) {}

  // One event as the executor sends it ({"type": "stream" | "display_data" | "execute_result" |
  // "update_display_data" | "error" | "clear_output", …}); other types (keepalive, notice,
  // unknown ones) make no output and are not kept.
  void add(nlohmann::json event);

  // The events kept, in order (and the stderr note when some were cut); leaves this empty.
  nlohmann::json take();
  // What was cut, one line each (empty when nothing was).
  std::vector<std::string> notices() const;
  // answer.events = take(), and notices() appended to answer.result.notices.
  void finish(CellAnswer& answer);

  std::size_t size() const { return events_.size(); }
  std::size_t bytes() const { return bytes_; }

 private:
  void clear_now();
  bool fits(std::size_t more, std::size_t less = 0) const {
    return bytes_ - less + more <= max_bytes_;
  }
  void drop(std::size_t bytes) {
    ++dropped_;
    dropped_bytes_ += bytes;
  }

  const std::size_t max_bytes_;
  std::vector<nlohmann::json> events_;
  std::vector<std::size_t> sizes_;  // events_[i]'s json_size().bytes
  std::size_t bytes_ = 0;           // their sum
  // display id → the index in events_ of the latest event that shows or updates it
  std::map<std::string, std::size_t> last_shown_;
  bool clear_pending_ = false;  // a clear_output(wait=True) waits for the next output
  std::size_t dropped_ = 0;     // over max_bytes_
  std::size_t dropped_bytes_ = 0;
  std::size_t too_deep_ = 0;  // deeper than kMaxEventDepth
};

}  // namespace cellgate::notebooks
