// papermill's -p / -r / -y and its PythonTranslator (see parameters.hpp). -y is read by yaml.cpp
// (libyaml, composed as PyYAML's safe_load); values are rendered to Python text here.
#include "cellgate/notebooks/parameters.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "yaml.hpp"

namespace cellgate::notebooks::parameters {
namespace {

using nlohmann::json;
using notebook::Parameter;
using Kind = yaml::Value::Kind;

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
  std::string digits = without_underscores(s);
  const bool negative = digits[0] == '-';
  digits.erase(0, digits.find_first_not_of("+-0"));
  if (digits.size() > 4300) {
    return std::nullopt;
  }
  if (digits.empty()) {
    return "0";
  }
  return (negative ? "-" : "") + digits;
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

// A decimal int as JSON: exact within 64 bits, else the nearest double (past its range, null).
json int_json(const std::string& decimal) {
  json v = json::parse(decimal, nullptr, false);
  if (v.is_discarded() || !v.is_number()) {
    const double d = std::strtod(decimal.c_str(), nullptr);
    return std::isfinite(d) ? json(d) : json();
  }
  return v;
}

// Python's str() of a dict key that is not a string: what papermill's translate_dict writes
// between its double quotes.
std::string python_key(const yaml::Value& key) {
  switch (key.kind) {
    case Kind::kNull:
      return "None";
    case Kind::kBool:
      return key.boolean ? "True" : "False";
    case Kind::kInt:
      return key.text;
    case Kind::kFloat:
      return std::isnan(key.number)   ? "nan"
             : std::isinf(key.number) ? (key.number < 0 ? "-inf" : "inf")
                                      : python_float(key.number);
    default:
      return key.text;
  }
}

// papermill's PythonTranslator.translate. Recurses once per level: yaml::load bounds the depth.
std::string render(const yaml::Value& v) {
  switch (v.kind) {
    case Kind::kNull:
      return "None";
    case Kind::kBool:
      return v.boolean ? "True" : "False";
    case Kind::kInt:
      return v.text;
    case Kind::kFloat:
      return python_float(v.number);
    case Kind::kString:
      return python_str(v.text);
    case Kind::kList: {
      std::string out = "[";
      for (std::size_t i = 0; i < v.items.size(); ++i) {
        out += (i == 0 ? "" : ", ") + render(v.items[i]);
      }
      return out + "]";
    }
    case Kind::kDict:
      break;
  }
  std::string out = "{";
  for (std::size_t i = 0; i < v.entries.size(); ++i) {
    // translate_str(key) for a string key; any other is formatted as it is.
    const auto& [key, value] = v.entries[i];
    out += (i == 0 ? "" : ", ") +
           (key.kind == Kind::kString ? python_str(key.text) : "\"" + python_key(key) + "\"") +
           ": " + render(value);
  }
  return out + "}";
}

// The value as JSON, for metadata.papermill.parameters: what Python's json.dumps writes of the
// dict papermill keeps, except that an int past 64 bits becomes a float and NaN and the
// infinities null (JSON has none of them).
json to_json(const yaml::Value& v) {
  switch (v.kind) {
    case Kind::kNull:
      return json();
    case Kind::kBool:
      return v.boolean;
    case Kind::kInt:
      return int_json(v.text);
    case Kind::kFloat:
      return std::isfinite(v.number) ? json(v.number) : json();
    case Kind::kString:
      return v.text;
    case Kind::kList: {
      json out = json::array();
      for (const auto& item : v.items) {
        out.push_back(to_json(item));
      }
      return out;
    }
    case Kind::kDict:
      break;
  }
  json out = json::object();
  for (const auto& [key, value] : v.entries) {
    // json.dumps writes a key that is not a string as JSON would write the value.
    std::string name = key.kind == Kind::kNull   ? "null"
                       : key.kind == Kind::kBool ? (key.boolean ? "true" : "false")
                       : key.kind == Kind::kFloat && std::isnan(key.number) ? "NaN"
                       : key.kind == Kind::kFloat && std::isinf(key.number)
                           ? (key.number < 0 ? "-Infinity" : "Infinity")
                           : python_key(key);
    out[std::move(name)] = to_json(value);
  }
  return out;
}

bool is_name_start(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

}  // namespace

Result<void> check_name(std::string_view name) {
  // ^[A-Za-z_][A-Za-z0-9_]*$, not a keyword.
  const std::string n(name);
  const bool identifier =
      !n.empty() && is_name_start(n[0]) &&
      std::all_of(n.begin(), n.end(), [](char c) { return is_name_start(c) || is_digit(c); });
  if (!identifier ||
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
  auto loaded = yaml::load(text);
  if (!loaded) {
    return bad("-y: " + loaded.error().message);
  }
  std::vector<Parameter> out;
  if (loaded->kind == Kind::kNull) {
    return out;  // papermill: `yaml.load(...) or {}`
  }
  if (loaded->kind != Kind::kDict) {
    return bad("-y wants a mapping of names to values ('name: value' or {\"name\": value})");
  }
  for (const auto& [key, value] : loaded->entries) {
    if (key.kind != Kind::kString) {
      return bad("-y: the key " + python_key(key) + " is not a Python variable name");
    }
    if (auto ok = check_name(key.text); !ok) {
      return bad("-y: " + ok.error().message);
    }
    out.push_back({key.text, render(value), to_json(value)});
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
