#include "outputs.hpp"

namespace cellgate::notebooks {
namespace {

using nlohmann::json;

// Events come from a gateway over the network with a remote backend: read them defensively.
json object_at(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_object() ? *it : json::object();
}

// nbformat's output for an event, or null for events that make none.
json output_of(const json& event, const std::string& type) {
  if (type == "stream") {
    return {{"output_type", "stream"},
            {"name", string_at(event, "name") == "stderr" ? "stderr" : "stdout"},
            {"text", string_at(event, "text")}};
  }
  if (type == "display_data" || type == "execute_result") {
    json out = {{"output_type", type},
                {"data", object_at(event, "data")},
                {"metadata", object_at(event, "metadata")}};
    if (type == "execute_result") {
      auto count = event.find("execution_count");
      out["execution_count"] = count != event.end() && count->is_number_integer() ? *count : json();
    }
    return out;
  }
  if (type == "error") {
    json traceback = json::array();
    if (auto t = event.find("traceback"); t != event.end() && t->is_array()) {
      for (const auto& line : *t) {
        if (line.is_string()) {
          traceback.push_back(line);
        }
      }
    }
    return {{"output_type", "error"},
            {"ename", string_at(event, "ename")},
            {"evalue", string_at(event, "evalue")},
            {"traceback", std::move(traceback)}};
  }
  return json();
}

// Appends to `text` what of `more` fits under kMaxStreamBytes, cut on a UTF-8 character
// boundary; false when something was left out.
bool append_capped(std::string& text, const std::string& more) {
  if (text.size() + more.size() <= kMaxStreamBytes) {
    text += more;
    return true;
  }
  std::size_t room = text.size() < kMaxStreamBytes ? kMaxStreamBytes - text.size() : 0;
  while (room > 0 && (static_cast<unsigned char>(more[room]) & 0xC0) == 0x80) {
    --room;
  }
  text.append(more, 0, room);
  return false;
}

}  // namespace

std::string string_at(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string tracked_display_id(const json& event) {
  std::string id = string_at(event, "display_id");
  return id.size() <= kMaxDisplayIdBytes ? id : std::string();
}

void NotebookOutputs::update_displays(const std::string& display_id, const json& event) {
  auto found = displays_.find(display_id);
  if (found == displays_.end()) {
    return;
  }
  const json data = object_at(event, "data");
  const json metadata = object_at(event, "metadata");
  for (const auto& [cell, indexes] : found->second) {
    json& outputs = cells_[cell]["outputs"];
    for (std::size_t i : indexes) {
      if (i < outputs.size()) {
        outputs[i]["data"] = data;
        outputs[i]["metadata"] = metadata;
      }
    }
  }
}

void NotebookOutputs::forget_displays(std::size_t index) {
  for (auto& [id, cells] : displays_) {
    cells.erase(index);
  }
}

std::vector<std::string> NotebookOutputs::apply(std::size_t index, const json& events) {
  json& outputs = cells_[index]["outputs"];
  outputs = json::array();
  forget_displays(index);
  bool clear_before_next_output = false;
  std::vector<std::string> notices;
  bool stream_cut[2] = {false, false};  // stdout, stderr: said once per cell
  bool outputs_cut = false;
  if (!events.is_array()) {
    return notices;
  }
  for (const auto& event : events) {
    if (!event.is_object()) {
      continue;
    }
    const std::string type = string_at(event, "type");
    const std::string display_id = tracked_display_id(event);
    if (!display_id.empty() &&
        (type == "display_data" || type == "execute_result" || type == "update_display_data")) {
      update_displays(display_id, event);
    }
    if (type == "clear_output") {
      auto wait = event.find("wait");
      if (wait != event.end() && wait->is_boolean() && wait->get<bool>()) {
        clear_before_next_output = true;
      } else {
        outputs = json::array();
        forget_displays(index);
      }
      continue;
    }
    json output = output_of(event, type);
    if (output.is_null()) {
      continue;  // update_display_data, keepalive, notice, …
    }
    if (clear_before_next_output) {
      outputs = json::array();
      forget_displays(index);
      clear_before_next_output = false;
    }
    if (type == "stream") {
      // A remote gateway's stream events may add up to any length: the text of one output is
      // capped, the rest dropped and said once.
      const bool is_stderr = output["name"] == "stderr";
      const bool joins = !outputs.empty() && outputs.back().value("output_type", "") == "stream" &&
                         outputs.back().value("name", "") == output["name"];
      if (joins || outputs.size() < kMaxOutputs) {
        std::string& text = joins ? outputs.back()["text"].get_ref<std::string&>()
                                  : output["text"].get_ref<std::string&>();
        bool whole = true;
        if (joins) {
          whole = append_capped(text, output["text"].get_ref<const std::string&>());
        } else if (text.size() > kMaxStreamBytes) {
          std::string all = std::move(text);
          text.clear();
          whole = append_capped(text, all);
        }
        if (!whole && !stream_cut[is_stderr]) {
          stream_cut[is_stderr] = true;
          notices.push_back(std::string(is_stderr ? "stderr" : "stdout") +
                            " is over the limit of " + std::to_string(kMaxStreamBytes) +
                            " bytes per output: the rest is dropped");
        }
        if (joins) {
          continue;
        }
      }
    }
    if (outputs.size() >= kMaxOutputs) {
      if (!outputs_cut) {
        outputs_cut = true;
        notices.push_back("more than " + std::to_string(kMaxOutputs) +
                          " outputs: later ones are dropped");
      }
      continue;
    }
    if (!display_id.empty()) {
      displays_[display_id][index].push_back(outputs.size());
    }
    outputs.push_back(std::move(output));
  }
  return notices;
}

}  // namespace cellgate::notebooks
