// PyYAML's safe_load over libyaml's events (see yaml.hpp). The names follow PyYAML's files:
// resolver.py (which tag a plain scalar gets), constructor.py (construct_yaml_int and _float,
// flatten_mapping for merge keys) and composer.py (one document, anchors).
#include "yaml.hpp"

#include <regex.h>
#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <optional>
#include <unordered_map>

namespace cellgate::notebooks::yaml {
namespace {

using Kind = Value::Kind;

// Python's str() and repr() of an int refuse more than 4300 decimal digits (3.11's
// sys.int_info.str_digits_check_threshold), so papermill cannot write a longer one.
constexpr std::size_t kMaxIntDigits = 4300;

Error bad_yaml(std::string what) {
  return make_error(ErrorCode::kInvalidArgument, "bad_yaml", std::move(what));
}

Error error_at(const yaml_mark_t& mark, const std::string& what) {
  return bad_yaml("line " + std::to_string(mark.line + 1) + ", column " +
                  std::to_string(mark.column + 1) + ": " + what);
}

Error too_long() {
  return bad_yaml("an int of more than " + std::to_string(kMaxIntDigits) +
                  " digits (Python cannot write one)");
}

// A scalar, anchor or tag in a message: its first 40 bytes, cut between UTF-8 characters (libyaml
// has checked the text is UTF-8, and the message may go into JSON).
std::string shorten(const std::string& text) {
  if (text.size() <= 40) {
    return text;
  }
  std::size_t cut = 40;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return text.substr(0, cut) + "...";
}

std::string quote(const std::string& text) {
  return "'" + shorten(text) + "'";
}

// An arbitrary-size non-negative integer, only as big as parameters need: built digit by digit
// in any base and written in decimal.
class BigInt {
 public:
  void push_digit(unsigned base, unsigned digit) {
    std::uint64_t carry = digit;
    for (auto& limb : limbs_) {  // little-endian limbs of 10^9
      const std::uint64_t v = std::uint64_t{limb} * base + carry;
      limb = static_cast<std::uint32_t>(v % kLimb);
      carry = v / kLimb;
    }
    while (carry != 0) {
      limbs_.push_back(static_cast<std::uint32_t>(carry % kLimb));
      carry /= kLimb;
    }
  }
  std::string decimal() const {
    if (limbs_.empty()) {
      return "0";
    }
    std::string out = std::to_string(limbs_.back());
    for (std::size_t i = limbs_.size() - 1; i-- > 0;) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%09u", limbs_[i]);
      out += buf;
    }
    return out;
  }

 private:
  static constexpr std::uint64_t kLimb = 1000000000;
  std::vector<std::uint32_t> limbs_;
};

// A whole-string match against a POSIX extended regular expression. Not std::regex: libstdc++'s
// matcher recurses once per repeated character, so a long scalar overflows the stack; glibc's
// regexec walks its automaton without recursing.
class Pattern {
 public:
  explicit Pattern(const char* ere) { ok_ = ::regcomp(&re_, ere, REG_EXTENDED | REG_NOSUB) == 0; }
  ~Pattern() {
    if (ok_) {
      ::regfree(&re_);
    }
  }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
  bool matches(const std::string& s) const {
    return ok_ && s.find('\0') == std::string::npos &&
           ::regexec(&re_, s.c_str(), 0, nullptr, 0) == 0;
  }

 private:
  regex_t re_{};
  bool ok_ = false;
};

// PyYAML's implicit resolvers for plain scalars, timestamps left out as papermill does. '<<' is
// the merge key and '=' the value key: only a mapping key may be either.
enum class Implicit { kNull, kBool, kInt, kFloat, kString, kMerge, kValueKey };

const Pattern& int_form() {
  static const Pattern p(
      "^([-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|"
      "[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+)$");
  return p;
}

const Pattern& float_form() {
  static const Pattern p(
      "^([-+]?[0-9][0-9_]*\\.[0-9_]*([eE][-+][0-9]+)?|\\.[0-9][0-9_]*([eE][-+][0-9]+)?|"
      "[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN))$");
  return p;
}

Implicit resolve(const std::string& s) {
  static const Pattern null_form("^(~|null|Null|NULL|)$");
  static const Pattern bool_form(
      "^(yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$");
  if (null_form.matches(s)) {
    return Implicit::kNull;
  }
  if (bool_form.matches(s)) {
    return Implicit::kBool;
  }
  if (float_form().matches(s)) {
    return Implicit::kFloat;
  }
  if (int_form().matches(s)) {
    return Implicit::kInt;
  }
  if (s == "<<") {
    return Implicit::kMerge;
  }
  return s == "=" ? Implicit::kValueKey : Implicit::kString;
}

std::string lower_without_underscores(std::string_view text, bool lower) {
  std::string out;
  for (char c : text) {
    if (c != '_') {
      out += lower ? static_cast<char>(std::tolower(static_cast<unsigned char>(c))) : c;
    }
  }
  return out;
}

// construct_yaml_bool: any case of the six words (an explicit !!bool may say YeS).
std::optional<bool> construct_bool(std::string_view text) {
  const std::string s = lower_without_underscores(text, true);
  if (s == "yes" || s == "true" || s == "on") {
    return true;
  }
  if (s == "no" || s == "false" || s == "off") {
    return false;
  }
  return std::nullopt;
}

// construct_yaml_int, on text int_form() accepts: the value in decimal, or why Python would fail
// (int('', 2) for "0b_", or past its digits limit).
Result<std::string> construct_int(std::string_view text) {
  std::string s = lower_without_underscores(text, false);
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') {
    negative = s[0] == '-';
    s.erase(0, 1);
  }
  unsigned base = 10;
  if (s.rfind("0b", 0) == 0 || s.rfind("0x", 0) == 0) {
    base = s[1] == 'b' ? 2 : 16;
    s.erase(0, 2);
  } else if (s[0] == '0') {
    base = 8;
  }
  if (s.empty()) {
    return bad_yaml("no digits after " + std::string(base == 2 ? "0b" : "0x"));
  }
  // Bounds the work before the conversion, which is quadratic in the digits: no base yields
  // fewer than one decimal digit per four of its own past leading zeros.
  const auto first = std::min(s.find_first_not_of('0'), s.size());
  if ((s.size() - first) > 4 * kMaxIntDigits) {
    return too_long();
  }
  BigInt n;
  if (base == 10 && s.find(':') != std::string::npos) {
    // Base 60: 1:30 is 90. PyYAML adds the parts times powers of 60; Horner's rule gives the
    // same int.
    std::size_t start = 0;
    while (true) {
      const auto colon = s.find(':', start);
      if (start == 0) {
        for (char c : s.substr(0, colon)) {
          n.push_digit(10, static_cast<unsigned>(c - '0'));
        }
      } else {
        n.push_digit(60, static_cast<unsigned>(std::atoi(s.substr(start, colon - start).c_str())));
      }
      if (colon == std::string::npos) {
        break;
      }
      start = colon + 1;
    }
  } else {
    for (char c : s) {
      const auto lc = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      n.push_digit(base, static_cast<unsigned>(lc >= 'a' ? lc - 'a' + 10 : lc - '0'));
    }
  }
  std::string digits = n.decimal();
  if (digits.size() > kMaxIntDigits) {
    return too_long();
  }
  return (negative && digits != "0" ? "-" : "") + digits;
}

// construct_yaml_float, on text float_form() accepts (or, for an explicit !!float, any decimal
// Python's float() reads).
std::optional<double> construct_float(std::string_view text) {
  std::string s = lower_without_underscores(text, true);
  double sign = 1;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    sign = s[0] == '-' ? -1 : 1;
    s.erase(0, 1);
  }
  if (s == ".inf") {
    return sign * HUGE_VAL;
  }
  if (s == ".nan") {
    return std::nan("");
  }
  if (s.empty() || s.find_first_not_of("0123456789.e+-:") != std::string::npos) {
    return std::nullopt;
  }
  // Base 60 as PyYAML sums it: the last part first, each times the next power of 60.
  double value = 0;
  double base = 1;
  std::size_t end = s.size();
  while (true) {
    if (end == 0) {
      return std::nullopt;  // ":5", or "5:" below
    }
    const auto colon = s.rfind(':', end - 1);
    const std::size_t start = colon == std::string::npos ? 0 : colon + 1;
    const std::string part = s.substr(start, end - start);
    char* stop = nullptr;
    const double d = std::strtod(part.c_str(), &stop);
    if (part.empty() || *stop != '\0') {
      return std::nullopt;
    }
    value += d * base;
    base *= 60;
    if (colon == std::string::npos) {
      break;
    }
    end = colon;
  }
  return sign * value;
}

// What a key is equal to as a Python dict key: True == 1 == 1.0, -0.0 == 0, every NaN of
// safe_load is the same float object.
std::string identity(const Value& key) {
  switch (key.kind) {
    case Kind::kNull:
      return "z";
    case Kind::kBool:
      return key.boolean ? "n1" : "n0";
    case Kind::kInt:
      return "n" + key.text;
    case Kind::kFloat: {
      const double v = key.number;
      if (std::isnan(v)) {
        return "nan";
      }
      if (std::isinf(v)) {
        return v < 0 ? "-inf" : "inf";
      }
      char buf[400];
      if (v == std::floor(v)) {
        std::snprintf(buf, sizeof buf, "%.0f", v == 0 ? 0.0 : v);  // glibc prints it exactly
        return std::string("n") + buf;
      }
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
      return "f" + std::string(buf, ec == std::errc() ? end : buf);
    }
    case Kind::kString:
      return "s" + key.text;
    case Kind::kList:
    case Kind::kDict:
      break;
  }
  return "";  // not hashable: the composer refuses such keys
}

// A dict from entries in order: a key given again keeps its first place, takes the last value.
std::vector<Entry> dict_of(std::vector<Entry> merged, std::vector<Entry> own) {
  std::vector<Entry> out;
  std::unordered_map<std::string, std::size_t> index;
  auto put = [&](Entry& e) {
    auto [at, fresh] = index.emplace(identity(e.key), out.size());
    if (fresh) {
      out.push_back(std::move(e));
    } else {
      out[at->second].value = std::move(e.value);
    }
  };
  std::for_each(merged.begin(), merged.end(), put);
  std::for_each(own.begin(), own.end(), put);
  return out;
}

// Values, copied text and height of a node: what an alias to it costs.
struct Size {
  std::size_t nodes = 0;
  std::size_t bytes = 0;
  std::size_t height = 0;  // 0 for a scalar, else 1 + its tallest child's
};

// Recurses once per level: the composer refuses anything deeper than kMaxDepth.
void measure(const Value& v, Size& size, std::size_t depth = 0) {
  ++size.nodes;
  size.bytes += v.text.size();
  const bool collection = v.kind == Kind::kList || v.kind == Kind::kDict;
  size.height = std::max(size.height, depth + (collection ? 1 : 0));
  for (const auto& item : v.items) {
    measure(item, size, depth + 1);
  }
  for (const auto& e : v.entries) {
    measure(e.key, size, depth + 1);
    measure(e.value, size, depth + 1);
  }
}

// libyaml's events, one at a time, into the document's value.
class Composer {
 public:
  explicit Composer(std::string_view text) {
    ::yaml_parser_initialize(&parser_);
    ::yaml_parser_set_input_string(&parser_, reinterpret_cast<const unsigned char*>(text.data()),
                                   text.size());
  }
  ~Composer() { ::yaml_parser_delete(&parser_); }
  Composer(const Composer&) = delete;
  Composer& operator=(const Composer&) = delete;

  Result<Value> run() {
    while (true) {
      Event event;
      if (::yaml_parser_parse(&parser_, &event.e) == 0) {
        return parser_error();
      }
      if (event.e.type == YAML_STREAM_END_EVENT) {
        return std::move(root_);
      }
      CELLGATE_TRY(on(event.e));
    }
  }

 private:
  struct Event {
    Event() = default;
    ~Event() { ::yaml_event_delete(&e); }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    yaml_event_t e{};
  };

  // A list or dict being read.
  struct Frame {
    Value value;
    std::string anchor;
    yaml_mark_t mark{};         // where it starts
    std::optional<Value> key;   // a dict's key waiting for its value
    bool merge_key = false;     // that key is '<<'
    std::vector<Entry> merged;  // what '<<' keys bring, in flatten_mapping's order
  };

  struct Anchored {
    Value value;
    Size size;
  };

  static std::string text_of(const char* s) { return s == nullptr ? std::string() : s; }
  static std::string text_of(const yaml_char_t* s) {
    return text_of(reinterpret_cast<const char*>(s));
  }

  Error parser_error() const {
    const std::string problem = text_of(parser_.problem);
    if (parser_.error == YAML_MEMORY_ERROR) {
      return make_error(ErrorCode::kResourceExhausted, "bad_yaml", "out of memory reading YAML");
    }
    if (parser_.error == YAML_READER_ERROR) {
      char value[32] = "";
      if (parser_.problem_value != -1) {
        std::snprintf(value, sizeof value, " (#%X)", static_cast<unsigned>(parser_.problem_value));
      }
      return make_error(ErrorCode::kInvalidArgument, "bad_yaml",
                        "byte " + std::to_string(parser_.problem_offset) + ": " + problem + value);
    }
    std::string what = problem.empty() ? "not YAML" : problem;
    if (parser_.context != nullptr) {
      what += " (" + std::string(parser_.context) + " at line " +
              std::to_string(parser_.context_mark.line + 1) + ", column " +
              std::to_string(parser_.context_mark.column + 1) + ")";
    }
    return error_at(parser_.problem_mark, what);
  }

  Result<void> on(const yaml_event_t& e) {
    switch (e.type) {
      case YAML_DOCUMENT_START_EVENT:
        if (++documents_ > 1) {
          return error_at(e.start_mark,
                          "expected a single document in the stream, but found another document");
        }
        return ok_result();
      case YAML_SCALAR_EVENT: {
        CELLGATE_TRY(charge({1, 0, 0}, e.start_mark));
        const auto& s = e.data.scalar;
        CELLGATE_TRY(check_anchor(s.anchor, e.start_mark));
        Implicit special = Implicit::kString;
        CELLGATE_ASSIGN_OR_RETURN(Value v, scalar(e, special));
        CELLGATE_TRY(remember(text_of(s.anchor), v, e.start_mark));
        return add(std::move(v), special, e.start_mark);
      }
      case YAML_SEQUENCE_START_EVENT:
      case YAML_MAPPING_START_EVENT:
        return open(e);
      case YAML_SEQUENCE_END_EVENT:
      case YAML_MAPPING_END_EVENT: {
        Frame f = std::move(stack_.back());
        stack_.pop_back();
        if (f.value.kind == Kind::kDict) {
          f.value.entries = dict_of(std::move(f.merged), std::move(f.value.entries));
        }
        CELLGATE_TRY(remember(f.anchor, f.value, f.mark));
        return add(std::move(f.value), Implicit::kString, f.mark);
      }
      case YAML_ALIAS_EVENT:
        return alias(e);
      default:
        return ok_result();
    }
  }

  Result<void> open(const yaml_event_t& e) {
    const bool list = e.type == YAML_SEQUENCE_START_EVENT;
    if (stack_.size() + 1 > kMaxDepth) {
      return error_at(e.start_mark, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    const std::string tag = text_of(list ? e.data.sequence_start.tag : e.data.mapping_start.tag);
    if (!tag.empty() && tag != "!" &&
        tag != (list ? "tag:yaml.org,2002:seq" : "tag:yaml.org,2002:map")) {
      return error_at(e.start_mark, unsupported_tag(tag));
    }
    const yaml_char_t* anchor = list ? e.data.sequence_start.anchor : e.data.mapping_start.anchor;
    CELLGATE_TRY(check_anchor(anchor, e.start_mark));
    CELLGATE_TRY(charge({1, 0, 0}, e.start_mark));
    Frame f;
    f.value.kind = list ? Kind::kList : Kind::kDict;
    f.anchor = text_of(anchor);
    f.mark = e.start_mark;
    stack_.push_back(std::move(f));
    return ok_result();
  }

  Result<void> alias(const yaml_event_t& e) {
    const std::string name = text_of(e.data.alias.anchor);
    auto found = anchors_.find(name);
    if (found == anchors_.end()) {
      const bool open = std::any_of(stack_.begin(), stack_.end(),
                                    [&](const Frame& f) { return f.anchor == name; });
      return error_at(e.start_mark, open ? "the alias *" + shorten(name) +
                                               " is inside its own anchor (a recursive "
                                               "structure is not supported)"
                                         : "found undefined alias *" + shorten(name));
    }
    if (stack_.size() + found->second.size.height > kMaxDepth) {
      return error_at(e.start_mark, "the alias *" + shorten(name) + " nests deeper than " +
                                        std::to_string(kMaxDepth) + " levels");
    }
    CELLGATE_TRY(charge(found->second.size, e.start_mark));
    return add(Value(found->second.value), Implicit::kString, e.start_mark);
  }

  // safe_load's scalar: resolved when plain (or tagged '!'), else a string or what its tag says.
  Result<Value> scalar(const yaml_event_t& e, Implicit& special) const {
    const auto& s = e.data.scalar;
    Value v;
    v.text.assign(reinterpret_cast<const char*>(s.value), s.length);
    const std::string tag = text_of(s.tag);
    const std::string kTag = "tag:yaml.org,2002:";
    Implicit kind = Implicit::kString;
    if (s.plain_implicit != 0) {
      kind = resolve(v.text);
    } else if (!tag.empty() && tag != "!" && tag != kTag + "str") {
      const std::map<std::string, Implicit> tags = {{kTag + "null", Implicit::kNull},
                                                    {kTag + "bool", Implicit::kBool},
                                                    {kTag + "int", Implicit::kInt},
                                                    {kTag + "float", Implicit::kFloat}};
      auto known = tags.find(tag);
      if (known == tags.end()) {
        return error_at(e.start_mark, unsupported_tag(tag));
      }
      kind = known->second;
      if (kind == Implicit::kInt && !int_form().matches(v.text)) {
        return error_at(e.start_mark, quote(v.text) + " is not an !!int");
      }
    }
    switch (kind) {
      case Implicit::kNull:
        return Value{};
      case Implicit::kBool: {
        auto b = construct_bool(v.text);
        if (!b) {
          return error_at(e.start_mark, quote(v.text) + " is not a !!bool");
        }
        v.kind = Kind::kBool;
        v.boolean = *b;
        v.text.clear();
        return v;
      }
      case Implicit::kInt: {
        auto i = construct_int(v.text);
        if (!i) {
          return error_at(e.start_mark, quote(v.text) + ": " + i.error().message);
        }
        v.kind = Kind::kInt;
        v.text = std::move(*i);
        return v;
      }
      case Implicit::kFloat: {
        auto f = construct_float(v.text);
        if (!f) {
          return error_at(e.start_mark, quote(v.text) + " is not a !!float");
        }
        v.kind = Kind::kFloat;
        v.number = *f;
        v.text.clear();
        return v;
      }
      case Implicit::kMerge:
      case Implicit::kValueKey:
        special = kind;
        break;
      case Implicit::kString:
        break;
    }
    v.kind = Kind::kString;
    return v;
  }

  // Named as the document spells the standard ones: tag:yaml.org,2002:set is !!set.
  static std::string unsupported_tag(const std::string& tag) {
    const std::string standard = "tag:yaml.org,2002:";
    const std::string name = tag.rfind(standard, 0) == 0 ? "!!" + tag.substr(standard.size()) : tag;
    return "the tag " + shorten(name) +
           " is not supported (safe_load's !!str, !!int, !!float, !!bool, !!null, !!seq and "
           "!!map are)";
  }

  Result<void> check_anchor(const yaml_char_t* anchor, const yaml_mark_t& mark) const {
    const std::string name = text_of(anchor);
    if (name.empty()) {
      return ok_result();
    }
    const bool open =
        std::any_of(stack_.begin(), stack_.end(), [&](const Frame& f) { return f.anchor == name; });
    if (open || anchors_.count(name) != 0) {
      return error_at(mark, "found duplicate anchor &" + shorten(name));
    }
    return ok_result();
  }

  // The copy an anchor keeps costs what an alias's does.
  Result<void> remember(const std::string& anchor, const Value& v, const yaml_mark_t& mark) {
    if (anchor.empty()) {
      return ok_result();
    }
    Size size;
    measure(v, size);
    CELLGATE_TRY(charge(size, mark));
    anchors_.emplace(anchor, Anchored{v, size});
    return ok_result();
  }

  Result<void> charge(const Size& size, const yaml_mark_t& mark) {
    nodes_ += size.nodes;
    copied_bytes_ += size.bytes;
    if (nodes_ > kMaxNodes) {
      return error_at(mark, "the document makes more than " + std::to_string(kMaxNodes) +
                                " values (each copy an alias makes counts)");
    }
    if (copied_bytes_ > kMaxCopiedBytes) {
      return error_at(
          mark, "aliases copy more than " + std::to_string(kMaxCopiedBytes >> 20) + " MiB of text");
    }
    return ok_result();
  }

  // A finished value goes into the list or dict being read, or is the document.
  Result<void> add(Value v, Implicit special, const yaml_mark_t& mark) {
    if (stack_.empty() || stack_.back().value.kind == Kind::kList || stack_.back().key) {
      if (special != Implicit::kString) {
        return error_at(mark, std::string("a plain '") +
                                  (special == Implicit::kMerge ? "<<" : "=") +
                                  "' can only be a mapping key");
      }
    }
    if (stack_.empty()) {
      root_ = std::move(v);
      return ok_result();
    }
    Frame& f = stack_.back();
    if (f.value.kind == Kind::kList) {
      f.value.items.push_back(std::move(v));
      return ok_result();
    }
    if (!f.key) {
      if (v.kind == Kind::kList || v.kind == Kind::kDict) {
        return error_at(mark, "found unhashable key (a list or mapping cannot be a dict key)");
      }
      f.merge_key = special == Implicit::kMerge;
      f.key = std::move(v);
      return ok_result();
    }
    Value key = std::move(*f.key);
    f.key.reset();
    if (!f.merge_key) {
      f.value.entries.emplace_back(std::move(key), std::move(v));
      return ok_result();
    }
    // flatten_mapping: a mapping's entries, or a list of mappings' entries, the last first.
    if (v.kind == Kind::kDict) {
      std::move(v.entries.begin(), v.entries.end(), std::back_inserter(f.merged));
      return ok_result();
    }
    const bool mappings =
        v.kind == Kind::kList && std::all_of(v.items.begin(), v.items.end(),
                                             [](const Value& i) { return i.kind == Kind::kDict; });
    if (!mappings) {
      return error_at(mark, "expected a mapping or list of mappings for merging (<<)");
    }
    for (auto item = v.items.rbegin(); item != v.items.rend(); ++item) {
      std::move(item->entries.begin(), item->entries.end(), std::back_inserter(f.merged));
    }
    return ok_result();
  }

  yaml_parser_t parser_{};
  std::vector<Frame> stack_;
  std::unordered_map<std::string, Anchored> anchors_;
  Value root_;
  std::size_t documents_ = 0;
  std::size_t nodes_ = 0;
  std::size_t copied_bytes_ = 0;
};

}  // namespace

Result<Value> load(std::string_view text) {
  Composer composer(text);
  return composer.run();
}

}  // namespace cellgate::notebooks::yaml
