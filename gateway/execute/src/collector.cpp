#include "collector.hpp"

#include <simdjson.h>

#include <regex>
#include <sstream>
#include <utility>

#include "cellgate/kernels/display_formatters.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::execute {
namespace {

using nlohmann::json;
using store::ArtifactStore;

// A kernel's fields, read without trusting their types: absent and wrong-typed read the same.
std::string string_field(const json& c, const char* key, std::string fallback = {}) {
  auto it = c.find(key);
  return it != c.end() && it->is_string() ? it->get<std::string>() : std::move(fallback);
}

json object_field(const json& c, const char* key) {
  auto it = c.find(key);
  return it != c.end() && it->is_object() ? *it : json::object();
}

bool bool_field(const json& c, const char* key) {
  auto it = c.find(key);
  return it != c.end() && it->is_boolean() && it->get<bool>();
}

json count_field(const json& c) {
  auto it = c.find("execution_count");
  return it != c.end() && it->is_number_integer() ? *it : json();
}

std::size_t bundle_size(const json& data) {
  std::size_t n = 0;
  for (const auto& [mime, value] : data.items()) {
    n += mime.size() +
         (value.is_string() ? value.get_ref<const std::string&>().size() : value.dump().size());
  }
  return n;
}

}  // namespace

int failing_line(const std::vector<std::string>& traceback) {
  // IPython marks the failing line of the cell with an arrow ("----> 3 x = d['k']"); IPython 8
  // also names it ("Cell In[4], line 3").
  static const std::regex arrow(R"(^-*>\s*(\d+))");
  static const std::regex cell_line(R"(Cell In\s*\[\d*\],\s*line\s+(\d+))");
  for (const auto& entry : traceback) {
    std::smatch m;
    std::istringstream lines(entry);
    for (std::string l; std::getline(lines, l);) {
      if (std::regex_search(l, m, cell_line) || std::regex_search(l, m, arrow)) {
        try {
          return std::stoi(m[1].str());  // the first frame is the cell itself
        } catch (const std::exception&) {
          return 0;  // more digits than an int holds
        }
      }
    }
  }
  return 0;
}

Collector::Collector(ExecuteLimits limits, Sink sink, ArtifactStore* artifacts,
                     std::string kernel_id)
    : limits_(limits),
      sink_(std::move(sink)),
      artifacts_store_(artifacts),
      kernel_id_(std::move(kernel_id)) {}

bool Collector::captures(std::string_view type) {
  return type == "execute_input" || type == "stream" || type == "execute_result" ||
         type == "display_data" || type == "update_display_data" || type == "error" ||
         type == "clear_output";
}

void Collector::emit(const json& event) {
  if (sink_) {
    sink_(event);
  }
}

void Collector::on_message(std::string_view type, const json& content) {
  if (!content.is_object()) {
    return;
  }
  if (type == "execute_input") {
    execution_count_ = count_field(content);
  } else if (type == "stream") {
    on_stream(string_field(content, "name") == "stderr" ? 1 : 0, string_field(content, "text"));
  } else if (type == "execute_result" || type == "display_data" || type == "update_display_data") {
    on_bundle(type, content);
  } else if (type == "error") {
    on_error(content);
  } else if (type == "clear_output") {
    emit(json{{"type", "clear_output"}, {"wait", bool_field(content, "wait")}});
    outputs_ = json::array();
    displays_.clear();
  }
}

void Collector::notice(const std::string& key, const std::string& message) {
  if (noticed_.insert(key).second) {
    notices_.push_back(message);
    emit(json{{"type", "notice"}, {"message", message}});
  }
}

bool Collector::add_output(json output) {
  if (outputs_.size() >= limits_.outputs) {
    outputs_truncated_ = true;
    dropped_bytes_ += output.dump().size();
    notice("outputs",
           "more than " + std::to_string(limits_.outputs) + " outputs: later ones are dropped");
    return false;
  }
  outputs_.push_back(std::move(output));
  return true;
}

bool Collector::on_stream_frame(std::string_view content) {
  // One parser per cell thread: it keeps its buffers between messages. The frame was checked
  // (valid JSON, an object) when the envelope was made; this only finds two strings.
  thread_local simdjson::dom::parser parser;
  simdjson::dom::object object;
  if (parser.parse(content.data(), content.size(), /*realloc_if_needed=*/true)
          .get_object()
          .get(object) != simdjson::SUCCESS) {
    return false;
  }
  std::string_view name;
  std::string_view text;
  if (object["name"].get_string().get(name) != simdjson::SUCCESS) {
    name = "stdout";
  }
  if (object["text"].get_string().get(text) != simdjson::SUCCESS) {
    text = {};
  }
  on_stream(name == "stderr" ? 1 : 0, text);
  return true;
}

void Collector::on_stream(int which, std::string_view text) {
  std::string& buf = out_[which];
  const std::size_t room =
      limits_.stream_bytes > buf.size() ? limits_.stream_bytes - buf.size() : 0;
  const std::string_view kept = text.substr(0, room);
  const char* name = which == 1 ? "stderr" : "stdout";
  if (kept.size() < text.size()) {
    out_truncated_[which] = true;
    dropped_bytes_ += text.size() - kept.size();
    notice(name, std::string(name) + " is over the per-cell limit of " +
                     std::to_string(limits_.stream_bytes) + " bytes: the rest is dropped");
  }
  if (kept.empty()) {
    return;
  }
  buf += kept;
  emit(json{{"type", "stream"}, {"name", name}, {"text", kept}});
  // nbformat keeps consecutive text of one stream in one output.
  if (!outputs_.empty() && outputs_.back().value("output_type", "") == "stream" &&
      outputs_.back().value("name", "") == name) {
    outputs_.back()["text"].get_ref<std::string&>() += kept;  // no copy of what is there
  } else {
    add_output(json{{"output_type", "stream"}, {"name", name}, {"text", kept}});
  }
}

json Collector::store_artifacts(const json& data) {
  json records = json::array();
  if (artifacts_store_ == nullptr) {
    return records;
  }
  // A figure's chart (the kernel's display formatters) goes with each picture of it: a model
  // reads the numbers, not the pixels.
  const auto chart = data.find(kernels::kChartMime);
  for (const auto& [mime, value] : data.items()) {
    if (!ArtifactStore::is_artifact_mime(mime)) {
      continue;
    }
    auto record = artifacts_store_->put(kernel_id_, execution_count_, mime, value);
    if (record) {
      json entry = record->to_json();
      if (chart != data.end() && chart->is_object()) {
        entry["chart"] = *chart;
      }
      records.push_back(entry);
      artifacts_.push_back(std::move(entry));
    } else if (record.error().reason == "artifact_cap") {
      notice("artifact_cap", record.error().message);
    } else {
      notice("artifact_" + record.error().reason,
             "an " + mime + " output was not kept as an artifact: " + record.error().message);
    }
  }
  return records;
}

void Collector::on_bundle(std::string_view type, const json& c) {
  json data = object_field(c, "data");
  json metadata = object_field(c, "metadata");
  const std::string display_id = string_field(object_field(c, "transient"), "display_id");
  const std::size_t size = bundle_size(data);
  json records = json::array();
  if (size > limits_.output_bytes) {
    outputs_truncated_ = true;
    dropped_bytes_ += size;
    notice("output_bytes", "an output of " + std::to_string(size) +
                               " bytes is over the per-output limit of " +
                               std::to_string(limits_.output_bytes) + " bytes and was dropped");
    data = json{{"text/plain", "<" + std::to_string(size) +
                                   " bytes of output dropped: over the per-output limit of " +
                                   std::to_string(limits_.output_bytes) + " bytes>"}};
  } else {
    records = store_artifacts(data);
    if (type != "update_display_data") {
      if (auto chart = data.find(kernels::kChartMime); chart != data.end() && chart->is_object()) {
        charts_.push_back(*chart);
      }
      if (auto table = data.find(kernels::kDataMime); table != data.end() && table->is_object()) {
        data_.push_back(*table);
      }
    }
  }
  const bool is_result = type == "execute_result";
  json event = {{"type", type}, {"data", data}, {"metadata", metadata}};
  if (is_result) {
    event["execution_count"] = count_field(c);
  }
  if (!display_id.empty()) {
    event["display_id"] = display_id;
  }
  if (!records.empty()) {
    event["artifacts"] = records;
  }
  emit(event);
  if (type == "update_display_data") {
    // nbformat has no update: the displays it names change in place.
    for (std::size_t i : displays_[display_id]) {
      if (i < outputs_.size()) {
        outputs_[i]["data"] = data;
        outputs_[i]["metadata"] = metadata;
      }
    }
    return;
  }
  json output = {{"output_type", is_result ? "execute_result" : "display_data"},
                 {"data", data},
                 {"metadata", metadata}};
  if (is_result) {
    output["execution_count"] = count_field(c);
    result_ = data;
  }
  if (add_output(std::move(output)) && !display_id.empty()) {
    displays_[display_id].push_back(outputs_.size() - 1);
  }
}

void Collector::on_error(const json& c) {
  std::vector<std::string> traceback;
  if (auto t = c.find("traceback"); t != c.end() && t->is_array()) {
    for (const auto& line : *t) {
      if (line.is_string()) {
        traceback.push_back(strip_ansi(line.get_ref<const std::string&>()));
      }
    }
  }
  const std::string ename = string_field(c, "ename");
  const std::string evalue = string_field(c, "evalue");
  error_ = json{{"ename", ename}, {"evalue", evalue}, {"traceback", traceback}};
  if (int line = failing_line(traceback); line > 0) {
    error_["line"] = line;
  }
  json event = error_;
  event["type"] = "error";
  emit(event);
  add_output(json{{"output_type", "error"},
                  {"ename", ename},
                  {"evalue", evalue},
                  {"traceback", std::move(traceback)}});
}

void Collector::fields(json& answer) const {
  answer["stdout"] = out_[0];
  answer["stderr"] = out_[1];
  answer["outputs"] = outputs_;
  answer["result"] = result_;
  answer["error"] = error_;
  answer["artifacts"] = artifacts_;
  answer["charts"] = charts_;
  answer["data"] = data_;
  answer["notices"] = notices_;
  answer["truncated"] = {{"stdout", out_truncated_[0]},
                         {"stderr", out_truncated_[1]},
                         {"outputs", outputs_truncated_},
                         {"dropped_bytes", dropped_bytes_}};
}

}  // namespace cellgate::execute
