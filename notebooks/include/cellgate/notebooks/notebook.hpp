// nbformat 4 for `cellgate run`: read and validate a notebook, inject papermill-style
// parameters (parameters.hpp reads and renders them), and write it back in nbformat's own JSON
// style.
//
//   CELLGATE_ASSIGN_OR_RETURN(nlohmann::json nb, notebook::parse(text));   // validated
//   CELLGATE_ASSIGN_OR_RETURN(auto p, parameters::typed("alpha", "0.5"));
//   notebook::inject_parameters(nb, {p});
//   std::string out = notebook::dump(nb);
//
// Validation covers what a run depends on (https://nbformat.readthedocs.io/en/latest/
// format_description.html): nbformat == 4, a cells array, each cell an object with a known
// cell_type and a source that is a string or a list of strings, code cells' outputs a list and
// execution_count null or an integer when present (they are rewritten by the run anyway), and
// metadata objects with tags as lists of strings. Errors name the problem and the cell index:
// "cells[3] (code): no 'source' (...)". Outputs already in the file are not validated: a run
// replaces them.
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::notebooks::notebook {

// The deepest nesting of arrays and objects parse() accepts; deeper is refused before nlohmann
// builds anything. nbformat needs 7 levels to reach an output's MIME value (notebook, cells,
// cell, outputs, output, data, value); the rest is room for application/json outputs and
// metadata such as widget state. Python's json module, which Jupyter writes notebooks with,
// gives up near 1000 levels. nlohmann's dump(), copies and == recurse once per level, so this
// bound is what keeps every later step of a run (writing the notebook included) off the end of
// the stack: a 100,000-deep notebook would overflow it.
inline constexpr std::size_t kMaxDepth = 256;

// Parses and validates; errors have reason "invalid_notebook" and say what is wrong.
Result<nlohmann::json> parse(std::string_view text);
Result<void> validate(const nlohmann::json& nb);

// A cell's source as one string (nbformat allows a list of lines).
std::string source_of(const nlohmann::json& cell);
// The first non-blank line of a source, trimmed and shortened for messages.
std::string first_line(std::string_view source, std::size_t max_chars = 60);
bool has_tag(const nlohmann::json& cell, std::string_view tag);
// metadata.kernelspec.name, or "" when the notebook does not say.
std::string kernel_name(const nlohmann::json& nb);

// One injected parameter: `name = python` (parameters.hpp makes them).
struct Parameter {
  std::string name;
  std::string python;  // the right-hand side, as papermill writes it
  nlohmann::json value =
      nullptr;  // the value as JSON, for metadata.papermill.parameters (NaN, inf: null)
};

// papermill's parameterize_notebook: a new code cell tagged "injected-parameters" whose source
// is "# Parameters\n" and one "name = value\n" line per parameter replaces the first cell
// already tagged "injected-parameters" (an earlier run's), or goes right after the first cell
// tagged "parameters", or first when there is neither. Returns the new cell's index and
// whether a "parameters" cell was found.
struct Injection {
  std::size_t index = 0;
  bool after_parameters_cell = false;  // or an earlier injected cell was replaced
};
Injection inject_parameters(nlohmann::json& nb, const std::vector<Parameter>& parameters);

// Empties every code cell's outputs and execution_count, so cells a run does not reach carry
// nothing stale.
void clear_outputs(nlohmann::json& nb);

// nbformat's style (indent 1, sorted keys, UTF-8 kept, a final newline); invalid UTF-8 in
// outputs is replaced rather than failing the write.
std::string dump(const nlohmann::json& nb);

// The images and PDFs of an output's mime bundle, decoded: (mime, extension, bytes).
struct Artifact {
  std::string mime;
  std::string extension;
  std::string bytes;
};
std::vector<Artifact> artifacts_of(const nlohmann::json& output);

}  // namespace cellgate::notebooks::notebook
