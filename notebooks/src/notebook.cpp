#include "cellgate/notebooks/notebook.hpp"

#include <algorithm>
#include <optional>

#include "cellgate/cli/artifacts.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/protocol/message.hpp"

namespace cellgate::notebooks::notebook {
namespace {

using nlohmann::json;

Error invalid(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "invalid_notebook", std::move(message));
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "a list";
    case json::value_t::object:
      return "an object";
    default:
      return "something else";
  }
}

bool is_multiline_string(const json& v) {
  return v.is_string() || (v.is_array() && std::all_of(v.begin(), v.end(), [](const json& s) {
                             return s.is_string();
                           }));
}

Result<void> validate_metadata(const json& holder, const std::string& where) {
  auto m = holder.find("metadata");
  if (m == holder.end()) {
    return ok_result();
  }
  if (!m->is_object()) {
    return invalid(where + "'metadata' must be an object, not " + type_name(*m));
  }
  if (auto tags = m->find("tags"); tags != m->end()) {
    if (!tags->is_array() ||
        !std::all_of(tags->begin(), tags->end(), [](const json& t) { return t.is_string(); })) {
      return invalid(where + "metadata.tags must be a list of strings");
    }
  }
  return ok_result();
}

Result<void> validate_cell(const json& cell, std::size_t index) {
  const std::string at = "cells[" + std::to_string(index) + "]";
  if (!cell.is_object()) {
    return invalid(at + " is " + type_name(cell) + ", not an object");
  }
  auto type = cell.find("cell_type");
  if (type == cell.end()) {
    return invalid(at + ": no 'cell_type' (code, markdown or raw)");
  }
  if (!type->is_string() || (*type != "code" && *type != "markdown" && *type != "raw")) {
    return invalid(at + ": 'cell_type' is " + type->dump() + ", not one of code, markdown, raw");
  }
  const std::string where = at + " (" + type->get<std::string>() + "): ";
  auto source = cell.find("source");
  if (source == cell.end()) {
    return invalid(where + "no 'source' (nbformat 4 needs a string or a list of strings)");
  }
  if (!is_multiline_string(*source)) {
    return invalid(where + "'source' must be a string or a list of strings, not " +
                   type_name(*source));
  }
  if (*type == "code") {
    if (auto outputs = cell.find("outputs"); outputs != cell.end() && !outputs->is_array()) {
      return invalid(where + "'outputs' must be a list, not " + type_name(*outputs));
    }
    if (auto count = cell.find("execution_count");
        count != cell.end() && !count->is_null() && !count->is_number_integer()) {
      return invalid(where + "'execution_count' must be null or an integer, not " +
                     type_name(*count));
    }
  }
  return validate_metadata(cell, where);
}

}  // namespace

Result<json> parse(std::string_view text) {
  // Before the DOM: nlohmann parses any depth (its parser keeps a stack on the heap), but what
  // is then done with the value recurses once per level.
  if (!http::check_json_depth(text, kMaxDepth)) {
    return invalid("not a notebook: its JSON nests deeper than " + std::to_string(kMaxDepth) +
                   " levels");
  }
  json nb;
  try {
    nb = json::parse(text);
  } catch (const json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 1: ..." without the tag.
    std::string what = e.what();
    if (auto close = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
      what.erase(0, close + 2);
    }
    return invalid("not JSON: " + what);
  }
  CELLGATE_TRY(validate(nb));
  return nb;
}

Result<void> validate(const json& nb) {
  if (!nb.is_object()) {
    return invalid(std::string("not a notebook: the top level is ") + type_name(nb) +
                   ", not an object");
  }
  auto major = nb.find("nbformat");
  if (major == nb.end()) {
    return invalid("not a notebook: no 'nbformat' field");
  }
  if (!major->is_number_integer()) {
    return invalid("'nbformat' must be an integer, not " + std::string(type_name(*major)));
  }
  if (*major != 4) {
    return invalid("nbformat " + major->dump() +
                   " is not supported, only nbformat 4 (upgrade the notebook by saving it in "
                   "Jupyter, or with `jupyter nbconvert --to notebook --nbformat 4`)");
  }
  if (auto minor = nb.find("nbformat_minor"); minor != nb.end() && !minor->is_number_integer()) {
    return invalid("'nbformat_minor' must be an integer, not " + std::string(type_name(*minor)));
  }
  CELLGATE_TRY(validate_metadata(nb, ""));
  auto cells = nb.find("cells");
  if (cells == nb.end()) {
    return invalid("no 'cells' list");
  }
  if (!cells->is_array()) {
    return invalid("'cells' must be a list, not " + std::string(type_name(*cells)));
  }
  for (std::size_t i = 0; i < cells->size(); ++i) {
    CELLGATE_TRY(validate_cell((*cells)[i], i));
  }
  return ok_result();
}

std::string source_of(const json& cell) {
  auto source = cell.find("source");
  if (source == cell.end()) {
    return {};
  }
  if (source->is_string()) {
    return source->get<std::string>();
  }
  std::string joined;
  if (source->is_array()) {
    for (const auto& line : *source) {
      if (line.is_string()) {
        joined += line.get_ref<const std::string&>();
      }
    }
  }
  return joined;
}

std::string first_line(std::string_view source, std::size_t max_chars) {
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!source.empty()) {
    const auto nl = source.find('\n');
    std::string_view line = source.substr(0, nl);
    while (!line.empty() && blank(line.front())) {
      line.remove_prefix(1);
    }
    while (!line.empty() && blank(line.back())) {
      line.remove_suffix(1);
    }
    if (!line.empty()) {
      if (line.size() <= max_chars) {
        return std::string(line);
      }
      // Cut on a UTF-8 boundary.
      std::size_t cut = max_chars;
      while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) {
        --cut;
      }
      return std::string(line.substr(0, cut)) + "...";
    }
    if (nl == std::string_view::npos) {
      break;
    }
    source.remove_prefix(nl + 1);
  }
  return {};
}

bool has_tag(const json& cell, std::string_view tag) {
  auto m = cell.find("metadata");
  if (m == cell.end() || !m->is_object()) {
    return false;
  }
  auto tags = m->find("tags");
  if (tags == m->end() || !tags->is_array()) {
    return false;
  }
  return std::any_of(tags->begin(), tags->end(),
                     [&](const json& t) { return t.is_string() && t.get<std::string>() == tag; });
}

std::string kernel_name(const json& nb) {
  auto m = nb.find("metadata");
  if (m == nb.end() || !m->is_object()) {
    return {};
  }
  auto spec = m->find("kernelspec");
  if (spec == m->end() || !spec->is_object()) {
    return {};
  }
  auto name = spec->find("name");
  return name != spec->end() && name->is_string() ? name->get<std::string>() : std::string();
}

Injection inject_parameters(json& nb, const std::vector<Parameter>& parameters) {
  json& cells = nb["cells"];
  auto find_tagged = [&cells](std::string_view tag) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (has_tag(cells[i], tag)) {
        return i;
      }
    }
    return std::nullopt;
  };
  std::string source = "# Parameters\n";
  for (const auto& p : parameters) {
    source += p.name + " = " + p.python + "\n";
  }
  // As nbformat writes a multi-line source: a list of lines, each with its newline.
  json lines = json::array();
  for (std::size_t start = 0; start < source.size();) {
    const auto nl = source.find('\n', start);
    lines.push_back(source.substr(start, nl + 1 - start));
    start = nl + 1;
  }
  json cell = {{"cell_type", "code"},
               {"execution_count", nullptr},
               {"metadata", {{"tags", json::array({"injected-parameters"})}}},
               {"outputs", json::array()},
               {"source", std::move(lines)}};
  // Cell ids are required from nbformat 4.5 on, and absent before.
  if (nb.value("nbformat_minor", 0) >= 5) {
    cell["id"] = protocol::new_uuid();
  }
  Injection where;
  if (auto injected = find_tagged("injected-parameters")) {
    where.index = *injected;
    where.after_parameters_cell = true;
    cells[*injected] = std::move(cell);
    return where;
  }
  if (auto tagged = find_tagged("parameters")) {
    where.index = *tagged + 1;
    where.after_parameters_cell = true;
  }
  cells.insert(cells.begin() + static_cast<std::ptrdiff_t>(where.index), std::move(cell));
  return where;
}

void clear_outputs(json& nb) {
  for (auto& cell : nb["cells"]) {
    if (cell.value("cell_type", "") == "code") {
      cell["outputs"] = json::array();
      cell["execution_count"] = nullptr;
    }
  }
}

std::string dump(const json& nb) {
  return nb.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::vector<Artifact> artifacts_of(const json& output) {
  std::vector<Artifact> found;
  const std::string type = output.value("output_type", "");
  if (type != "display_data" && type != "execute_result") {
    return found;
  }
  auto data = output.find("data");
  if (data == output.end()) {
    return found;
  }
  for (auto& file : cli::displayed_files(*data)) {
    // An SVG is text and may be empty; a binary that decodes to nothing is not an artifact.
    if (file.bytes && (!file.bytes->empty() || file.mime == "image/svg+xml")) {
      found.push_back({std::move(file.mime), std::move(file.extension), std::move(*file.bytes)});
    }
  }
  return found;
}

}  // namespace cellgate::notebooks::notebook
