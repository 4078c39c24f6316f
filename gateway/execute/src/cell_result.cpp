// CellResult's JSON: written here and nowhere else, and read back here from a gateway's answer.
#include "cellgate/execute/cell_result.hpp"

#include <array>
#include <utility>

namespace cellgate::execute {
namespace {

using nlohmann::json;
namespace files = store::files;

constexpr std::array<std::pair<CellStatus, const char*>, 5> kStatusNames = {{
    {CellStatus::kOk, "ok"},
    {CellStatus::kError, "error"},
    {CellStatus::kTimeout, "timeout"},
    {CellStatus::kAborted, "aborted"},
    {CellStatus::kDead, "dead"},
}};

// ---- reading a gateway's answer: a field of the wrong type reads as absent --------------------

const json* member(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string string_at(const json& object, const char* key) {
  const json* v = member(object, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

bool bool_at(const json& object, const char* key) {
  const json* v = member(object, key);
  return v != nullptr && v->is_boolean() && v->get<bool>();
}

json array_at(const json& object, const char* key) {
  const json* v = member(object, key);
  return v != nullptr && v->is_array() ? *v : json::array();
}

std::optional<std::int64_t> int_at(const json& object, const char* key) {
  const json* v = member(object, key);
  if (v == nullptr || !v->is_number_integer()) {
    return std::nullopt;
  }
  if (v->is_number_unsigned() && v->get<std::uint64_t>() > INT64_MAX) {
    return std::nullopt;
  }
  return v->get<std::int64_t>();
}

std::optional<std::uint64_t> uint_at(const json& object, const char* key) {
  const json* v = member(object, key);
  if (v == nullptr || !v->is_number_integer()) {
    return std::nullopt;
  }
  if (v->is_number_unsigned()) {
    return v->get<std::uint64_t>();
  }
  const auto n = v->get<std::int64_t>();
  return n >= 0 ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(n)) : std::nullopt;
}

std::vector<std::string> strings_at(const json& object, const char* key) {
  std::vector<std::string> out;
  const json* v = member(object, key);
  if (v != nullptr && v->is_array()) {
    for (const auto& s : *v) {
      if (s.is_string()) {
        out.push_back(s.get<std::string>());
      }
    }
  }
  return out;
}

std::optional<files::ChangeKind> change_kind_of(const std::string& s) {
  for (auto k :
       {files::ChangeKind::kCreated, files::ChangeKind::kModified, files::ChangeKind::kDeleted}) {
    if (s == files::to_string(k)) {
      return k;
    }
  }
  return std::nullopt;
}

std::optional<files::FileType> file_type_of(const std::string& s) {
  for (auto t : {files::FileType::kFile, files::FileType::kDirectory, files::FileType::kSymlink,
                 files::FileType::kOther}) {
    if (s == files::to_string(t)) {
      return t;
    }
  }
  return std::nullopt;
}

json optional_json(const std::optional<std::uint64_t>& v) {
  return v ? json(*v) : json();
}

}  // namespace

const char* to_string(CellStatus status) {
  for (const auto& [s, name] : kStatusNames) {
    if (s == status) {
      return name;
    }
  }
  return "";
}

CellStatus cell_status_of(std::string_view name) {
  for (const auto& [s, text] : kStatusNames) {
    if (name == text) {
      return s;
    }
  }
  return CellStatus::kOther;
}

std::string CellResult::status_name() const {
  return status == CellStatus::kOther ? other_status : std::string(to_string(status));
}

json CellResult::files_json() const {
  json changed = json::array();
  for (const auto& change : files) {
    changed.push_back(json{{"path", change.path},
                           {"change", files::to_string(change.kind)},
                           {"type", files::to_string(change.type)},
                           {"size", change.size}});
  }
  return changed;
}

json CellResult::truncated_json() const {
  return {{"stdout", truncated.stdout_cut},
          {"stderr", truncated.stderr_cut},
          {"outputs", truncated.outputs_cut},
          {"dropped_bytes", truncated.dropped_bytes}};
}

json CellResult::metrics_json() const {
  return {{"wall_ms", metrics.wall_ms},
          {"cpu_ms", optional_json(metrics.cpu_ms)},
          {"memory_peak_bytes", optional_json(metrics.memory_peak_bytes)},
          {"memory_current_bytes", optional_json(metrics.memory_current_bytes)}};
}

json CellResult::to_json() const {
  json error_json;
  if (error) {
    error_json = {
        {"ename", error->ename}, {"evalue", error->evalue}, {"traceback", error->traceback}};
    if (error->line > 0) {
      error_json["line"] = error->line;
    }
  }
  json answer = {{"status", status_name()},
                 {"execution_count", execution_count ? json(*execution_count) : json()},
                 {"stdout", stdout_text},
                 {"stderr", stderr_text},
                 {"outputs", outputs},
                 {"result", result ? *result : json()},
                 {"error", std::move(error_json)},
                 {"artifacts", artifacts},
                 {"charts", charts},
                 {"data", data},
                 {"files", files_json()},
                 {"notices", notices},
                 {"truncated", truncated_json()},
                 {"state_lost", state_lost},
                 {"metrics", metrics_json()}};
  if (!message.empty()) {
    answer["message"] = message;
  }
  if (!kernel_id.empty()) {
    answer["kernel_id"] = kernel_id;
  }
  return answer;
}

Result<CellResult> CellResult::from_json(const json& answer) {
  const json* status = answer.is_object() ? member(answer, "status") : nullptr;
  if (status == nullptr || !status->is_string()) {
    return make_error(ErrorCode::kUnavailable, "bad_answer",
                      "the gateway's answer to a cell has no status");
  }
  CellResult r;
  const auto& name = status->get_ref<const std::string&>();
  r.status = cell_status_of(name);
  if (r.status == CellStatus::kOther) {
    r.other_status = name;
  }
  r.message = string_at(answer, "message");
  r.execution_count = int_at(answer, "execution_count");
  r.stdout_text = string_at(answer, "stdout");
  r.stderr_text = string_at(answer, "stderr");
  r.outputs = array_at(answer, "outputs");
  if (const json* v = member(answer, "result"); v != nullptr && v->is_object()) {
    r.result = *v;
  }
  if (const json* e = member(answer, "error"); e != nullptr && e->is_object()) {
    CellError error;
    error.ename = string_at(*e, "ename");
    error.evalue = string_at(*e, "evalue");
    error.traceback = strings_at(*e, "traceback");
    const auto line = int_at(*e, "line");
    error.line = line && *line > 0 && *line <= INT32_MAX ? static_cast<int>(*line) : 0;
    r.error = std::move(error);
  }
  r.artifacts = array_at(answer, "artifacts");
  r.charts = array_at(answer, "charts");
  r.data = array_at(answer, "data");
  if (const json* list = member(answer, "files"); list != nullptr && list->is_array()) {
    for (const auto& entry : *list) {
      if (!entry.is_object()) {
        continue;
      }
      auto kind = change_kind_of(string_at(entry, "change"));
      auto type = file_type_of(string_at(entry, "type"));
      std::string path = string_at(entry, "path");
      if (!kind || !type || path.empty()) {
        continue;  // not a change this build can name
      }
      r.files.push_back(
          files::Change{*kind, std::move(path), *type, uint_at(entry, "size").value_or(0)});
    }
  }
  r.notices = strings_at(answer, "notices");
  if (const json* t = member(answer, "truncated"); t != nullptr && t->is_object()) {
    r.truncated.stdout_cut = bool_at(*t, "stdout");
    r.truncated.stderr_cut = bool_at(*t, "stderr");
    r.truncated.outputs_cut = bool_at(*t, "outputs");
    r.truncated.dropped_bytes = uint_at(*t, "dropped_bytes").value_or(0);
  }
  r.state_lost = bool_at(answer, "state_lost");
  if (const json* m = member(answer, "metrics"); m != nullptr && m->is_object()) {
    r.metrics.wall_ms = int_at(*m, "wall_ms").value_or(0);
    r.metrics.cpu_ms = uint_at(*m, "cpu_ms");
    r.metrics.memory_peak_bytes = uint_at(*m, "memory_peak_bytes");
    r.metrics.memory_current_bytes = uint_at(*m, "memory_current_bytes");
  }
  r.kernel_id = string_at(answer, "kernel_id");
  return r;
}

}  // namespace cellgate::execute
