// papermill's -p / -r / -y and its PythonTranslator (see parameters.hpp). The YAML reader is a
// small subset written for parameters; values are rendered to Python text as they are read.
#include "cellgate/notebooks/parameters.hpp"

#include <regex.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace cellgate::notebooks::parameters {
namespace {

using nlohmann::json;
using notebook::Parameter;

Error bad(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "bad_parameter", std::move(message));
}

constexpr std::array<std::string_view, 35> kPythonKeywords = {
    "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
    "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
    "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
    "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};

// Python's int() and float() strip whitespace around the number.
std::string_view strip(std::string_view s) {
  const char* ws = " \t\n\r\v\f";
  const auto begin = s.find_first_not_of(ws);
  if (begin == std::string_view::npos) {
    return {};
  }
  return s.substr(begin, s.find_last_not_of(ws) - begin + 1);
}

std::string without_underscores(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != '_') {
      out += c;
    }
  }
  return out;
}

// An arbitrary-size non-negative integer, only as big as parameters need: built digit by digit
// in any base and written in decimal (Python ints have no size limit).
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
  void add(const BigInt& other) {
    std::uint64_t carry = 0;
    for (std::size_t i = 0; i < std::max(limbs_.size(), other.limbs_.size()) || carry; ++i) {
      if (i == limbs_.size()) {
        limbs_.push_back(0);
      }
      const std::uint64_t v = limbs_[i] + carry + (i < other.limbs_.size() ? other.limbs_[i] : 0);
      limbs_[i] = static_cast<std::uint32_t>(v % kLimb);
      carry = v / kLimb;
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
  bool zero() const { return limbs_.empty(); }

 private:
  static constexpr std::uint64_t kLimb = 1000000000;
  std::vector<std::uint32_t> limbs_;
};

std::string signed_decimal(bool negative, const BigInt& n) {
  return (negative && !n.zero() ? "-" : "") + n.decimal();
}

// Python's int(s) in base 10: [sign] digits with single underscores between them; more than
// 4300 digits is a ValueError (Python 3.11's limit), as are other forms.
// Scanned by hand, not with std::regex: libstdc++'s matcher recurses once per repeated digit,
// so a long value (the 4301-digit one of the tests, under clang's ASan) overflows the stack.
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// \d(_?\d)* at s[pos]: moves pos past it; false (pos kept) when no digit is there.
bool skip_digit_group(std::string_view s, std::size_t& pos) {
  if (pos >= s.size() || !is_digit(s[pos])) {
    return false;
  }
  ++pos;
  while (pos < s.size()) {
    if (is_digit(s[pos])) {
      ++pos;
    } else if (s[pos] == '_' && pos + 1 < s.size() && is_digit(s[pos + 1])) {
      pos += 2;
    } else {
      break;
    }
  }
  return true;
}

void skip_sign(std::string_view s, std::size_t& pos) {
  if (pos < s.size() && (s[pos] == '+' || s[pos] == '-')) {
    ++pos;
  }
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) {
      return false;
    }
  }
  return true;
}

std::optional<std::string> python_int(std::string_view text) {
  // ^[+-]?\d(_?\d)*$
  const std::string s(strip(text));
  std::size_t pos = 0;
  skip_sign(s, pos);
  if (!skip_digit_group(s, pos) || pos != s.size()) {
    return std::nullopt;
  }
  const std::string digits = without_underscores(s);
  const bool negative = digits[0] == '-';
  const std::size_t first = digits[0] == '-' || digits[0] == '+' ? 1 : 0;
  if (digits.size() - first > 4300) {
    return std::nullopt;
  }
  BigInt n;
  for (std::size_t i = first; i < digits.size(); ++i) {
    n.push_digit(10, static_cast<unsigned>(digits[i] - '0'));
  }
  return signed_decimal(negative, n);
}

// Python's float(s): [sign] (a decimal with optional fraction and exponent, underscores between
// digits | inf | infinity | nan), case-insensitive words.
std::optional<double> python_float_of(std::string_view text) {
  // ^[+-]?(((\d(_?\d)*)?\.\d(_?\d)*|\d(_?\d)*\.?)([eE][+-]?\d(_?\d)*)?|inf(inity)?|nan)$,
  // the words in any case.
  const std::string s(strip(text));
  std::size_t pos = 0;
  skip_sign(s, pos);
  const std::string_view word = std::string_view(s).substr(pos);
  if (!equals_ignoring_case(word, "inf") && !equals_ignoring_case(word, "infinity") &&
      !equals_ignoring_case(word, "nan")) {
    const bool whole = skip_digit_group(s, pos);
    bool fraction = false;
    if (pos < s.size() && s[pos] == '.') {
      ++pos;
      fraction = skip_digit_group(s, pos);
    }
    if (!whole && !fraction) {
      return std::nullopt;
    }
    if (pos < s.size() && (s[pos] == 'e' || s[pos] == 'E')) {
      ++pos;
      skip_sign(s, pos);
      if (!skip_digit_group(s, pos)) {
        return std::nullopt;
      }
    }
    if (pos != s.size()) {
      return std::nullopt;
    }
  }
  const std::string plain = without_underscores(s);
  return std::strtod(plain.c_str(), nullptr);  // overflows to ±inf, as float() does
}

// Appends a code point as UTF-8.
void put_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---- a YAML subset (see parameters.hpp) -------------------------------------------------------

struct NodeEntry;

struct Node {
  enum class Kind { kScalar, kSequence, kMapping } kind = Kind::kScalar;
  std::string text;  // a scalar's value
  bool quoted = false;
  std::vector<Node> items;         // a sequence
  std::vector<NodeEntry> entries;  // a mapping, in order
};

// A mapping's key and value. Not std::pair<Node, Node>: a pair of the incomplete Node inside
// Node is undefined, and clang's libstdc++ checks refuse it.
struct NodeEntry {
  NodeEntry(Node key, Node value) : first(std::move(key)), second(std::move(value)) {}
  Node first;
  Node second;
};

// A whole-string match against a POSIX extended regular expression. Not std::regex: libstdc++'s
// matcher recurses once per repeated character, so a long scalar or name (a 100 KB `-y` value)
// overflows the stack; glibc's regexec walks its automaton without recursing.
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
  // `s` must hold no NUL (regexec stops there): callers pass scalars and names, which cannot.
  bool matches(const std::string& s) const {
    return ok_ && s.find('\0') == std::string::npos &&
           ::regexec(&re_, s.c_str(), 0, nullptr, 0) == 0;
  }

 private:
  regex_t re_{};
  bool ok_ = false;
};

// PyYAML's SafeLoader resolvers (yaml/resolver.py), timestamps left out as papermill does.
enum class Tag { kNull, kBool, kInt, kFloat, kString };

Tag resolve(const Node& scalar) {
  if (scalar.quoted) {
    return Tag::kString;
  }
  static const Pattern null_form("^(~|null|Null|NULL|)$");
  static const Pattern bool_form(
      "^(yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$");
  static const Pattern float_form(
      "^([-+]?[0-9][0-9_]*\\.[0-9_]*([eE][-+][0-9]+)?|\\.[0-9][0-9_]*([eE][-+][0-9]+)?|"
      "[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN))$");
  static const Pattern int_form(
      "^([-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|"
      "[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+)$");
  const std::string& s = scalar.text;
  if (null_form.matches(s)) {
    return Tag::kNull;
  }
  if (bool_form.matches(s)) {
    return Tag::kBool;
  }
  if (float_form.matches(s)) {
    return Tag::kFloat;
  }
  if (int_form.matches(s)) {
    return Tag::kInt;
  }
  return Tag::kString;
}

// PyYAML's construct_yaml_int.
std::string yaml_int(const std::string& text) {
  std::string s = without_underscores(text);
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') {
    negative = s[0] == '-';
    s.erase(0, 1);
  }
  BigInt n;
  auto digits = [&](std::string_view ds, unsigned base) {
    for (char c : ds) {
      const unsigned d = c >= 'a' ? c - 'a' + 10 : c >= 'A' ? c - 'A' + 10 : c - '0';
      n.push_digit(base, d);
    }
  };
  if (s == "0") {
    return "0";
  } else if (s.rfind("0b", 0) == 0) {
    digits(s.substr(2), 2);
  } else if (s.rfind("0x", 0) == 0) {
    digits(s.substr(2), 16);
  } else if (s[0] == '0') {
    digits(s.substr(1), 8);
  } else if (s.find(':') != std::string::npos) {
    // Base 60: 1:30 is 90.
    std::size_t start = 0;
    while (true) {
      const auto colon = s.find(':', start);
      BigInt part;
      for (char c : s.substr(start, colon - start)) {
        part.push_digit(10, static_cast<unsigned>(c - '0'));
      }
      n.add(part);
      if (colon == std::string::npos) {
        break;
      }
      n.push_digit(60, 0);
      start = colon + 1;
    }
  } else {
    digits(s, 10);
  }
  return signed_decimal(negative, n);
}

// PyYAML's construct_yaml_float.
double yaml_float(const std::string& text) {
  std::string s = without_underscores(text);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  double sign = 1;
  if (s[0] == '-' || s[0] == '+') {
    sign = s[0] == '-' ? -1 : 1;
    s.erase(0, 1);
  }
  if (s == ".inf") {
    return sign * HUGE_VAL;
  }
  if (s == ".nan") {
    return std::nan("");
  }
  if (s.find(':') != std::string::npos) {
    double value = 0;
    std::size_t start = 0;
    while (true) {
      const auto colon = s.find(':', start);
      value = value * 60 + std::strtod(s.substr(start, colon - start).c_str(), nullptr);
      if (colon == std::string::npos) {
        break;
      }
      start = colon + 1;
    }
    return sign * value;
  }
  return sign * std::strtod(s.c_str(), nullptr);
}

// Python's str() of a resolved scalar, for papermill's dict keys ("{}".format(key)).
std::string scalar_str(const Node& n) {
  switch (resolve(n)) {
    case Tag::kNull:
      return "None";
    case Tag::kBool:
      return n.text[0] == 'y' || n.text[0] == 'Y' || n.text[0] == 't' || n.text[0] == 'T' ||
                     n.text == "on" || n.text == "On" || n.text == "ON"
                 ? "True"
                 : "False";
    case Tag::kInt:
      return yaml_int(n.text);
    case Tag::kFloat: {
      const double v = yaml_float(n.text);
      return std::isnan(v) ? "nan" : std::isinf(v) ? (v < 0 ? "-inf" : "inf") : python_float(v);
    }
    case Tag::kString:
      break;
  }
  return n.text;
}

std::string render(const Node& n);

// A mapping's entries with PyYAML's dict semantics: a repeated key keeps its first place and
// takes the last value. Keys compare by their Python value's text and type.
std::vector<std::pair<const Node*, const Node*>> dict_of(const Node& map) {
  std::vector<std::pair<const Node*, const Node*>> out;
  std::vector<std::pair<Tag, std::string>> keys;
  for (const auto& [k, v] : map.entries) {
    std::pair<Tag, std::string> key{k.kind == Node::Kind::kScalar ? resolve(k) : Tag::kString,
                                    scalar_str(k)};
    if (key.first == Tag::kBool || key.first == Tag::kInt) {
      key.first = Tag::kInt;  // True == 1 as dict keys
      key.second = key.second == "True" ? "1" : key.second == "False" ? "0" : key.second;
    }
    auto found = std::find(keys.begin(), keys.end(), key);
    if (found == keys.end()) {
      keys.push_back(key);
      out.emplace_back(&k, &v);
    } else {
      out[static_cast<std::size_t>(found - keys.begin())].second = &v;
    }
  }
  return out;
}

// papermill's PythonTranslator.translate.
std::string render(const Node& n) {
  if (n.kind == Node::Kind::kSequence) {
    std::string out = "[";
    for (std::size_t i = 0; i < n.items.size(); ++i) {
      out += (i == 0 ? "" : ", ") + render(n.items[i]);
    }
    return out + "]";
  }
  if (n.kind == Node::Kind::kMapping) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : dict_of(n)) {
      // translate_str(key): a string key is escaped; any other is formatted as it is.
      const std::string key =
          resolve(*k) == Tag::kString ? python_str(k->text) : "\"" + scalar_str(*k) + "\"";
      out += (first ? "" : ", ") + key + ": " + render(*v);
      first = false;
    }
    return out + "}";
  }
  switch (resolve(n)) {
    case Tag::kNull:
    case Tag::kBool:
    case Tag::kInt:
      return scalar_str(n);
    case Tag::kFloat:
      return python_float(yaml_float(n.text));
    case Tag::kString:
      break;
  }
  return python_str(n.text);
}

// A decimal int as JSON: exact within 64 bits, else the nearest double (past its range, null).
json int_json(const std::string& decimal) {
  json v = json::parse(decimal, nullptr, false);
  if (v.is_discarded() || !v.is_number()) {
    const double d = std::strtod(decimal.c_str(), nullptr);
    return std::isfinite(d) ? json(d) : json();
  }
  return v;
}

// The value as JSON, for metadata.papermill.parameters (Python's json.dumps of the dict papermill
// keeps). An int past 64 bits becomes a float, NaN and the infinities null.
json to_json(const Node& n) {
  if (n.kind == Node::Kind::kSequence) {
    json out = json::array();
    for (const auto& item : n.items) {
      out.push_back(to_json(item));
    }
    return out;
  }
  if (n.kind == Node::Kind::kMapping) {
    json out = json::object();
    for (const auto& [k, v] : dict_of(n)) {
      out[resolve(*k) == Tag::kString ? k->text : scalar_str(*k)] = to_json(*v);
    }
    return out;
  }
  switch (resolve(n)) {
    case Tag::kNull:
      return json();
    case Tag::kBool:
      return scalar_str(n) == "True";
    case Tag::kInt:
      return int_json(yaml_int(n.text));
    case Tag::kFloat:
      return std::isfinite(yaml_float(n.text)) ? json(yaml_float(n.text)) : json();
    case Tag::kString:
      break;
  }
  return n.text;
}

// Reads the subset. Errors name the line.
class YamlReader {
 public:
  explicit YamlReader(std::string_view text) {
    std::size_t start = 0;
    while (start <= text.size()) {
      const auto nl = text.find('\n', start);
      std::string line(text.substr(start, nl == std::string_view::npos ? nl : nl - start));
      if (!line.empty() && line.back() == '\r') {
        line.pop_back();
      }
      lines_.push_back(std::move(line));
      if (nl == std::string_view::npos) {
        break;
      }
      start = nl + 1;
    }
  }

  Result<Node> document() {
    // Blank lines, comment lines, one leading "---".
    std::vector<std::pair<std::size_t, std::string>> kept;
    bool seen_start = false;
    for (std::size_t i = 0; i < lines_.size(); ++i) {
      std::string line = lines_[i];
      const std::string trimmed(strip(line));
      if (trimmed.empty() || trimmed[0] == '#') {
        continue;
      }
      if (trimmed.rfind("---", 0) == 0 && (trimmed.size() == 3 || trimmed[3] == ' ')) {
        if (seen_start || !kept.empty()) {
          return error(i, "several YAML documents are not supported");
        }
        seen_start = true;
        line = trimmed.substr(3);
        if (strip(line).empty()) {
          continue;
        }
      }
      if (trimmed[0] == '%') {
        return error(i, "YAML directives are not supported");
      }
      if (line.find('\t') < line.find_first_not_of(" \t")) {
        return error(i, "tabs cannot indent YAML");
      }
      kept.emplace_back(i, line);
    }
    rows_ = std::move(kept);
    if (rows_.empty()) {
      return Node{};  // null
    }
    const std::string first(strip(rows_[0].second));
    if (first[0] == '{' || first[0] == '[' ||
        ((first[0] == '"' || first[0] == '\'') && !key_end(first))) {
      // A flow collection or a quoted scalar, over any number of lines.
      std::string all;
      for (const auto& [n, line] : rows_) {
        all += line + "\n";
      }
      std::size_t pos = 0;
      CELLGATE_ASSIGN_OR_RETURN(Node node, flow(all, pos, rows_[0].first));
      skip_space(all, pos);
      if (pos != all.size()) {
        return error(rows_[0].first, "unexpected text after the value: '" +
                                         std::string(strip(all.substr(pos, 20))) + "'");
      }
      return node;
    }
    std::size_t row = 0;
    CELLGATE_ASSIGN_OR_RETURN(Node node, block(row, indent_of(0)));
    if (row != rows_.size()) {
      return error(rows_[row].first, "bad indentation");
    }
    return node;
  }

 private:
  // block() and flow() recurse once per level of nesting, and so do Node's destructor and the
  // rendering: the depth is bounded as a notebook's is (a -y value, or a notebook given to the
  // fuzz target as one, could nest 100,000 deep).
  static constexpr std::size_t kMaxYamlDepth = notebook::kMaxDepth;
  class Level {
   public:
    explicit Level(std::size_t& depth) : depth_(depth) { ++depth_; }
    ~Level() { --depth_; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;

   private:
    std::size_t& depth_;
  };
  static std::string too_deep() {
    return "nested deeper than " + std::to_string(kMaxYamlDepth) + " levels";
  }

  Error error(std::size_t line, const std::string& what) const {
    return bad("-y: line " + std::to_string(line + 1) + ": " + what);
  }

  std::size_t indent_of(std::size_t row) const { return rows_[row].second.find_first_not_of(' '); }
  std::string content(std::size_t row) const { return rows_[row].second.substr(indent_of(row)); }
  static bool is_item(const std::string& c) { return c == "-" || c.rfind("- ", 0) == 0; }

  // Rows from `row` that are indented exactly `indent`: a sequence or a mapping.
  Result<Node> block(std::size_t& row, std::size_t indent) {
    const Level level(depth_);
    if (depth_ > kMaxYamlDepth) {
      return error(rows_[row].first, too_deep());
    }
    Node node;
    const bool sequence = is_item(content(row));
    node.kind = sequence ? Node::Kind::kSequence : Node::Kind::kMapping;
    while (row < rows_.size() && indent_of(row) == indent) {
      const std::size_t line = rows_[row].first;
      std::string c = content(row);
      if (is_item(c) != sequence) {
        return error(line, "a sequence item and a mapping key at one indentation");
      }
      if (sequence) {
        const std::string rest(strip(c.substr(1)));
        if (rest.empty()) {
          ++row;
          CELLGATE_ASSIGN_OR_RETURN(Node item, nested(row, indent, line));
          node.items.push_back(std::move(item));
        } else if (is_item(rest) || key_end(rest)) {
          // "- key: value" (or "- - x"): the rest starts a block where it stands.
          const std::size_t at = indent + 1 + c.substr(1).find_first_not_of(' ');
          rows_[row].second = std::string(at, ' ') + c.substr(at - indent);
          CELLGATE_ASSIGN_OR_RETURN(Node item, block(row, at));
          node.items.push_back(std::move(item));
        } else {
          CELLGATE_ASSIGN_OR_RETURN(Node item, inline_value(rest, line));
          node.items.push_back(std::move(item));
          ++row;
        }
        continue;
      }
      auto colon = key_end(c);
      if (!colon) {
        return error(line, "expected 'key: value'");
      }
      CELLGATE_ASSIGN_OR_RETURN(Node key, key_of(c.substr(0, *colon), line));
      const std::string rest(strip(c.substr(*colon + 1)));
      ++row;
      if (rest.empty() || rest[0] == '#') {
        // The value is the block below (or null): deeper, or a sequence at the same indent.
        if (row < rows_.size() && indent_of(row) == indent && is_item(content(row))) {
          CELLGATE_ASSIGN_OR_RETURN(Node value, block(row, indent));
          node.entries.emplace_back(std::move(key), std::move(value));
        } else {
          CELLGATE_ASSIGN_OR_RETURN(Node value, nested(row, indent, line));
          node.entries.emplace_back(std::move(key), std::move(value));
        }
      } else {
        CELLGATE_ASSIGN_OR_RETURN(Node value, inline_value(rest, line));
        node.entries.emplace_back(std::move(key), std::move(value));
      }
    }
    if (row < rows_.size() && indent_of(row) > indent) {
      return error(rows_[row].first, "bad indentation");
    }
    return node;
  }

  // The block under a key or an item: deeper rows, or null when there are none.
  Result<Node> nested(std::size_t& row, std::size_t indent, std::size_t line) {
    if (row < rows_.size() && indent_of(row) > indent) {
      return block(row, indent_of(row));
    }
    (void)line;
    return Node{};
  }

  // Where a mapping key ends: the ':' followed by a space or the end, outside quotes.
  static std::optional<std::size_t> key_end(const std::string& c) {
    std::size_t i = 0;
    if (!c.empty() && (c[0] == '"' || c[0] == '\'')) {
      const char q = c[0];
      for (i = 1; i < c.size(); ++i) {
        if (q == '"' && c[i] == '\\') {
          ++i;
        } else if (c[i] == q) {
          if (q == '\'' && i + 1 < c.size() && c[i + 1] == '\'') {
            ++i;
            continue;
          }
          break;
        }
      }
      ++i;
      while (i < c.size() && c[i] == ' ') {
        ++i;
      }
      return i < c.size() && c[i] == ':' ? std::optional<std::size_t>(i) : std::nullopt;
    }
    for (; i < c.size(); ++i) {
      if (c[i] == '#' && i > 0 && c[i - 1] == ' ') {
        return std::nullopt;
      }
      if (c[i] == ':' && (i + 1 == c.size() || c[i + 1] == ' ')) {
        return i;
      }
    }
    return std::nullopt;
  }

  Result<Node> key_of(const std::string& text, std::size_t line) {
    const std::string k(strip(text));
    if (!k.empty() &&
        (k[0] == '?' || k[0] == '&' || k[0] == '*' || k[0] == '!' || k[0] == '[' || k[0] == '{')) {
      return error(line, "complex keys, anchors, aliases and tags are not supported");
    }
    if (!k.empty() && (k[0] == '"' || k[0] == '\'')) {
      std::size_t pos = 0;
      return quoted(k, pos, line);
    }
    Node n;
    n.text = k;
    return n;
  }

  // A value on the rest of a line: a flow collection, a quoted or a plain scalar.
  Result<Node> inline_value(const std::string& rest, std::size_t line) {
    const char c = rest[0];
    if (c == '&' || c == '*' || c == '!' || c == '|' || c == '>' || c == '?' || c == '%' ||
        c == '@' || c == '`') {
      return error(line, std::string("'") + c +
                             "' (anchors, aliases, tags, block scalars) is not supported");
    }
    if (c == '[' || c == '{' || c == '"' || c == '\'') {
      std::size_t pos = 0;
      CELLGATE_ASSIGN_OR_RETURN(Node node, flow(rest, pos, line));
      skip_space(rest, pos);
      if (pos != rest.size()) {
        return error(line,
                     "unexpected text after the value (a flow collection must end on "
                     "its line): '" +
                         rest.substr(pos) + "'");
      }
      return node;
    }
    Node n;
    n.text = rest;
    if (auto hash = n.text.find(" #"); hash != std::string::npos) {
      n.text.erase(hash);
    }
    n.text = std::string(strip(n.text));
    return n;
  }

  // Spaces, newlines and comments (a '#' at the start or after a space).
  static void skip_space(const std::string& s, std::size_t& pos) {
    while (pos < s.size()) {
      if (s[pos] == ' ' || s[pos] == '\n' || s[pos] == '\t' || s[pos] == '\r') {
        ++pos;
      } else if (s[pos] == '#' && (pos == 0 || s[pos - 1] == ' ' || s[pos - 1] == '\n')) {
        pos = s.find('\n', pos);
        pos = pos == std::string::npos ? s.size() : pos;
      } else {
        break;
      }
    }
  }

  Result<Node> flow(const std::string& s, std::size_t& pos, std::size_t line) {
    skip_space(s, pos);
    if (pos >= s.size()) {
      return error(line, "a flow collection is not closed");
    }
    const char c = s[pos];
    if (c == '"' || c == '\'') {
      return quoted(s, pos, line);
    }
    if (c == '[' || c == '{') {
      const Level level(depth_);
      if (depth_ > kMaxYamlDepth) {
        return error(line, too_deep());
      }
      const bool mapping = c == '{';
      const char close = mapping ? '}' : ']';
      Node node;
      node.kind = mapping ? Node::Kind::kMapping : Node::Kind::kSequence;
      ++pos;
      while (true) {
        skip_space(s, pos);
        if (pos >= s.size()) {
          return error(line, std::string("a flow collection is not closed: no '") + close + "'");
        }
        if (s[pos] == close) {
          ++pos;
          return node;
        }
        CELLGATE_ASSIGN_OR_RETURN(Node first, flow(s, pos, line));
        skip_space(s, pos);
        if (mapping) {
          Node value;
          if (pos < s.size() && s[pos] == ':') {
            ++pos;
            skip_space(s, pos);
            if (pos < s.size() && s[pos] != ',' && s[pos] != close) {
              CELLGATE_ASSIGN_OR_RETURN(value, flow(s, pos, line));
            }
          }
          node.entries.emplace_back(std::move(first), std::move(value));
        } else {
          node.items.push_back(std::move(first));
        }
        skip_space(s, pos);
        if (pos < s.size() && s[pos] == ',') {
          ++pos;
        } else if (pos < s.size() && s[pos] != close) {
          return error(line, std::string("expected ',' or '") + close + "' in a flow collection");
        }
      }
    }
    if (c == '&' || c == '*' || c == '!' || c == '|' || c == '>' || c == '?') {
      return error(line, std::string("'") + c + "' (anchors, aliases, tags) is not supported");
    }
    // A plain scalar in a flow collection: up to ",[]{}", ": " or ":" before an indicator, " #".
    Node n;
    std::size_t end = pos;
    while (end < s.size()) {
      const char e = s[end];
      if (e == ',' || e == '[' || e == ']' || e == '{' || e == '}' || e == '\n') {
        break;
      }
      if (e == ':' && (end + 1 == s.size() ||
                       std::string_view(" ,[]{}\n").find(s[end + 1]) != std::string_view::npos)) {
        break;
      }
      if (e == '#' && end > pos && s[end - 1] == ' ') {
        break;
      }
      ++end;
    }
    n.text = std::string(strip(s.substr(pos, end - pos)));
    pos = end;
    return n;
  }

  // 'single' ('' is a quote) or "double" (backslash escapes) quoted.
  Result<Node> quoted(const std::string& s, std::size_t& pos, std::size_t line) {
    const char q = s[pos++];
    Node n;
    n.quoted = true;
    while (true) {
      if (pos >= s.size()) {
        return error(line, "a quoted string is not closed");
      }
      const char c = s[pos++];
      if (c == q) {
        if (q == '\'' && pos < s.size() && s[pos] == '\'') {
          n.text += '\'';
          ++pos;
          continue;
        }
        return n;
      }
      if (c == '\n') {
        n.text += ' ';  // a line break in a quoted scalar folds to a space
        continue;
      }
      if (q == '\'' || c != '\\') {
        n.text += c;
        continue;
      }
      if (pos >= s.size()) {
        return error(line, "a quoted string is not closed");
      }
      const char e = s[pos++];
      static const std::string_view simple = "0abtnvfre \"/\\N_LP";
      static const std::string_view means[] = {"\0", "\a",   "\b", "\t", "\n", "\v", "\f",
                                               "\r", "\x1b", " ",  "\"", "/",  "\\"};
      if (auto k = simple.find(e); k != std::string_view::npos && k < 13) {
        n.text += k == 0 ? std::string(1, '\0') : std::string(means[k]);
      } else if (e == 'x' || e == 'u' || e == 'U') {
        const std::size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        const std::string hex = s.substr(pos, len);
        std::uint32_t cp = 0;
        auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), cp, 16);
        if (ec != std::errc() || p != hex.data() + len || hex.size() != len) {
          return error(line, "a bad \\" + std::string(1, e) + " escape in a quoted string");
        }
        put_utf8(n.text, cp);
        pos += len;
      } else {
        return error(line, std::string("an unknown escape \\") + e + " in a quoted string");
      }
    }
  }

  std::vector<std::string> lines_;
  std::vector<std::pair<std::size_t, std::string>> rows_;  // (line index, text) worth reading
  std::size_t depth_ = 0;                                  // block() and flow() calls open now
};

}  // namespace

Result<void> check_name(std::string_view name) {
  static const Pattern identifier("^[A-Za-z_][A-Za-z0-9_]*$");
  const std::string n(name);
  if (!identifier.matches(n) ||
      std::find(kPythonKeywords.begin(), kPythonKeywords.end(), n) != kPythonKeywords.end()) {
    return bad("'" + n + "' is not a Python variable name");
  }
  return ok_result();
}

std::string python_str(std::string_view s) {
  std::string out = "\"";
  char buf[16];
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    // Decode one UTF-8 sequence; a byte that starts none is what Python's surrogateescape makes
    // of it (U+DC80..U+DCFF), as a command-line argument would be.
    std::uint32_t cp = c;
    std::size_t len = 1;
    if (c >= 0x80) {
      len = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
      bool ok = len != 0 && i + len <= s.size();
      if (ok) {
        cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
        for (std::size_t k = 1; k < len; ++k) {
          const auto cont = static_cast<unsigned char>(s[i + k]);
          ok = ok && (cont & 0xC0) == 0x80;
          cp = (cp << 6) | (cont & 0x3F);
        }
        ok = ok && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) &&
             !(cp >= 0xD800 && cp <= 0xDFFF);
      }
      if (!ok) {
        cp = 0xDC00 | c;
        len = 1;
      }
    }
    i += len;
    // unicode_escape, then papermill's '"' → '\"'.
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == '"') {
      out += "\\\"";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || (cp >= 0x7F && cp < 0x100)) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
      out += buf;
    } else if (cp >= 0x100 && cp < 0x10000) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else if (cp >= 0x10000) {
      std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out += static_cast<char>(cp);
    }
  }
  return out + "\"";
}

std::string python_float(double value) {
  if (std::isnan(value)) {
    return "float('nan')";
  }
  if (std::isinf(value)) {
    return value < 0 ? "float('-inf')" : "float('inf')";
  }
  // The shortest digits that read back as `value`, then Python's repr layout (format code 'r':
  // exponent notation when the decimal point is before -4 or past 16 digits).
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  std::string sci(buf, ec == std::errc() ? end : buf);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const auto e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::atoi(sci.c_str() + e + 1);
  const int point = exponent + 1;  // digits are 0.DIGITS x 10^point
  const int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      return sign + "0." + std::string(static_cast<std::size_t>(-point), '0') + digits;
    }
    if (point >= n) {
      return sign + digits + std::string(static_cast<std::size_t>(point - n), '0') + ".0";
    }
    return sign + digits.substr(0, static_cast<std::size_t>(point)) + "." +
           digits.substr(static_cast<std::size_t>(point));
  }
  std::snprintf(buf, sizeof buf, "e%c%02d", point - 1 < 0 ? '-' : '+', std::abs(point - 1));
  return sign + digits.substr(0, 1) + (n > 1 ? "." + digits.substr(1) : "") + buf;
}

Result<Parameter> typed(std::string_view name, std::string_view value) {
  if (auto ok = check_name(name); !ok) {
    return bad("-p " + std::string(name) + ": " + ok.error().message);
  }
  Parameter p;
  p.name = std::string(name);
  if (value == "True" || value == "False" || value == "None") {
    p.python = std::string(value);
    p.value = value == "None" ? json() : json(value == "True");
  } else if (auto i = python_int(value)) {
    p.python = *i;
    p.value = int_json(*i);
  } else if (auto f = python_float_of(value)) {
    p.python = python_float(*f);
    p.value = std::isfinite(*f) ? json(*f) : json();
  } else {
    p.python = python_str(value);
    p.value = std::string(value);
  }
  return p;
}

Result<Parameter> raw(std::string_view name, std::string_view value) {
  if (auto ok = check_name(name); !ok) {
    return bad("-r " + std::string(name) + ": " + ok.error().message);
  }
  return Parameter{std::string(name), python_str(value), std::string(value)};
}

Result<std::vector<Parameter>> yaml(std::string_view text) {
  YamlReader reader(text);
  CELLGATE_ASSIGN_OR_RETURN(Node doc, reader.document());
  std::vector<Parameter> out;
  if (doc.kind == Node::Kind::kScalar && !doc.quoted && resolve(doc) == Tag::kNull) {
    return out;  // papermill: `yaml.load(...) or {}`
  }
  if (doc.kind != Node::Kind::kMapping) {
    return bad("-y wants a mapping of names to values ('name: value' or {\"name\": value})");
  }
  for (const auto& [k, v] : dict_of(doc)) {
    if (k->kind != Node::Kind::kScalar || resolve(*k) != Tag::kString) {
      return bad("-y: the key " + scalar_str(*k) + " is not a Python variable name");
    }
    if (auto ok = check_name(k->text); !ok) {
      return bad("-y: " + ok.error().message);
    }
    out.push_back({k->text, render(*v), to_json(*v)});
  }
  return out;
}

std::vector<Parameter> merge(const std::vector<std::vector<Parameter>>& yaml,
                             const std::vector<Parameter>& typed,
                             const std::vector<Parameter>& raw) {
  std::vector<Parameter> out;
  auto put = [&out](const Parameter& p) {
    auto same =
        std::find_if(out.begin(), out.end(), [&](const Parameter& q) { return q.name == p.name; });
    if (same == out.end()) {
      out.push_back(p);
    } else {
      same->python = p.python;
      same->value = p.value;
    }
  };
  for (const auto& group : yaml) {
    std::for_each(group.begin(), group.end(), put);
  }
  std::for_each(typed.begin(), typed.end(), put);
  std::for_each(raw.begin(), raw.end(), put);
  return out;
}

}  // namespace cellgate::notebooks::parameters
