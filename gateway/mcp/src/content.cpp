#include "content.hpp"

#include <set>

#include "cellgate/protocol/message.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::mcp {
namespace {

using nlohmann::json;

// Image mime types an MCP client shows as images (ImageContent). SVG and PDF stay artifacts.
constexpr const char* kImageMimes[] = {"image/png", "image/jpeg", "image/gif"};
// The mime type the kernel's display formatters give a figure's data under (E2B's chart
// format), beside its PNG.
constexpr const char* kChartMime = "application/vnd.cellgate.chart+json";

// nbformat's multiline strings: a string or a list of strings (kernel data; anything else is
// absent).
std::string join_text(const json& v) {
  if (v.is_string()) {
    return v.get<std::string>();
  }
  std::string out;
  if (v.is_array()) {
    for (const auto& part : v) {
      if (part.is_string()) {
        out += part.get<std::string>();
      }
    }
  }
  return out;
}

// Base64 as MCP wants it: no line breaks (Jupyter may wrap at 76 columns).
std::string compact_base64(const json& v) {
  std::string s = join_text(v);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c != '\n' && c != '\r' && c != ' ') {
      out += c;
    }
  }
  return out;
}

json text_item(std::string text) {
  return json{{"type", "text"}, {"text", std::move(text)}};
}

void end_line(std::string& buf) {
  if (!buf.empty() && buf.back() != '\n') {
    buf += '\n';
  }
}

// Appends the content items of one run in output order, gathering text between images.
class ContentBuilder {
 public:
  void text(const std::string& s) { buf_ += s; }
  void line(const std::string& s) {
    end_line(buf_);
    buf_ += s;
    end_line(buf_);
  }
  void image(const std::string& mime, std::string data) {
    flush();
    items_.push_back(json{{"type", "image"}, {"data", std::move(data)}, {"mimeType", mime}});
  }
  void chart(const json& chart) {
    std::string key = protocol::dump_json(chart);
    if (!charts_seen_.insert(key).second) {
      return;
    }
    charts_.push_back(chart);
    line("[chart] " + key);
  }
  json finish() {
    flush();
    if (items_.empty()) {
      items_.push_back(text_item("(no output)"));
    }
    return std::move(items_);
  }
  const json& charts() const { return charts_; }

 private:
  void flush() {
    if (!buf_.empty()) {
      items_.push_back(text_item(std::move(buf_)));
      buf_.clear();
    }
  }
  std::string buf_;
  json items_ = json::array();
  json charts_ = json::array();
  std::set<std::string> charts_seen_;
};

std::string traceback_text(const json& error) {
  std::string tb;
  if (auto t = error.find("traceback"); t != error.end() && t->is_array()) {
    for (const auto& line : *t) {
      if (line.is_string()) {
        tb += strip_ansi(line.get<std::string>());
        end_line(tb);
      }
    }
  }
  if (tb.empty()) {
    tb = error.value("ename", std::string("Error")) + ": " + error.value("evalue", std::string());
  }
  return tb;
}

// A chart another part of the answer carries: one object, or a list of them.
void add_charts(ContentBuilder& b, const json& v) {
  if (v.is_object()) {
    b.chart(v);
  } else if (v.is_array()) {
    for (const auto& c : v) {
      if (c.is_object()) {
        b.chart(c);
      }
    }
  }
}

// A CellError's traceback, as traceback_text does an error output's.
std::string traceback_text(const execute::CellError& error) {
  std::string tb;
  for (const auto& line : error.traceback) {
    tb += strip_ansi(line);
    end_line(tb);
  }
  if (tb.empty()) {
    tb = (error.ename.empty() ? std::string("Error") : error.ename) + ": " + error.evalue;
  }
  return tb;
}

std::string status_line(const execute::CellResult& answer) {
  using execute::CellStatus;
  std::string message = answer.message;
  if (message.empty()) {
    if (answer.status == CellStatus::kTimeout) {
      message = "the cell ran past its timeout and was interrupted";
    } else if (answer.status == CellStatus::kAborted) {
      message = "the cell was cancelled";
    } else if (answer.status == CellStatus::kDead) {
      message = "the kernel died; restart_session starts it again (its state is lost)";
    }
  }
  return "[" + answer.status_name() + "]" + (message.empty() ? "" : " " + message);
}

}  // namespace

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  const auto n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) {
      return false;
    }
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) {
        return false;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 (RFC 3629 section 3).
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

json run_code_result(const execute::CellResult& answer, const RunInfo& info,
                     const std::string& artifact_base) {
  using execute::CellStatus;
  const std::string status = answer.status_name();
  ContentBuilder b;
  if (!info.note.empty()) {
    b.line("[note] " + info.note);
  }
  const std::optional<execute::CellError>& error = answer.error;
  bool error_shown = false;
  for (const auto& out : answer.outputs) {
    if (!out.is_object()) {
      continue;
    }
    const std::string type = out.value("output_type", std::string());
    if (type == "stream") {
      b.text(join_text(out.value("text", json())));
    } else if (type == "execute_result" || type == "display_data") {
      const json data = out.value("data", json::object());
      bool imaged = false;
      if (data.is_object()) {
        for (const char* mime : kImageMimes) {
          if (auto it = data.find(mime); it != data.end()) {
            std::string b64 = compact_base64(*it);
            if (!b64.empty()) {
              b.image(mime, std::move(b64));
              imaged = true;
            }
          }
        }
        // A figure's text/plain ("<Figure size 640x480 with 1 Axes>") says nothing the
        // image does not.
        if (!imaged) {
          if (auto plain = data.find("text/plain"); plain != data.end()) {
            b.line(join_text(*plain));
          }
        }
      }
      // A figure's data, from the kernel's display formatters (kernels/display_formatters):
      // right after its picture.
      if (data.is_object()) {
        if (auto chart = data.find(kChartMime); chart != data.end()) {
          add_charts(b, *chart);
        }
      }
      if (auto chart = out.find("chart"); chart != out.end()) {
        add_charts(b, *chart);
      }
    } else if (type == "error") {
      b.line(error ? traceback_text(*error) : traceback_text(out));
      error_shown = true;
    }
  }
  if (error && !error_shown) {
    b.line(traceback_text(*error));
  }
  for (const auto& a : answer.artifacts) {
    if (a.is_object() && a.contains("chart")) {
      add_charts(b, a["chart"]);
    }
  }
  add_charts(b, answer.charts);
  for (const auto& n : answer.notices) {
    b.line("[notice] " + n);
  }
  if (answer.status != CellStatus::kOk && answer.status != CellStatus::kError) {
    b.line(status_line(answer));
  }
  if (answer.state_lost) {
    b.line("[state_lost] the kernel was restarted: variables and imports are gone");
  }

  json structured = {{"session", info.session},   {"kernel_id", info.kernel_id},
                     {"kernel", info.kernelspec}, {"new_session", info.new_session},
                     {"status", status},          {"state_lost", answer.state_lost}};
  structured["execution_count"] = answer.execution_count ? json(*answer.execution_count) : json();
  structured["stdout"] = answer.stdout_text;
  structured["stderr"] = answer.stderr_text;
  structured["result"] = nullptr;
  if (answer.result && answer.result->is_object() && answer.result->contains("text/plain")) {
    structured["result"] = join_text((*answer.result)["text/plain"]);
  }
  structured["error"] = nullptr;
  if (error) {
    json e = {{"ename", error->ename}, {"evalue", error->evalue}};
    if (error->line > 0) {
      e["line"] = error->line;
    }
    structured["error"] = std::move(e);
  }
  json artifacts = json::array();
  for (const auto& a : answer.artifacts) {
    if (!a.is_object()) {
      continue;
    }
    json record = a;
    if (!artifact_base.empty() && a.contains("sha256") && a["sha256"].is_string()) {
      // The kernel-scoped URL when the kernel is known: its id routes to the node that stored
      // the artifact (docs/scale-out.md).
      constexpr std::string_view kTail = "artifacts/";
      const std::string sha = a["sha256"].get<std::string>();
      const bool scoped =
          a.contains("kernel_id") && a["kernel_id"].is_string() &&
          artifact_base.size() >= kTail.size() &&
          artifact_base.compare(artifact_base.size() - kTail.size(), kTail.size(), kTail) == 0;
      record["url"] = scoped
                          ? artifact_base.substr(0, artifact_base.size() - kTail.size()) +
                                "kernels/" + a["kernel_id"].get<std::string>() + "/artifacts/" + sha
                          : artifact_base + sha;
    }
    artifacts.push_back(std::move(record));
  }
  structured["artifacts"] = std::move(artifacts);
  structured["files"] = answer.files_json();
  structured["notices"] = answer.notices;
  // DataFrames as data (the display formatters' other mime type), as the agent API gives them.
  if (!answer.data.empty()) {
    structured["data"] = answer.data;
  }
  structured["truncated"] = answer.truncated_json();
  structured["metrics"] = answer.metrics_json();
  if (!answer.message.empty()) {
    structured["message"] = answer.message;
  }

  json content = b.finish();
  if (!b.charts().empty()) {
    structured["charts"] = b.charts();
  }
  return json{{"content", std::move(content)},
              {"structuredContent", std::move(structured)},
              {"isError", status != "ok"}};
}

json text_result(const std::string& text, bool is_error, json structured) {
  json r = {{"content", json::array({text_item(text)})}, {"isError", is_error}};
  if (!structured.is_null()) {
    r["structuredContent"] = std::move(structured);
  }
  return r;
}

json file_result(const std::string& path, const std::string& bytes, json structured) {
  auto dot = path.rfind('.');
  std::string ext = dot == std::string::npos ? "" : path.substr(dot + 1);
  for (auto& c : ext) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  std::string image_mime;
  if (ext == "png") {
    image_mime = "image/png";
  } else if (ext == "jpg" || ext == "jpeg") {
    image_mime = "image/jpeg";
  } else if (ext == "gif") {
    image_mime = "image/gif";
  }
  json item;
  if (!image_mime.empty()) {
    item = {{"type", "image"}, {"data", base64_encode(bytes)}, {"mimeType", image_mime}};
    structured["encoding"] = "base64";
  } else if (valid_utf8(bytes)) {
    item = text_item(bytes);
    structured["encoding"] = "text";
  } else {
    // Binary: an embedded resource (its uri names the file; nothing resolves it but the reader).
    item = {{"type", "resource"},
            {"resource",
             {{"uri", "cellgate:" + path},
              {"mimeType", "application/octet-stream"},
              {"blob", base64_encode(bytes)}}}};
    structured["encoding"] = "base64";
  }
  return json{{"content", json::array({std::move(item)})},
              {"structuredContent", std::move(structured)},
              {"isError", false}};
}

}  // namespace cellgate::mcp
