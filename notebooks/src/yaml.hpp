// Internal: a YAML document as papermill's loader makes it (PyYAML's SafeLoader without the
// timestamp resolver, papermill/cli.py), read with libyaml, the C parser PyYAML is built on.
// libyaml gives the events; this composes them as PyYAML's composer and SafeConstructor do:
//
//   * plain scalars resolve as YAML 1.1 (PyYAML's resolver.py): null (~, null, Null, NULL,
//     empty), bools (yes/no/true/false/on/off, each lower, Capitalised or UPPER), ints (decimal,
//     0b, 0x, leading-0 octal, base 60 with colons, underscores), floats (a dot, or .inf/.nan),
//     else strings; a quoted or block scalar is a string; the tags !!str, !!int, !!float,
//     !!bool, !!null, !!seq and !!map (others are an error);
//   * one document; anchors and aliases (an alias copies its node), merge keys (<<);
//   * a mapping is a Python dict: a key given again keeps its first place and takes the last
//     value, and keys compare as Python's do (true == 1 == 1.0); a list or mapping cannot be a
//     key (PyYAML: "found unhashable key").
//
// The text is untrusted (a -y value, a -f file): nesting deeper than kMaxDepth, and documents
// that make more than kMaxNodes values or copy more than kMaxCopiedBytes through aliases (the
// "billion laughs") are refused as soon as the parser gets there. Errors say where, as
// "line L, column C: problem" from libyaml's marks, counted from 1.
//
//   CELLGATE_ASSIGN_OR_RETURN(yaml::Value doc, yaml::load("{a: [1, x], b: .5}"));
//   doc.entries[0].value.items[1].text;   // "x"
//
// Thread-safety: load() is a pure function.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/notebooks/notebook.hpp"
#include "cellgate/result.hpp"

namespace cellgate::notebooks::yaml {

inline constexpr std::size_t kMaxDepth = notebook::kMaxDepth;
inline constexpr std::size_t kMaxNodes = 250'000;
inline constexpr std::size_t kMaxCopiedBytes = std::size_t{64} << 20;

struct Entry;

// A Python value as safe_load returns it.
struct Value {
  enum class Kind { kNull, kBool, kInt, kFloat, kString, kList, kDict };
  Kind kind = Kind::kNull;
  bool boolean = false;        // kBool
  double number = 0;           // kFloat
  std::string text;            // kString; kInt in decimal (Python ints have no size limit)
  std::vector<Value> items;    // kList
  std::vector<Entry> entries;  // kDict, in the dict's order
};

// A dict's key and value. Not std::pair<Value, Value>: a pair of the incomplete Value inside
// Value is undefined, and clang's libstdc++ checks refuse it.
struct Entry {
  Entry(Value k, Value v) : key(std::move(k)), value(std::move(v)) {}
  Value key;
  Value value;
};

// The document's value; an empty stream is null. Errors have reason "bad_yaml".
Result<Value> load(std::string_view text);

}  // namespace cellgate::notebooks::yaml
