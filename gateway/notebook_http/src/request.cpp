#include "cellgate/notebook_http/request.hpp"

#include <cstdint>

#include "cellgate/http/limits.hpp"
#include "cellgate/http/router.hpp"

namespace cellgate::notebook_http {
namespace {

using nlohmann::ordered_json;

// The next code point of `s` from `i` (advancing it), or -1 for an invalid sequence (one byte
// consumed).
std::int32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  std::size_t len = 0;
  std::int32_t cp = 0;
  std::int32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++i;
    return -1;
  }
  if (i + len > s.size()) {
    ++i;
    return -1;
  }
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return -1;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return -1;
  }
  i += len;
  return cp;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (next_code_point(s, i) < 0) {
      return false;
    }
  }
  return true;
}

void append_u(std::string& out, std::uint32_t unit) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) {
    out += kHex[(unit >> shift) & 0xF];
  }
}

// json.dumps(str) with ensure_ascii: py_encode_basestring_ascii.
void append_string(std::string& out, std::string_view s) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    std::int32_t cp = next_code_point(s, i);
    if (cp < 0) {
      cp = 0xFFFD;
    }
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp >= 0x20 && cp <= 0x7E) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      append_u(out, static_cast<std::uint32_t>(cp));
    } else {
      const auto v = static_cast<std::uint32_t>(cp - 0x10000);
      append_u(out, 0xD800 + (v >> 10));
      append_u(out, 0xDC00 + (v & 0x3FF));
    }
  }
  out += '"';
}

// Iterative (no recursion on a depth the client chose): a stack of containers being written.
void dump_value(std::string& out, const ordered_json& root) {
  struct Frame {
    const ordered_json* value;
    ordered_json::const_iterator it;
    bool first;
  };
  std::vector<Frame> stack;
  auto write_scalar_or_open = [&](const ordered_json& v) {
    if (v.is_object()) {
      out += '{';
      stack.push_back({&v, v.begin(), true});
    } else if (v.is_array()) {
      out += '[';
      stack.push_back({&v, v.begin(), true});
    } else if (v.is_string()) {
      append_string(out, v.get_ref<const std::string&>());
    } else {
      out += v.dump();  // numbers, true, false, null: as Python writes them
    }
  };
  write_scalar_or_open(root);
  while (!stack.empty()) {
    Frame& top = stack.back();
    if (top.it == top.value->end()) {
      out += top.value->is_object() ? '}' : ']';
      stack.pop_back();
      continue;
    }
    if (!top.first) {
      out += ", ";
    }
    top.first = false;
    const auto it = top.it++;
    if (top.value->is_object()) {
      append_string(out, it.key());
      out += ": ";
    }
    write_scalar_or_open(*it);  // may push: `top` is not used after this
  }
}

Error not_utf8(const std::string& what) {
  return Error{ErrorCode::kInvalidArgument, "bad_request", what + " is not UTF-8"};
}

// Tornado's latin1 reading of a header's bytes, as UTF-8.
std::string latin1_to_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x80) {
      out += c;
    } else {
      out += static_cast<char>(0xC0 | (b >> 6));
      out += static_cast<char>(0x80 | (b & 0x3F));
    }
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return out;
}

// A header parameter (`boundary=…`, `name="…"`) of a value such as a Content-Type or a
// Content-Disposition; "" when absent.
std::string header_param(std::string_view value, std::string_view name) {
  std::size_t pos = value.find(';');
  while (pos != std::string_view::npos) {
    std::size_t start = pos + 1;
    while (start < value.size() && value[start] == ' ') {
      ++start;
    }
    const std::size_t next = value.find(';', start);
    std::string_view item = value.substr(start, next - start);
    const std::size_t eq = item.find('=');
    if (eq != std::string_view::npos && lower(item.substr(0, eq)) == name) {
      std::string_view v = item.substr(eq + 1);
      while (!v.empty() && v.back() == ' ') {
        v.remove_suffix(1);
      }
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
        v = v.substr(1, v.size() - 2);
      }
      return std::string(v);
    }
    pos = next;
  }
  return "";
}

// Tornado's parse_multipart_form_data: the fields of non-file parts, {name: [values]}.
Result<ordered_json> parse_multipart(std::string_view content_type, std::string_view body) {
  ordered_json fields = ordered_json::object();
  const std::string boundary = header_param(content_type, "boundary");
  if (boundary.empty()) {
    return fields;  // Tornado logs "Invalid multipart/form-data" and parses nothing
  }
  const std::string delimiter = "--" + boundary;
  std::size_t end = body.rfind(delimiter + "--");
  if (end == std::string_view::npos) {
    return fields;
  }
  std::string_view rest = body.substr(0, end);
  std::size_t parts = 0;
  for (std::size_t pos = rest.find(delimiter); pos != std::string_view::npos;) {
    const std::size_t start = pos + delimiter.size();
    const std::size_t next = rest.find(delimiter, start);
    std::string_view part = rest.substr(start, next - start);
    pos = next;
    if (++parts > kMaxFormParts) {
      break;
    }
    if (part.starts_with("\r\n")) {
      part.remove_prefix(2);
    }
    const std::size_t head_end = part.find("\r\n\r\n");
    if (head_end == std::string_view::npos || !part.ends_with("\r\n")) {
      continue;  // Tornado: "multipart/form-data missing headers"
    }
    std::string_view head = part.substr(0, head_end);
    std::string_view value = part.substr(head_end + 4, part.size() - head_end - 6);
    std::string disposition;
    for (std::size_t line = 0; line <= head.size();) {
      const std::size_t eol = std::min(head.find("\r\n", line), head.size());
      std::string_view h = head.substr(line, eol - line);
      if (const std::size_t colon = h.find(':');
          colon != std::string_view::npos && lower(h.substr(0, colon)) == "content-disposition") {
        disposition = std::string(h.substr(colon + 1));
      }
      line = eol + 2;
    }
    const std::size_t first = disposition.find_first_not_of(' ');
    if (first == std::string::npos || lower(disposition.substr(first, 9)) != "form-data") {
      continue;
    }
    const std::string name = header_param(disposition, "name");
    if (name.empty() || disposition.find("filename") != std::string::npos) {
      continue;  // a file: Tornado puts it in request.files, which REQUEST does not carry
    }
    if (!valid_utf8(name) || !valid_utf8(value)) {
      return not_utf8("a form field");
    }
    fields[name].push_back(std::string(value));
  }
  return fields;
}

}  // namespace

std::string python_json(const ordered_json& value) {
  std::string out;
  dump_value(out, value);
  return out;
}

Result<ordered_json> parse_query(std::string_view query) {
  ordered_json args = ordered_json::object();
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.empty()) {
      continue;
    }
    const std::size_t eq = item.find('=');
    std::string name = http::percent_decode(item.substr(0, eq), true);
    std::string value =
        eq == std::string_view::npos ? "" : http::percent_decode(item.substr(eq + 1), true);
    if (!valid_utf8(name) || !valid_utf8(value)) {
      return not_utf8("the query string");
    }
    args[name].push_back(std::move(value));
  }
  return args;
}

Result<ordered_json> parse_body(std::string_view content_type, std::string_view body) {
  if (!valid_utf8(body)) {
    return not_utf8("the body");
  }
  if (content_type == "application/x-www-form-urlencoded") {
    return parse_query(body);
  }
  if (content_type.starts_with("multipart/form-data")) {
    return parse_multipart(content_type, body);
  }
  if (content_type == "application/json") {
    if (http::check_json_depth(body, kMaxBodyJsonDepth)) {
      ordered_json parsed = ordered_json::parse(body, nullptr, false);
      if (!parsed.is_discarded()) {
        return parsed;
      }
    }
  }
  return ordered_json(std::string(body));
}

std::string header_case(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  bool word_start = true;
  for (char c : name) {
    if (c == '-') {
      out += c;
      word_start = true;
      continue;
    }
    if (c >= 'a' && c <= 'z' && word_start) {
      c = static_cast<char>(c - 'a' + 'A');
    } else if (c >= 'A' && c <= 'Z' && !word_start) {
      c = static_cast<char>(c - 'A' + 'a');
    }
    out += c;
    word_start = false;
  }
  return out;
}

Result<ordered_json> request_bundle(
    const http::Request& req, const std::vector<std::pair<std::string, std::string>>& params) {
  const std::string_view target(req.target().data(), req.target().size());
  const std::size_t q = target.find('?');
  const std::string_view query = q == std::string_view::npos ? "" : target.substr(q + 1);
  std::string_view content_type = "text/plain";
  if (auto it = req.find(http::Field::content_type); it != req.end()) {
    content_type = std::string_view(it->value().data(), it->value().size());
  }
  ordered_json bundle = ordered_json::object();
  CELLGATE_ASSIGN_OR_RETURN(bundle["body"], parse_body(content_type, req.body()));
  CELLGATE_ASSIGN_OR_RETURN(bundle["args"], parse_query(query));
  ordered_json path = ordered_json::object();
  for (const auto& [name, value] : params) {
    if (!valid_utf8(value)) {
      return not_utf8("the path parameter " + name);
    }
    path[name] = value;
  }
  bundle["path"] = std::move(path);
  ordered_json headers = ordered_json::object();
  for (const auto& field : req) {
    const std::string name =
        header_case(std::string_view(field.name_string().data(), field.name_string().size()));
    std::string value =
        latin1_to_utf8(std::string_view(field.value().data(), field.value().size()));
    auto it = headers.find(name);
    if (it == headers.end()) {
      headers[name] = std::move(value);
    } else if (it->is_array()) {
      it->push_back(std::move(value));
    } else {
      *it = ordered_json::array({*it, std::move(value)});
    }
  }
  bundle["headers"] = std::move(headers);
  return bundle;
}

std::string request_code(const ordered_json& bundle, std::string_view language) {
  const std::string literal = python_json(ordered_json(python_json(bundle)));
  std::string lang = lower(language);
  return (lang == "perl" ? "my $REQUEST = " : "REQUEST = ") + literal;
}

}  // namespace cellgate::notebook_http
