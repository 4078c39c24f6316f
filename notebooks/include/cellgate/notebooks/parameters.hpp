// Parameters as papermill takes them on its command line, rendered as papermill's
// PythonTranslator writes them into the injected cell (papermill/cli.py and
// papermill/translators.py, https://github.com/nteract/papermill):
//
//   -p NAME VALUE   typed as papermill's _resolve_type: "True", "False", "None", then what
//                   Python's int() accepts, then what float() accepts, else the string
//   -r NAME VALUE   the string as it is
//   -y YAML         a mapping of names to values (YAML 1.1 as PyYAML's SafeLoader reads it,
//                   dates left as strings; the subset below)
//
//   CELLGATE_ASSIGN_OR_RETURN(auto p, parameters::typed("n", "007"));   // n = 7
//   CELLGATE_ASSIGN_OR_RETURN(auto y, parameters::yaml("{a: [1, x], b: .5}"));
//   auto all = parameters::merge({y}, {p}, {});   // papermill's order: -y, then -p, then -r
//
// Values are rendered as papermill does for Python: strings in double quotes through
// unicode_escape ("é" is "\xe9"), True/False/None, ints in full, floats as Python's repr (and
// float('nan'), float('inf'), float('-inf')), lists [a, b], dicts {"k": v} with every key
// written as a string. papermill then passes the cell through black when black is installed;
// cellgate does not (the same text for short lines).
//
// The YAML subset: a flow mapping ({a: 1, "b": [x, 2.5]}, so any JSON object), or a block
// mapping of `key: value` lines whose values are scalars, flow collections, or nested block
// mappings and `- item` sequences by indentation; plain, 'single' and "double" quoted scalars;
// comments; a leading `---`. Not supported (an error says so): anchors and aliases, tags, block
// scalars (| and >), multi-line plain scalars, complex keys, several documents. Plain scalars
// resolve as in YAML 1.1: null/~/empty, yes/no/on/off/true/false (any of their three
// spellings), ints (decimal, 0b, 0x, leading-0 octal, base-60 with colons, underscores), floats
// (with a dot, .inf, .nan), else strings.
//
// Thread-safety: pure functions on values.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/notebooks/notebook.hpp"
#include "cellgate/result.hpp"

namespace cellgate::notebooks::parameters {

// A Python variable name that is not a keyword (papermill does not check; a bad name would
// only fail in the kernel).
Result<void> check_name(std::string_view name);

// -p NAME VALUE, typed as papermill does.
Result<notebook::Parameter> typed(std::string_view name, std::string_view value);
// -r NAME VALUE: the string.
Result<notebook::Parameter> raw(std::string_view name, std::string_view value);
// -y YAML: a mapping (null or empty: no parameters), in the mapping's order.
Result<std::vector<notebook::Parameter>> yaml(std::string_view text);

// papermill's dict updates: every -y in order, then -p, then -r. A name given again takes the
// later value and keeps its first place.
std::vector<notebook::Parameter> merge(const std::vector<std::vector<notebook::Parameter>>& yaml,
                                       const std::vector<notebook::Parameter>& typed,
                                       const std::vector<notebook::Parameter>& raw);

// papermill's Python string literal: "..." through unicode_escape, with \" for a quote.
std::string python_str(std::string_view utf8);
// Python's repr() of a float (shortest round trip, '1e+16', '0.0001', '-0.0'), papermill's
// float('nan') / float('inf') / float('-inf') for the others.
std::string python_float(double value);

}  // namespace cellgate::notebooks::parameters
