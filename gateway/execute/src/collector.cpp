#include "collector.hpp"

#include <simdjson.h>

#include <algorithm>
#include <climits>
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

// What a kernel may put in one field before the answer cuts it: an exception's name is a class
// name, its value a message; the whole text stays on the WebSocket for a notebook.
constexpr std::size_t kMaxNameBytes = 1024;
constexpr std::size_t kMaxValueBytes = 64u << 10;
// Jupyter bundles carry a handful of MIME types; a display id is a short token.
constexpr std::size_t kMaxMimeTypes = 128;
constexpr std::size_t kMaxDisplayIdBytes = 1024;
// Marks a stream message the gateway made to say a kernel's message was lost (kernel/client.cpp).
constexpr const char* kDroppedMark = "cellgate_dropped";

std::size_t bundle_size(const json& data) {
  std::size_t n = 0;
  for (const auto& [mime, value] : data.items()) {
    n += mime.size() +
         (value.is_string() ? value.get_ref<const std::string&>().size() : value.dump().size());
  }
  return n;
}

// `text` cut to at most `limit` bytes on a UTF-8 boundary (a cut never leaves half a character).
std::string_view utf8_prefix(std::string_view text, std::size_t limit) {
  if (text.size() <= limit) {
    return text;
  }
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) {
    --cut;
  }
  return text.substr(0, cut);
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' || c == '\n';
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

std::size_t skip(std::string_view s, std::size_t i, bool (*pred)(char)) {
  while (i < s.size() && pred(s[i])) {
    ++i;
  }
  return i;
}

// The number at s[i] (digits known to be there), 0 when it is more than an int holds.
int number_at(std::string_view s, std::size_t i) {
  long long v = 0;
  for (; i < s.size() && is_digit(s[i]); ++i) {
    v = v * 10 + (s[i] - '0');
    if (v > INT_MAX) {
      return 0;
    }
  }
  return static_cast<int>(v);
}

// "Cell In\s*\[\d*\],\s*line\s+(\d+)" anywhere in the line: the number, 0 when it is too big, -1
// when there is no such text. Each try scans only spaces and digits past its "Cell In", which
// no later "Cell In" can start inside, so the line is read about once.
int cell_in_line(std::string_view l) {
  constexpr std::string_view kCellIn = "Cell In";
  for (std::size_t at = l.find(kCellIn); at != std::string_view::npos;
       at = l.find(kCellIn, at + 1)) {
    std::size_t i = skip(l, at + kCellIn.size(), is_space);
    if (i >= l.size() || l[i] != '[') {
      continue;
    }
    i = skip(l, i + 1, is_digit);
    if (l.substr(i, 2) != "],") {
      continue;
    }
    i = skip(l, i + 2, is_space);
    if (l.substr(i, 4) != "line") {
      continue;
    }
    const std::size_t digits = skip(l, i + 4, is_space);
    if (digits == i + 4 || digits >= l.size() || !is_digit(l[digits])) {
      continue;
    }
    return number_at(l, digits);
  }
  return -1;
}

// "^-*>\s*(\d+)": IPython's arrow at the start of a line.
int arrow_line(std::string_view l) {
  std::size_t i = skip(l, 0, [](char c) { return c == '-'; });
  if (i >= l.size() || l[i] != '>') {
    return -1;
  }
  i = skip(l, i + 1, is_space);
  if (i >= l.size() || !is_digit(l[i])) {
    return -1;
  }
  return number_at(l, i);
}

}  // namespace

int failing_line(const std::vector<std::string>& traceback) {
  // IPython marks the failing line of the cell with an arrow ("----> 3 x = d['k']"); IPython 8
  // also names it ("Cell In[4], line 3"). The first frame that does is the cell itself.
  for (const std::string& entry : traceback) {
    std::string_view rest = entry;
    while (true) {
      const std::size_t nl = rest.find('\n');
      const std::string_view l = rest.substr(0, nl);
      if (int n = cell_in_line(l); n >= 0) {
        return n;
      }
      if (int n = arrow_line(l); n >= 0) {
        return n;
      }
      if (nl == std::string_view::npos) {
        break;
      }
      rest.remove_prefix(nl + 1);
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
    if (bool_field(content, kDroppedMark)) {
      notice_dropped(string_field(content, "text"));
    }
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

void Collector::notice_dropped(std::string_view text) {
  // The gateway's own line ("[cellgate] a display_data message from the kernel was dropped: …"):
  // said once per cell as a notice as well, where an agent looks for what was cut.
  std::string message(utf8_prefix(text, 1024));
  while (!message.empty() && message.back() == '\n') {
    message.pop_back();
  }
  outputs_truncated_ = true;
  notice("kernel_message_dropped", message);
}

bool Collector::add_output(json output, std::size_t bytes) {
  if (outputs_.size() >= limits_.outputs) {
    outputs_truncated_ = true;
    dropped_bytes_ += bytes;
    notice("outputs",
           "more than " + std::to_string(limits_.outputs) + " outputs: later ones are dropped");
    return false;
  }
  if (over_total(bytes)) {  // errors and streams too: a kernel may send any number of them
    outputs_truncated_ = true;
    dropped_bytes_ += bytes;
    notice("total_output_bytes", "the outputs are over the per-cell limit of " +
                                     std::to_string(limits_.total_output_bytes) +
                                     " bytes for all outputs together: later ones are dropped");
    return false;
  }
  outputs_.push_back(std::move(output));
  output_sizes_.push_back(bytes);
  kept_bytes_ += bytes;
  return true;
}

bool Collector::over_total(std::size_t more) const {
  return kept_bytes_ + more > limits_.total_output_bytes;
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
  if (bool dropped = false;
      object[kDroppedMark].get_bool().get(dropped) == simdjson::SUCCESS && dropped) {
    notice_dropped(text);
  }
  on_stream(name == "stderr" ? 1 : 0, text);
  return true;
}

void Collector::on_stream(int which, std::string_view text) {
  std::string& buf = out_[which];
  const std::size_t room =
      limits_.stream_bytes > buf.size() ? limits_.stream_bytes - buf.size() : 0;
  const std::string_view kept = utf8_prefix(text, room);  // never half a character
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
    output_sizes_.back() += kept.size();
    kept_bytes_ += kept.size();
  } else {
    add_output(json{{"output_type", "stream"}, {"name", name}, {"text", kept}}, kept.size());
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
  if (data.size() > kMaxMimeTypes) {
    // Kept: the first ones in the bundle's (sorted) order, which puts text/plain after most.
    json kept = json::object();
    for (auto it = data.begin(); it != data.end() && kept.size() < kMaxMimeTypes; ++it) {
      kept[it.key()] = std::move(it.value());
    }
    dropped_bytes_ += bundle_size(data) - bundle_size(kept);
    outputs_truncated_ = true;
    notice("mime_types", "an output with " + std::to_string(data.size()) +
                             " MIME types: only the first " + std::to_string(kMaxMimeTypes) +
                             " are kept");
    data = std::move(kept);
  }
  std::string display_id = string_field(object_field(c, "transient"), "display_id");
  if (display_id.size() > kMaxDisplayIdBytes) {
    notice("display_id", "a display id of " + std::to_string(display_id.size()) +
                             " bytes is over the limit of " + std::to_string(kMaxDisplayIdBytes) +
                             " bytes: its display is not updated in place");
    display_id.clear();
  }
  const std::size_t meta_size = metadata.empty() ? 0 : metadata.dump().size();
  const std::size_t size = bundle_size(data) + meta_size;
  const bool is_update = type == "update_display_data";
  bool over_all = false;
  if (is_update) {
    // An update replaces what each of its displays holds: only growth counts against the total.
    std::size_t replaced = 0;
    std::size_t copies = 0;
    if (auto shown = displays_.find(display_id); !display_id.empty() && shown != displays_.end()) {
      for (std::size_t i : shown->second) {
        replaced += i < output_sizes_.size() ? output_sizes_[i] : 0;
        ++copies;
      }
    }
    over_all = copies * size > replaced && over_total(copies * size - replaced);
  } else {
    over_all = over_total(size);
  }
  json records = json::array();
  const bool over_one = size > limits_.output_bytes;
  if (over_one || over_all) {
    outputs_truncated_ = true;
    dropped_bytes_ += size;
    const std::string why =
        over_one ? "over the per-output limit of " + std::to_string(limits_.output_bytes) + " bytes"
                 : "over the per-cell limit of " + std::to_string(limits_.total_output_bytes) +
                       " bytes for all outputs together";
    notice(over_one ? "output_bytes" : "total_output_bytes",
           "an output of " + std::to_string(size) + " bytes is " + why + " and was dropped");
    data =
        json{{"text/plain", "<" + std::to_string(size) + " bytes of output dropped: " + why + ">"}};
    metadata = json::object();
  } else {
    records = store_artifacts(data);
    if (!is_update) {
      if (auto chart = data.find(kernels::kChartMime); chart != data.end() && chart->is_object()) {
        charts_.push_back(*chart);
      }
      if (auto table = data.find(kernels::kDataMime); table != data.end() && table->is_object()) {
        data_.push_back(*table);
      }
    }
  }
  // A note of what was dropped is not counted: it is small, and the outputs cap bounds how many.
  const std::size_t kept_size = over_one || over_all ? 0 : size;
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
  if (is_update) {
    // nbformat has no update: the displays it names change in place.
    if (display_id.empty()) {
      return;
    }
    for (std::size_t i : displays_[display_id]) {
      if (i < outputs_.size()) {
        outputs_[i]["data"] = data;
        outputs_[i]["metadata"] = metadata;
        kept_bytes_ = kept_bytes_ - std::min(output_sizes_[i], kept_bytes_) + kept_size;
        output_sizes_[i] = kept_size;
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
  if (add_output(std::move(output), kept_size) && !display_id.empty()) {
    displays_[display_id].push_back(outputs_.size() - 1);
  }
}

void Collector::on_error(const json& c) {
  // Each part bounded, so a kernel's exception (its name, value and traceback are the cell's
  // to choose) cannot make the answer, the audit record or the line scan unbounded.
  std::vector<std::string> traceback;
  std::size_t traceback_bytes = 0;
  std::size_t cut_bytes = 0;
  if (auto t = c.find("traceback"); t != c.end() && t->is_array()) {
    for (const auto& entry : *t) {
      if (!entry.is_string()) {
        continue;
      }
      const auto& raw = entry.get_ref<const std::string&>();
      const std::size_t room =
          limits_.stream_bytes - std::min(traceback_bytes, limits_.stream_bytes);
      if (room == 0) {
        cut_bytes += raw.size();
        continue;
      }
      // Colour codes come out, so look at up to twice the room before cutting to it.
      const std::string_view head = utf8_prefix(raw, 2 * room);
      std::string line = strip_ansi(head);
      bool cut_here = head.size() < raw.size();
      if (line.size() > room) {
        line.resize(utf8_prefix(line, room).size());
        cut_here = true;
      }
      if (cut_here) {
        cut_bytes += raw.size() - line.size();  // colour codes of the cut part included
      }
      traceback_bytes += line.size();
      traceback.push_back(std::move(line));
    }
  }
  std::string ename = string_field(c, "ename");
  std::string evalue = string_field(c, "evalue");
  auto cut = [&](std::string& text, std::size_t limit, const char* what) {
    if (text.size() > limit) {
      notice(std::string("error_") + what,
             std::string("the exception's ") + what + " of " + std::to_string(text.size()) +
                 " bytes is over the limit of " + std::to_string(limit) + " bytes and was cut");
      dropped_bytes_ += text.size() - utf8_prefix(text, limit).size();
      text.resize(utf8_prefix(text, limit).size());
      outputs_truncated_ = true;
    }
  };
  cut(ename, kMaxNameBytes, "name");
  cut(evalue, kMaxValueBytes, "value");
  if (cut_bytes > 0) {
    dropped_bytes_ += cut_bytes;
    outputs_truncated_ = true;
    notice("error_traceback", "the traceback is over the per-cell limit of " +
                                  std::to_string(limits_.stream_bytes) +
                                  " bytes: " + std::to_string(cut_bytes) + " bytes were cut");
    traceback.push_back("<" + std::to_string(cut_bytes) + " bytes of traceback cut>");
  }
  const int line = failing_line(traceback);
  json event = {{"type", "error"}, {"ename", ename}, {"evalue", evalue}, {"traceback", traceback}};
  if (line > 0) {
    event["line"] = line;
  }
  error_ = CellError{ename, evalue, traceback, std::max(line, 0)};
  emit(event);
  const std::size_t bytes = ename.size() + evalue.size() + traceback_bytes;
  add_output(json{{"output_type", "error"},
                  {"ename", std::move(ename)},
                  {"evalue", std::move(evalue)},
                  {"traceback", std::move(traceback)}},
             bytes);
}

void Collector::fields(CellResult& r) const {
  r.stdout_text = out_[0];
  r.stderr_text = out_[1];
  r.outputs = outputs_;
  r.result = result_.is_null() ? std::nullopt : std::optional<json>(result_);
  r.error = error_;
  r.artifacts = artifacts_;
  r.charts = charts_;
  r.data = data_;
  r.notices = notices_;
  r.truncated = {.stdout_cut = out_truncated_[0],
                 .stderr_cut = out_truncated_[1],
                 .outputs_cut = outputs_truncated_,
                 .dropped_bytes = dropped_bytes_};
}

}  // namespace cellgate::execute
