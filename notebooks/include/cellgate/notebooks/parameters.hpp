// Parameters as papermill takes them on its command line, rendered as papermill's
// PythonTranslator writes them into the injected cell (papermill/cli.py and
// papermill/translators.py, https://github.com/nteract/papermill):
//
//   -p NAME VALUE   typed as papermill's _resolve_type: "True", "False", "None", then what
//                   Python's int() accepts, then what float() accepts, else the string
//   -r NAME VALUE   the string as it is
//   -y YAML         a mapping of names to values, read as PyYAML's safe_load reads it (YAML 1.1,
//                   dates left as strings, as papermill's loader does)
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
// -y is read with libyaml, the C parser PyYAML is built on, and composed as safe_load composes:
// plain scalars resolve as YAML 1.1 (null/~/empty, yes/no/on/off/true/false in their three
// spellings, ints in decimal, 0b, 0x, leading-0 octal and base 60 with underscores, floats with
// a dot, .inf, .nan, else strings), anchors, aliases and merge keys, safe_load's tags, one
// document. It is untrusted: nesting deeper than 256 levels, more than 250,000 values or 64 MiB
// of text copied by aliases, and ints Python cannot write (over 4300 digits) are errors, which
// say the line and column (notebooks/src/yaml.hpp).
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
