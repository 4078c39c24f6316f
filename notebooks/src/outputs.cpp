#include "outputs.hpp"

namespace cellgate::notebooks {
namespace {

using nlohmann::json;

// The executor caps a cell's outputs at this many (ExecuteLimits::outputs) and says so in a
// notice; the same cap holds here.
constexpr std::size_t kMaxOutputs = 1000;

// Events come from a gateway over the network with a remote backend: read them defensively.
std::string string_at(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

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
      out["execution_count"] =
          count != event.end() && count->is_number_integer() ? *count : json();
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

}  // namespace

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

void NotebookOutputs::apply(std::size_t index, const json& events) {
  json& outputs = cells_[index]["outputs"];
  outputs = json::array();
  forget_displays(index);
  bool clear_before_next_output = false;
  if (!events.is_array()) {
    return;
  }
  for (const auto& event : events) {
    if (!event.is_object()) {
      continue;
    }
    const std::string type = string_at(event, "type");
    const std::string display_id = string_at(event, "display_id");
    if (!display_id.empty() && (type == "display_data" || type == "execute_result" ||
                                type == "update_display_data")) {
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
    if (type == "stream" && !outputs.empty() &&
        outputs.back().value("output_type", "") == "stream" &&
        outputs.back().value("name", "") == output["name"]) {
      outputs.back()["text"].get_ref<std::string&>() += output["text"].get_ref<const std::string&>();
      continue;
    }
    if (outputs.size() >= kMaxOutputs) {
      continue;
    }
    if (!display_id.empty()) {
      displays_[display_id][index].push_back(outputs.size());
    }
    outputs.push_back(std::move(output));
  }
}

}  // namespace cellgate::notebooks
