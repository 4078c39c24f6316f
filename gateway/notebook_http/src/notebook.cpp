#include "cellgate/notebook_http/notebook.hpp"

#include "cellgate/http/limits.hpp"
#include "cellgate/sys/file.hpp"

namespace cellgate::notebook_http {
namespace {

using nlohmann::json;

Error invalid(const std::string& path, const std::string& what) {
  return Error{ErrorCode::kInvalidArgument, "invalid_notebook", path + ": " + what};
}

// A cell's source: a string, or a list of strings joined.
bool source_of(const json& cell, std::string& out) {
  auto it = cell.find("source");
  if (it == cell.end()) {
    return false;
  }
  if (it->is_string()) {
    out = it->get<std::string>();
    return true;
  }
  if (!it->is_array()) {
    return false;
  }
  out.clear();
  for (const auto& line : *it) {
    if (!line.is_string()) {
      return false;
    }
    out += line.get_ref<const std::string&>();
  }
  return true;
}

std::string string_at(const json& nb, const char* outer, const char* inner) {
  auto meta = nb.find("metadata");
  if (meta == nb.end() || !meta->is_object()) {
    return "";
  }
  auto o = meta->find(outer);
  if (o == meta->end() || !o->is_object()) {
    return "";
  }
  auto i = o->find(inner);
  return i != o->end() && i->is_string() ? i->get<std::string>() : "";
}

}  // namespace

Result<SeedNotebook> parse_notebook(std::string path, std::string bytes) {
  if (bytes.size() > kMaxNotebookBytes) {
    return invalid(path, "larger than " + std::to_string(kMaxNotebookBytes >> 20) + " MiB");
  }
  const json nb = http::parse_json(bytes, 256);
  if (nb.is_discarded() || !nb.is_object()) {
    return invalid(path, "not a notebook (not JSON, or nested deeper than 256 levels)");
  }
  auto format = nb.find("nbformat");
  if (format == nb.end() || !format->is_number_integer() || format->get<int>() != 4) {
    return invalid(path, "not nbformat 4");
  }
  auto cells = nb.find("cells");
  if (cells == nb.end() || !cells->is_array()) {
    return invalid(path, "no 'cells' list");
  }
  if (cells->size() > kMaxCells) {
    return invalid(path, "more than " + std::to_string(kMaxCells) + " cells");
  }
  SeedNotebook out;
  out.kernel_name = string_at(nb, "kernelspec", "name");
  out.language = string_at(nb, "language_info", "name");
  for (std::size_t i = 0; i < cells->size(); ++i) {
    const json& cell = (*cells)[i];
    std::string source;
    if (!cell.is_object() || !source_of(cell, source)) {
      return invalid(path, "cells[" + std::to_string(i) +
                               "]: not a cell with a source (a string or a list of strings)");
    }
    auto type = cell.find("cell_type");
    if (type != cell.end() && type->is_string() && *type == "code") {
      out.code_cells.push_back(source);
    }
    out.all_cells.push_back(std::move(source));
  }
  out.path = std::move(path);
  out.bytes = std::move(bytes);
  return out;
}

Result<SeedNotebook> load_notebook(const std::string& path) {
  // One byte past the limit: parse_notebook says it is too large.
  CELLGATE_ASSIGN_OR_RETURN(std::string bytes,
                            sys::read_file(path, kMaxNotebookBytes + 1, "invalid_notebook"));
  return parse_notebook(path, std::move(bytes));
}

std::string notebook_title(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  const std::size_t dot = base.find('.');
  return std::string(dot != std::string_view::npos && dot > 0 ? base.substr(0, dot) : base);
}

}  // namespace cellgate::notebook_http
