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
//   NotebookOutputs outputs(nb["cells"]);
//   outputs.apply(3, answer["events"]);   // fills cells[3]["outputs"], may update earlier cells
//
// Thread-safety: none; the runner's thread.
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cellgate::notebooks {

class NotebookOutputs {
 public:
  // `cells` (the notebook's) must outlive this.
  explicit NotebookOutputs(nlohmann::json& cells) : cells_(cells) {}

  // Sets cells[index]["outputs"] from the cell's events, in order: the executor's
  // {"type": "stream" | "display_data" | "execute_result" | "update_display_data" | "error" |
  // "clear_output", …} (others, such as keepalive and notice, are ignored).
  void apply(std::size_t index, const nlohmann::json& events);

 private:
  void update_displays(const std::string& display_id, const nlohmann::json& event);
  void forget_displays(std::size_t index);

  nlohmann::json& cells_;
  // display_id → cell index → indexes of that cell's outputs showing it.
  std::map<std::string, std::map<std::size_t, std::vector<std::size_t>>> displays_;
};

}  // namespace cellgate::notebooks
