// E2B code-interpreter protocol translations; see cellgate/server/e2b.hpp and docs/e2b.md.
#include "cellgate/api/e2b.hpp"

#include <cctype>
#include <string>
#include <string_view>
#include <utility>

#include "cellgate/http/limits.hpp"
#include "cellgate/kernels/display_formatters.hpp"

namespace cellgate::api::e2b {
namespace {

using nlohmann::json;

Error invalid(std::string reason, std::string message) {
  return make_error(ErrorCode::kInvalidArgument, std::move(reason), std::move(message));
}

// The body as a JSON object; an empty body (POST /contexts/{id}/restart sends none) is {}.
Result<json> parse_object(std::string_view body) {
  const auto first = body.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) {
    return json::object();
  }
  // Before the DOM: a body of nested '[' costs ~64 bytes of nodes per byte of text.
  if (auto shallow = http::check_json_depth(body); !shallow) {
    return invalid("bad_json", shallow.error().message);
  }
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return invalid("bad_json", "the request body is not valid JSON");
  }
  if (!parsed.is_object()) {
    return invalid("bad_json", "the request body must be a JSON object");
  }
  return parsed;
}

// E2B's normalize_language: absent or null is python; otherwise lower-cased and trimmed, with
// E2B's two short names. Whether a kernel runs it is E2bApi's question (the kernelspecs).
Result<std::string> parse_language(const json& body) {
  auto it = body.find("language");
  if (it == body.end() || it->is_null()) {
    return std::string(kLanguage);
  }
  if (!it->is_string()) {
    return invalid("unsupported_language", "\"language\" must be a string");
  }
  const std::string& given = it->get_ref<const std::string&>();
  std::string language;
  const auto begin = given.find_first_not_of(" \t\r\n");
  const auto end = given.find_last_not_of(" \t\r\n");
  if (begin != std::string::npos) {
    language = given.substr(begin, end - begin + 1);
  }
  for (auto& c : language) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (language.empty()) {
    return std::string(kLanguage);
  }
  if (language == "js") {
    return std::string("javascript");
  }
  if (language == "ts") {
    return std::string("typescript");
  }
  return language;
}

// os.environ refuses these (ValueError: illegal environment variable name / embedded null).
Result<void> check_env_var(const std::string& name, const std::string& value) {
  if (name.empty() || name.find('=') != std::string::npos || name.find('\0') != std::string::npos) {
    return invalid("bad_env_vars", "environment variable name '" + name +
                                       "' is not allowed: it must be non-empty, no '=' or NUL");
  }
  if (value.find('\0') != std::string::npos) {
    return invalid("bad_env_vars",
                   "the value of environment variable '" + name + "' contains a NUL character");
  }
  return ok_result();
}

// ASCII-only JSON; invalid UTF-8 becomes U+FFFD instead of throwing.
std::string dump_ascii(const json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
}

// A Python expression whose value is the JSON value `value`: json.loads of a string literal.
// The literal is the JSON text dumped again as a JSON string; that text is ASCII, so the literal
// holds only printable ASCII with \" and \\ escapes, which Python reads exactly as JSON does.
std::string python_json_value(const json& value) {
  return "__import__(\"json\").loads(" + dump_ascii(json(dump_ascii(value))) + ")";
}

json env_object(const std::map<std::string, std::string>& vars) {
  json object = json::object();
  for (const auto& [name, value] : vars) {
    object[name] = value;
  }
  return object;
}

// Where env_code() keeps the previous values between the two silent runs: an attribute of the
// os module, so nothing appears in the user's namespace.
constexpr std::string_view kSavedAttr = "_cellgate_e2b_saved_env";

std::string stripped_text(const std::string& text) {
  // E2B's server (template/server/api/models/result.py) drops one pair of enclosing quotes from
  // text/plain, so a string's repr 'abc' reads as abc in Execution.text.
  if (text.size() >= 2 && ((text.front() == '\'' && text.back() == '\'') ||
                           (text.front() == '"' && text.back() == '"'))) {
    return text.substr(1, text.size() - 2);
  }
  return text;
}

json result_line(const json& event, bool is_main_result) {
  // MIME type → the field of the SDK's Result (code-interpreter dist/index.mjs, class Result).
  static constexpr std::pair<std::string_view, std::string_view> kFields[] = {
      {"text/html", "html"},
      {"text/markdown", "markdown"},
      {"image/svg+xml", "svg"},
      {"image/png", "png"},
      {"image/jpeg", "jpeg"},
      {"application/pdf", "pdf"},
      {"text/latex", "latex"},
      {"application/json", "json"},
      {"application/javascript", "javascript"},
      {"e2b/data", "data"},
      {"e2b/chart", "chart"},
      // The kernel's display formatters (kernels/display_formatters.hpp): E2B's formats.
      {kernels::kDataMime, "data"},
      {kernels::kChartMime, "chart"},
  };
  json line = {{"type", "result"}};
  json extra = json::object();
  const json empty = json::object();
  const json& data = event.contains("data") && event["data"].is_object() ? event["data"] : empty;
  for (const auto& [mime, value] : data.items()) {
    if (mime == "text/plain") {
      line["text"] = value.is_string() ? json(stripped_text(value.get<std::string>())) : value;
      continue;
    }
    bool known = false;
    for (const auto& [known_mime, field] : kFields) {
      if (mime == known_mime) {
        line[std::string(field)] = value;
        known = true;
        break;
      }
    }
    if (!known) {
      extra[mime] = value;
    }
  }
  if (!extra.empty()) {
    line["extra"] = std::move(extra);
  }
  line["is_main_result"] = is_main_result;
  return line;
}

std::string string_field(const json& object, const char* key) {
  if (!object.is_object()) {
    return {};
  }
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// E2B's ExecutionError.traceback is one string (E2B's server joins the kernel's list).
std::string traceback_text(const json& traceback) {
  if (traceback.is_string()) {
    return traceback.get<std::string>();
  }
  std::string text;
  if (traceback.is_array()) {
    for (const auto& line : traceback) {
      if (!line.is_string()) {
        continue;
      }
      if (!text.empty()) {
        text += '\n';
      }
      text += line.get<std::string>();
    }
  }
  return text;
}

json error_line(std::string name, std::string value, std::string traceback) {
  return {{"type", "error"},
          {"name", std::move(name)},
          {"value", std::move(value)},
          {"traceback", std::move(traceback)}};
}

json kernel_error_line(const json& error) {
  return error_line(string_field(error, "ename"), string_field(error, "evalue"),
                    traceback_text(error.is_object() ? error.value("traceback", json()) : json()));
}

std::string with_state_note(std::string message, bool state_lost) {
  if (state_lost) {
    if (!message.empty() && message.back() != '.') {
      message += '.';
    }
    message += (message.empty() ? "" : " ");
    message += "The context's state (variables, imports) is lost.";
  }
  return message;
}

}  // namespace

Result<RunCodeRequest> parse_run_code_request(std::string_view body) {
  CELLGATE_ASSIGN_OR_RETURN(json object, parse_object(body));
  RunCodeRequest request;

  auto code = object.find("code");
  if (code == object.end() || !code->is_string()) {
    return invalid("bad_code", "\"code\" is required and must be a string");
  }
  request.code = code->get<std::string>();

  if (auto id = object.find("context_id"); id != object.end() && !id->is_null()) {
    if (!id->is_string() || id->get_ref<const std::string&>().empty()) {
      return invalid("bad_context_id", "\"context_id\" must be a non-empty string");
    }
    request.context_id = id->get<std::string>();
  }

  const bool language_given = object.contains("language") && !object["language"].is_null();
  CELLGATE_ASSIGN_OR_RETURN(request.language, parse_language(object));
  if (language_given && request.context_id) {
    return invalid("context_and_language", "give either \"context_id\" or \"language\", not both");
  }

  if (auto env = object.find("env_vars"); env != object.end() && !env->is_null()) {
    if (!env->is_object()) {
      return invalid("bad_env_vars", "\"env_vars\" must be an object of strings");
    }
    for (const auto& [name, value] : env->items()) {
      if (!value.is_string()) {
        return invalid("bad_env_vars",
                       "the value of environment variable '" + name + "' must be a string");
      }
      CELLGATE_TRY(check_env_var(name, value.get_ref<const std::string&>()));
      request.env_vars[name] = value.get<std::string>();
    }
  }
  return request;
}

Result<CreateContextRequest> parse_create_context_request(std::string_view body) {
  CELLGATE_ASSIGN_OR_RETURN(json object, parse_object(body));
  CreateContextRequest request;
  CELLGATE_ASSIGN_OR_RETURN(request.language, parse_language(object));
  if (auto cwd = object.find("cwd"); cwd != object.end() && !cwd->is_null()) {
    if (!cwd->is_string()) {
      return invalid("bad_cwd", "\"cwd\" must be a string");
    }
    const std::string& path = cwd->get_ref<const std::string&>();
    if (!path.empty()) {  // E2B: `request.cwd or default`
      if (path.front() != '/' || path.find('\0') != std::string::npos) {
        return invalid("bad_cwd", "\"cwd\" must be an absolute path, got '" + path + "'");
      }
      request.cwd = path;
    }
  }
  return request;
}

json context_model(const std::string& id, const std::string& language, const std::string& cwd) {
  return {{"id", id}, {"language", language}, {"cwd", cwd}};
}

std::string request_token(std::string_view x_access_token, std::string_view authorization) {
  if (!x_access_token.empty()) {
    return std::string(x_access_token);
  }
  const auto space = authorization.find(' ');
  if (space == std::string_view::npos) {
    return {};
  }
  std::string scheme(authorization.substr(0, space));
  for (auto& c : scheme) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (scheme != "token" && scheme != "bearer") {
    return {};
  }
  std::string_view token = authorization.substr(space + 1);
  const auto begin = token.find_first_not_of(' ');
  return begin == std::string_view::npos ? std::string() : std::string(token.substr(begin));
}

std::string env_code(const std::map<std::string, std::string>& vars) {
  if (vars.empty()) {
    return {};
  }
  std::string code = "def _cellgate_e2b_env_set(env):\n";
  code += "    import os\n";
  code += "    os." + std::string(kSavedAttr) + " = {k: os.environ.get(k) for k in env}\n";
  code += "    os.environ.update(env)\n";
  code += "_cellgate_e2b_env_set(" + python_json_value(env_object(vars)) + ")\n";
  code += "del _cellgate_e2b_env_set\n";
  return code;
}

std::string env_restore_code(const std::map<std::string, std::string>& vars) {
  if (vars.empty()) {
    return {};
  }
  json names = json::array();
  for (const auto& entry : vars) {
    names.push_back(entry.first);
  }
  std::string code = "def _cellgate_e2b_env_restore(names):\n";
  code += "    import os\n";
  code += "    saved = os.__dict__.pop(\"" + std::string(kSavedAttr) + "\", None)\n";
  code += "    if saved is None:\n";
  code += "        saved = dict.fromkeys(names)\n";
  code += "    for k, v in saved.items():\n";
  code += "        if v is None:\n";
  code += "            os.environ.pop(k, None)\n";
  code += "        else:\n";
  code += "            os.environ[k] = v\n";
  code += "_cellgate_e2b_env_restore(" + python_json_value(names) + ")\n";
  code += "del _cellgate_e2b_env_restore\n";
  return code;
}

std::optional<std::string> context_setup_code(const std::string& language, const std::string& cwd) {
  if (language == "python") {
    // In a function, so no name is left in the user's namespace.
    return "def _cellgate_e2b_context(cwd):\n"
           "    import os, sys\n"
           "    os.makedirs(cwd, exist_ok=True)\n"
           "    os.chdir(cwd)\n"
           "    display = sys.modules.get(\"_cellgate_display\")\n"
           "    if display is not None:\n"
           "        display.display_saved_images = True\n"
           "_cellgate_e2b_context(" +
           python_json_value(json(cwd)) +
           ")\n"
           "del _cellgate_e2b_context\n";
  }
  if (language == "r") {
    // R reads JSON's string escapes (\", \\, \n, \uXXXX) as its own; the text is ASCII.
    const std::string path = dump_ascii(json(cwd));
    return "local({ dir.create(" + path + ", recursive = TRUE, showWarnings = FALSE); setwd(" +
           path + ") })\n";
  }
  return std::nullopt;
}

std::vector<json> Translator::translate(const json& event) {
  std::vector<json> lines;
  const std::string type = string_field(event, "type");
  if (type == "stream") {
    const std::string name = string_field(event, "name");
    if (name == "stdout" || name == "stderr") {
      lines.push_back({{"type", name}, {"text", string_field(event, "text")}});
    }
  } else if (type == "execute_result") {
    lines.push_back(result_line(event, true));
  } else if (type == "display_data" || type == "update_display_data") {
    lines.push_back(result_line(event, false));
  } else if (type == "error") {
    lines.push_back(kernel_error_line(event));
    error_sent_ = true;
  } else if (type == "notice") {
    // Not an output of the cell but something the agent should read: an output cap reached, ...
    lines.push_back(
        {{"type", "stderr"}, {"text", "[cellgate] " + string_field(event, "message") + "\n"}});
  } else if (type == "keepalive") {
    lines.push_back({{"type", "keepalive"}});
  } else if (type == "end") {
    // A gateway's answer read back as a CellResult; one without a status ends as "no status".
    execute::CellResult answer;
    answer.status = execute::CellStatus::kOther;
    if (auto it = event.find("answer"); it != event.end()) {
      if (auto parsed = execute::CellResult::from_json(*it)) {
        answer = std::move(parsed).value();
      }
    }
    return end(answer);
  }
  return lines;
}

std::vector<json> Translator::end(const execute::CellResult& answer) {
  using execute::CellStatus;
  std::vector<json> lines;
  // The executor's message, else ours (with a word on lost state).
  auto say = [&](const std::string& fallback) {
    return answer.message.empty() ? with_state_note(fallback, answer.state_lost) : answer.message;
  };
  switch (answer.status) {
    case CellStatus::kOk:
      break;
    case CellStatus::kTimeout:
      lines.push_back(error_line("TimeoutError", say("the cell ran past its timeout"), ""));
      break;
    case CellStatus::kDead:
      lines.push_back(
          error_line("DeadKernelError", say("the kernel died while running the cell"), ""));
      break;
    case CellStatus::kAborted:
      lines.push_back(error_line("ExecutionAborted", say("Execution was aborted"), ""));
      break;
    case CellStatus::kError:
      if (error_sent_) {
        // The kernel's error line went out already.
      } else if (answer.error && !answer.error->ename.empty()) {
        std::string traceback;
        for (const auto& line : answer.error->traceback) {
          traceback += (traceback.empty() ? "" : "\n") + line;
        }
        lines.push_back(error_line(answer.error->ename, answer.error->evalue, traceback));
      } else {
        lines.push_back(error_line("ExecutionError", say("the cell failed"), ""));
      }
      break;
    case CellStatus::kOther:
      lines.push_back(error_line("ExecutionError",
                                 say(answer.other_status.empty() ? "the cell ended without a status"
                                                                 : "the cell ended with status '" +
                                                                       answer.other_status + "'"),
                                 ""));
      break;
  }
  if (!lines.empty()) {
    error_sent_ = true;
  }
  if (answer.execution_count) {
    lines.push_back(
        {{"type", "number_of_executions"}, {"execution_count", *answer.execution_count}});
  }
  lines.push_back({{"type", "end_of_execution"}});
  return lines;
}

std::vector<json> translate(const json& event) {
  return Translator{}.translate(event);
}

std::string ndjson_line(const json& object) {
  return dump_ascii(object) + "\n";
}

}  // namespace cellgate::api::e2b
