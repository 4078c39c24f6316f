// Internal: a notebook's outputs made from its cells' events, by nbclient's rules
// (nbclient/client.py: process_message, output, clear_output, _update_display_id), which a
// single cell's answer cannot follow on its own:
//
//   * clear_output(wait=True) clears the cell only when its next output arrives; with no output
//     after it, what was there stays;
//   * a display_data or execute_result with a display_id, and an update_display_data, replace
//     the data and metadata of every output shown with that display_id so far, in any cell (the
//     new display is then added; an update adds nothing);
//   * a cleared cell's displays are no longer updated.
//
// Consecutive text of one stream stays one output (nbformat's reading; nbclient 0.7 keeps the
// pieces apart, which readers join).
//
// Events come from a kernel, or from a gateway over the network: what is kept is capped
// (kMaxOutputs per cell, kMaxStreamBytes per stream output, display ids up to
// kMaxDisplayIdBytes), and a cap reached is said in the notices apply() returns. The events
// themselves are bounded before they get here (events.hpp).
//
//   NotebookOutputs outputs(nb["cells"]);
//   auto notices = outputs.apply(3, answer["events"]);  // fills cells[3]["outputs"], may update
//                                                       // earlier cells
//
// Thread-safety: none; the runner's thread.
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cellgate::notebooks {

// object[key] when it is a string, else "": events and outputs are read defensively.
std::string string_at(const nlohmann::json& object, const char* key);

// The executor caps a cell's outputs at this many (ExecuteLimits::outputs) and says so in a
// notice; the same cap holds here.
inline constexpr std::size_t kMaxOutputs = 1000;
// One stream output's text, joined from its events: the embedded gateway's cap per stream
// (backend.cpp); a remote gateway's answer may not have one.
inline constexpr std::size_t kMaxStreamBytes = std::size_t{64} << 20;
// A display id longer than this is not tracked: it shows like an output without one and is
// never updated (ids are map keys here, kept for the whole run; Jupyter's are 32-hex uuids).
inline constexpr std::size_t kMaxDisplayIdBytes = 1024;

// The display id an event is tracked under: its "display_id" when that is a string of 1 to
// kMaxDisplayIdBytes bytes, else "".
std::string tracked_display_id(const nlohmann::json& event);

class NotebookOutputs {
 public:
  // `cells` (the notebook's) must outlive this.
  explicit NotebookOutputs(nlohmann::json& cells) : cells_(cells) {}

  // Sets cells[index]["outputs"] from the cell's events, in order: the executor's
  // {"type": "stream" | "display_data" | "execute_result" | "update_display_data" | "error" |
  // "clear_output", …} (others, such as keepalive and notice, are ignored). Returns what was
  // cut (a stream past kMaxStreamBytes, outputs past kMaxOutputs), one line each.
  std::vector<std::string> apply(std::size_t index, const nlohmann::json& events);

 private:
  void update_displays(const std::string& display_id, const nlohmann::json& event);
  void forget_displays(std::size_t index);

  nlohmann::json& cells_;
  // display_id → cell index → indexes of that cell's outputs showing it.
  std::map<std::string, std::map<std::size_t, std::vector<std::size_t>>> displays_;
};

}  // namespace cellgate::notebooks
