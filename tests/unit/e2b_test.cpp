// Unit tests of the E2B code-interpreter translations (cellgate/server/e2b.hpp): request bodies
// as @e2b/code-interpreter 2.8.0 sends them, execution events to the NDJSON lines its
// parseOutput() reads (docs/e2b.md), and the env-var Python run by /usr/bin/python3.
#include "cellgate/api/e2b.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/result.hpp"

namespace cellgate::api::e2b {
namespace {

using nlohmann::json;

// ---- POST /execute ---------------------------------------------------------------------------

TEST(E2bRunCode, DefaultsAsTheSdkSendsThem) {
  // runCode("x") with no options: JSON.stringify drops the undefined fields.
  auto r = parse_run_code_request(R"({"code":"x"})");
  ASSERT_TRUE(r.ok()) << r.error().describe();
  EXPECT_EQ(r->code, "x");
  EXPECT_FALSE(r->context_id.has_value());
  EXPECT_EQ(r->language, "python");
  EXPECT_TRUE(r->env_vars.empty());
}

TEST(E2bRunCode, ContextIdEnvVarsAndNulls) {
  auto r = parse_run_code_request(
      R"({"code":"","context_id":"k-1","language":null,"env_vars":{"A":"1","B":"x\ny"},"extra":1})");
  ASSERT_TRUE(r.ok()) << r.error().describe();
  EXPECT_EQ(r->code, "");
  EXPECT_EQ(r->context_id, "k-1");
  EXPECT_EQ(r->language, "python");
  EXPECT_EQ(r->env_vars, (std::map<std::string, std::string>{{"A", "1"}, {"B", "x\ny"}}));

  auto nulls = parse_run_code_request(R"({"code":"1","context_id":null,"env_vars":null})");
  ASSERT_TRUE(nulls.ok()) << nulls.error().describe();
  EXPECT_FALSE(nulls->context_id.has_value());
}

TEST(E2bRunCode, LanguageIsNormalisedAsE2bDoes) {
  for (const char* body :
       {R"({"code":"1","language":"python"})", R"({"code":"1","language":" Python "})",
        R"({"code":"1","language":""})"}) {
    auto r = parse_run_code_request(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.error().describe();
    EXPECT_EQ(r->language, "python");
  }
}

void expect_invalid(std::string_view body, const std::string& reason) {
  auto r = parse_run_code_request(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << body;
  EXPECT_EQ(r.error().reason, reason) << body << ": " << r.error().message;
  EXPECT_FALSE(r.error().message.empty());
}

TEST(E2bRunCode, Errors) {
  expect_invalid("", "bad_code");  // an empty body is {}: no code
  expect_invalid("{", "bad_json");
  expect_invalid("[1]", "bad_json");
  expect_invalid(R"("code")", "bad_json");
  expect_invalid(R"({})", "bad_code");
  expect_invalid(R"({"code":1})", "bad_code");
  expect_invalid(R"({"code":null})", "bad_code");
  expect_invalid(R"({"code":"1","context_id":7})", "bad_context_id");
  expect_invalid(R"({"code":"1","context_id":""})", "bad_context_id");
  expect_invalid(R"({"code":"1","language":3})", "unsupported_language");
  expect_invalid(R"({"code":"1","context_id":"k","language":"python"})", "context_and_language");
  expect_invalid(R"({"code":"1","env_vars":["A"]})", "bad_env_vars");
  expect_invalid(R"({"code":"1","env_vars":"A=1"})", "bad_env_vars");
  expect_invalid(R"({"code":"1","env_vars":{"A":1}})", "bad_env_vars");
  expect_invalid(R"({"code":"1","env_vars":{"A":null}})", "bad_env_vars");
  expect_invalid(R"({"code":"1","env_vars":{"":"x"}})", "bad_env_vars");
  expect_invalid(R"({"code":"1","env_vars":{"A=B":"x"}})", "bad_env_vars");
  expect_invalid(R"({"code":"1","env_vars":{"A\u0000":"x"}})", "bad_env_vars");
  expect_invalid(R"({"code":"1","env_vars":{"A":"x\u0000y"}})", "bad_env_vars");
}

TEST(E2bRunCode, LanguagesAreNormalizedAsE2bDoes) {
  // Whether a kernel runs it is the routes' question (the installed kernelspecs).
  const std::pair<const char*, const char*> cases[] = {
      {R"({"code":"1","language":" R "})", "r"},
      {R"({"code":"1","language":"Bash"})", "bash"},
      {R"({"code":"1","language":"js"})", "javascript"},
      {R"({"code":"1","language":"TS"})", "typescript"},
      {R"({"code":"1","language":""})", "python"},
      {R"({"code":"1"})", "python"},
  };
  for (const auto& [body, language] : cases) {
    auto r = parse_run_code_request(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.error().describe();
    EXPECT_EQ(r->language, language) << body;
  }
}

// ---- POST /contexts --------------------------------------------------------------------------

TEST(E2bContexts, CreateDefaults) {
  for (const char* body : {"", "  ", "{}", R"({"language":null,"cwd":null})", R"({"cwd":""})"}) {
    auto r = parse_create_context_request(body);
    ASSERT_TRUE(r.ok()) << "'" << body << "': " << r.error().describe();
    EXPECT_EQ(r->language, "python");
    EXPECT_EQ(r->cwd, "/home/user") << "E2B's default";
  }
  auto r = parse_create_context_request(R"({"language":"PYTHON","cwd":"/tmp/a b"})");
  ASSERT_TRUE(r.ok()) << r.error().describe();
  EXPECT_EQ(r->language, "python");
  EXPECT_EQ(r->cwd, "/tmp/a b");
}

TEST(E2bContexts, CreateErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"nope", "bad_json"},
      {"[]", "bad_json"},
      {R"({"language":["python"]})", "unsupported_language"},
      {R"({"cwd":5})", "bad_cwd"},
      {R"({"cwd":"relative/dir"})", "bad_cwd"},
      {R"({"cwd":"/a\u0000b"})", "bad_cwd"},
  };
  for (const auto& [body, reason] : cases) {
    auto r = parse_create_context_request(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.error().reason, reason) << body;
  }
}

TEST(E2bContexts, Model) {
  EXPECT_EQ(context_model("abc", "python", "/home/kernel"),
            json({{"id", "abc"}, {"language", "python"}, {"cwd", "/home/kernel"}}));
}

TEST(E2bAuth, RequestToken) {
  EXPECT_EQ(request_token("t1", ""), "t1");
  EXPECT_EQ(request_token("t1", "token t2"), "t1");
  EXPECT_EQ(request_token("", "token t2"), "t2");
  EXPECT_EQ(request_token("", "Token  t2"), "t2");
  EXPECT_EQ(request_token("", "Bearer t3"), "t3");
  EXPECT_EQ(request_token("", "Basic dXNlcg=="), "");
  EXPECT_EQ(request_token("", "token"), "");
  EXPECT_EQ(request_token("", "token "), "");
  EXPECT_EQ(request_token("", ""), "");
}

// ---- events → NDJSON -------------------------------------------------------------------------

TEST(E2bTranslate, Streams) {
  EXPECT_EQ(translate(json{{"type", "stream"}, {"name", "stdout"}, {"text", "hi\n"}}),
            std::vector<json>{json({{"type", "stdout"}, {"text", "hi\n"}})});
  EXPECT_EQ(translate(json{{"type", "stream"}, {"name", "stderr"}, {"text", "oops"}}),
            std::vector<json>{json({{"type", "stderr"}, {"text", "oops"}})});
  EXPECT_TRUE(translate(json{{"type", "stream"}, {"name", "stdin"}, {"text", "?"}}).empty());
}

TEST(E2bTranslate, ExecuteResultIsTheMainResult) {
  auto lines = translate(json{{"type", "execute_result"},
                              {"data", {{"text/plain", "42"}}},
                              {"metadata", json::object()},
                              {"execution_count", 3}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], json({{"type", "result"}, {"text", "42"}, {"is_main_result", true}}));
}

TEST(E2bTranslate, EveryMimeTypeToItsField) {
  json data = {{"text/plain", "<Figure>"},
               {"text/html", "<b>x</b>"},
               {"text/markdown", "# x"},
               {"image/svg+xml", "<svg/>"},
               {"image/png", "iVBORw0KGgo="},
               {"image/jpeg", "/9j/"},
               {"application/pdf", "JVBERi0="},
               {"text/latex", "$x$"},
               {"application/json", {{"a", 1}}},
               {"application/javascript", "alert(1)"},
               {"e2b/data", {{"rows", 2}}},
               {"e2b/chart", {{"type", "line"}}},
               {"application/vnd.plotly.v1+json", {{"data", json::array()}}},
               {"text/x-custom", "c"}};
  for (const char* type : {"display_data", "update_display_data"}) {
    auto lines = translate(json{{"type", type}, {"data", data}, {"metadata", json::object()}});
    ASSERT_EQ(lines.size(), 1u) << type;
    EXPECT_EQ(lines[0], json({{"type", "result"},
                              {"text", "<Figure>"},
                              {"html", "<b>x</b>"},
                              {"markdown", "# x"},
                              {"svg", "<svg/>"},
                              {"png", "iVBORw0KGgo="},
                              {"jpeg", "/9j/"},
                              {"pdf", "JVBERi0="},
                              {"latex", "$x$"},
                              {"json", {{"a", 1}}},
                              {"javascript", "alert(1)"},
                              {"data", {{"rows", 2}}},
                              {"chart", {{"type", "line"}}},
                              {"extra",
                               {{"application/vnd.plotly.v1+json", {{"data", json::array()}}},
                                {"text/x-custom", "c"}}},
                              {"is_main_result", false}}))
        << type;
  }
}

TEST(E2bTranslate, CellgateChartAndDataAreE2bFields) {
  // What the kernel's display formatters add (gateway/kernels/python/cellgate_display.py).
  json data = {{"text/plain", "<Figure size 640x480 with 1 Axes>"},
               {"image/png", "iVBORw0KGgo="},
               {"application/vnd.cellgate.chart+json", {{"type", "bar"}, {"elements", {1}}}},
               {"application/vnd.cellgate.data+json", {{"a", {1, 2}}}}};
  auto lines = translate(json{{"type", "display_data"}, {"data", data}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], json({{"type", "result"},
                            {"text", "<Figure size 640x480 with 1 Axes>"},
                            {"png", "iVBORw0KGgo="},
                            {"chart", {{"type", "bar"}, {"elements", {1}}}},
                            {"data", {{"a", {1, 2}}}},
                            {"is_main_result", false}}))
      << "no extra: the SDK's Result.extra stays {}";
}

TEST(E2bTranslate, TextLosesOnePairOfEnclosingQuotesAsOnE2b) {
  auto text = [](const std::string& plain) {
    auto lines = translate(json{{"type", "execute_result"}, {"data", {{"text/plain", plain}}}});
    return lines.at(0).at("text").get<std::string>();
  };
  EXPECT_EQ(text("'abc'"), "abc");
  EXPECT_EQ(text("\"abc\""), "abc");
  EXPECT_EQ(text("''"), "");
  EXPECT_EQ(text("'"), "'");
  EXPECT_EQ(text("'a\""), "'a\"");
  EXPECT_EQ(text("['a']"), "['a']");
}

TEST(E2bTranslate, ResultWithoutDataHasOnlyTypeAndFlag) {
  EXPECT_EQ(translate(json{{"type", "display_data"}}),
            std::vector<json>{json({{"type", "result"}, {"is_main_result", false}})});
}

TEST(E2bTranslate, ErrorTracebackIsOneString) {
  auto lines = translate(json{{"type", "error"},
                              {"ename", "ZeroDivisionError"},
                              {"evalue", "division by zero"},
                              {"traceback", {"Traceback", "----> 1 1/0", "ZeroDivisionError: x"}},
                              {"line", 1}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], json({{"type", "error"},
                            {"name", "ZeroDivisionError"},
                            {"value", "division by zero"},
                            {"traceback", "Traceback\n----> 1 1/0\nZeroDivisionError: x"}}));
  auto empty = translate(json{{"type", "error"}, {"ename", "E"}, {"evalue", ""}});
  EXPECT_EQ(empty.at(0).at("traceback"), "");
}

TEST(E2bTranslate, NoticeKeepaliveClearOutputUnknown) {
  EXPECT_EQ(translate(json{{"type", "notice"}, {"message", "stdout capped at 1 MiB"}}),
            std::vector<json>{
                json({{"type", "stderr"}, {"text", "[cellgate] stdout capped at 1 MiB\n"}})});
  EXPECT_EQ(translate(json{{"type", "keepalive"}}),
            std::vector<json>{json({{"type", "keepalive"}})});
  EXPECT_TRUE(translate(json{{"type", "clear_output"}, {"wait", true}}).empty());
  EXPECT_TRUE(translate(json{{"type", "status"}}).empty());
  EXPECT_TRUE(translate(json("not an object")).empty());
  EXPECT_TRUE(translate(json::array()).empty());
}

json end(json answer) {
  return {{"type", "end"}, {"answer", std::move(answer)}};
}

TEST(E2bTranslate, EndOk) {
  EXPECT_EQ(translate(end({{"status", "ok"}, {"execution_count", 7}, {"state_lost", false}})),
            (std::vector<json>{{{"type", "number_of_executions"}, {"execution_count", 7}},
                               {{"type", "end_of_execution"}}}));
  // No count (a silent run, a dead kernel): no number_of_executions.
  EXPECT_EQ(translate(end({{"status", "ok"}, {"execution_count", nullptr}})),
            std::vector<json>{json({{"type", "end_of_execution"}})});
}

TEST(E2bTranslate, EndTimeoutDeadAborted) {
  auto timeout = translate(end({{"status", "timeout"},
                                {"execution_count", nullptr},
                                {"state_lost", false},
                                {"message", "the cell ran past its timeout and was interrupted"}}));
  ASSERT_EQ(timeout.size(), 2u);
  EXPECT_EQ(timeout[0], json({{"type", "error"},
                              {"name", "TimeoutError"},
                              {"value", "the cell ran past its timeout and was interrupted"},
                              {"traceback", ""}}));
  EXPECT_EQ(timeout[1], json({{"type", "end_of_execution"}}));

  auto dead =
      translate(end({{"status", "dead"}, {"execution_count", nullptr}, {"state_lost", true}}));
  ASSERT_EQ(dead.size(), 2u);
  EXPECT_EQ(dead[0]["name"], "DeadKernelError");
  EXPECT_NE(dead[0]["value"].get<std::string>().find("lost"), std::string::npos) << dead[0];
  EXPECT_EQ(dead[1], json({{"type", "end_of_execution"}}));

  auto aborted = translate(end({{"status", "aborted"}, {"execution_count", 4}}));
  ASSERT_EQ(aborted.size(), 3u);
  EXPECT_EQ(aborted[0]["name"], "ExecutionAborted");
  EXPECT_EQ(aborted[1], json({{"type", "number_of_executions"}, {"execution_count", 4}}));

  auto odd = translate(end({{"status", "weird"}}));
  ASSERT_EQ(odd.size(), 2u);
  EXPECT_EQ(odd[0]["name"], "ExecutionError");
  auto bare = translate(json{{"type", "end"}});
  ASSERT_EQ(bare.size(), 2u);
  EXPECT_EQ(bare[0]["type"], "error");
  EXPECT_EQ(bare[1]["type"], "end_of_execution");
}

TEST(E2bTranslate, EndErrorSendsTheKernelErrorOnlyOnce) {
  const json error = {
      {"ename", "NameError"}, {"evalue", "name 'x' is not defined"}, {"traceback", {"a", "b"}}};
  const json finish = end({{"status", "error"}, {"execution_count", 2}, {"error", error}});

  Translator streamed;
  auto first = streamed.translate(json{{"type", "error"},
                                       {"ename", "NameError"},
                                       {"evalue", "name 'x' is not defined"},
                                       {"traceback", {"a", "b"}}});
  ASSERT_EQ(first.size(), 1u);
  auto last = streamed.translate(finish);
  EXPECT_EQ(last, (std::vector<json>{{{"type", "number_of_executions"}, {"execution_count", 2}},
                                     {{"type", "end_of_execution"}}}));

  // Without an error event before it, the answer's error is the error line.
  auto alone = translate(finish);
  ASSERT_EQ(alone.size(), 3u);
  EXPECT_EQ(alone[0], json({{"type", "error"},
                            {"name", "NameError"},
                            {"value", "name 'x' is not defined"},
                            {"traceback", "a\nb"}}));
  auto no_detail = translate(end({{"status", "error"}, {"error", nullptr}}));
  ASSERT_EQ(no_detail.size(), 2u);
  EXPECT_EQ(no_detail[0]["name"], "ExecutionError");
}

TEST(E2bTranslate, OddFieldTypesDoNotThrow) {
  EXPECT_NO_THROW({
    (void)translate(json{{"type", "stream"}, {"name", 1}, {"text", 2}});
    (void)translate(json{{"type", "execute_result"}, {"data", "x"}});
    (void)translate(json{{"type", "execute_result"}, {"data", {{"text/plain", 5}}}});
    (void)translate(json{{"type", "error"}, {"ename", 1}, {"traceback", {1, "x", nullptr}}});
    (void)translate(json{{"type", "notice"}});
    (void)translate(end({{"status", 3},
                         {"state_lost", "yes"},
                         {"execution_count", "7"},
                         {"error", "x"},
                         {"message", 1}}));
    (void)translate(json{{"type", "end"}, {"answer", "x"}});
  });
  auto odd = translate(end({{"status", "ok"}, {"execution_count", "7"}}));
  EXPECT_EQ(odd, std::vector<json>{json({{"type", "end_of_execution"}})});
}

TEST(E2bNdjson, OneAsciiLine) {
  const std::string line =
      ndjson_line({{"type", "stdout"}, {"text", "h\u00e9 \u2603 \U0001F600\n\"q\""}});
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  for (char c : line) {
    EXPECT_LT(static_cast<unsigned char>(c), 0x80) << line;
  }
  EXPECT_EQ(json::parse(line)["text"], "h\u00e9 \u2603 \U0001F600\n\"q\"");
  // Invalid UTF-8 does not throw; it becomes U+FFFD.
  std::string bad = "a\xff";
  EXPECT_NO_THROW((void)ndjson_line({{"text", bad}}));
}

// ---- the Python, run by a real interpreter ---------------------------------------------------

constexpr const char* kPython = "/usr/bin/python3";

// Runs a Python script; its stdout.
std::string run_python(const std::string& script) {
  std::string path = (std::filesystem::temp_directory_path() / "cellgate_e2b_XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  ::close(fd);
  {
    std::ofstream out(path, std::ios::binary);
    out << script;
  }
  std::string command = std::string(kPython) + " '" + path + "' 2>&1";
  std::string output;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
      output.append(buffer, n);
    }
    const int status = ::pclose(pipe);
    EXPECT_EQ(status, 0) << output << "\n--- script ---\n" << script;
  }
  std::filesystem::remove(path);
  return output;
}

std::vector<json> json_lines(const std::string& output) {
  std::vector<json> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    json parsed = json::parse(line, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << "not JSON: " << line << "\nall output:\n" << output;
    lines.push_back(parsed);
  }
  return lines;
}

class E2bPython : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kPython, X_OK) != 0) {
      GTEST_SKIP() << "no " << kPython << " here";
    }
  }
};

TEST_F(E2bPython, EnvValuesRoundTripAndAreRestored) {
  const std::map<std::string, std::string> vars = {
      {"CG_KEEP", "new value"},
      {"CG_NEW", "it's \"quoted\" \\ back\\slash \\n not-a-newline\nnewline\ttab"},
      {"CG_UNICODE", "h\u00e9 \u2603 \U0001F600 \u00a0"},
      {"CG_ESCAPES", "\\u0041 \\x41 {} %s ''' \"\"\" \r\n\x01"},
      {"CG_EMPTY", ""},
      {"CG name with ' and \"", "ok"},
  };
  json names = json::array();
  for (const auto& entry : vars) {
    names.push_back(entry.first);
  }
  const std::string dump_env = "print(json.dumps({k: os.environ.get(k) for k in NAMES}))\n";
  std::string script = "import json, os\n";
  script += "NAMES = json.loads(" + json(names.dump()).dump() + ")\n";
  script +=
      "os.environ['CG_KEEP'] = 'before'\n"
      "os.environ.pop('CG_NEW', None)\n" +
      env_code(vars) + dump_env +
      "import subprocess, sys\n"
      "print(json.dumps(json.loads(subprocess.run([sys.executable, '-c', "
      "'import json, os; print(json.dumps(os.environ.get(\"CG_NEW\")))'], "
      "capture_output=True, text=True).stdout)))\n" +
      env_restore_code(vars) + dump_env +
      "print(json.dumps(sorted(k for k in dir() if 'cellgate' in k)))\n"
      "print(json.dumps(hasattr(os, '_cellgate_e2b_saved_env')))\n";
  auto lines = json_lines(run_python(script));
  ASSERT_EQ(lines.size(), 5u);

  json during = json::object();
  for (const auto& [name, value] : vars) {
    during[name] = value;
  }
  EXPECT_EQ(lines[0], during);
  EXPECT_EQ(lines[1], vars.at("CG_NEW")) << "a child process does not see the variable";

  json after = json::object();
  for (const auto& entry : vars) {
    after[entry.first] = nullptr;
  }
  after["CG_KEEP"] = "before";
  EXPECT_EQ(lines[2], after);
  EXPECT_EQ(lines[3], json::array()) << "helpers left in the namespace";
  EXPECT_EQ(lines[4], false) << "the saved record was not removed";
}

TEST_F(E2bPython, RestoreWithoutRecordUnsetsTheNames) {
  // The kernel restarted between the two runs: nothing remembered, E2B's behaviour (unset).
  const std::map<std::string, std::string> vars = {{"CG_A", "1"}, {"CG_B", "2"}};
  const std::string script =
      "import json, os\n"
      "os.environ['CG_A'] = 'x'\n"
      "os.environ['CG_OTHER'] = 'y'\n" +
      env_restore_code(vars) +
      "print(json.dumps([os.environ.get('CG_A'), os.environ.get('CG_B'), "
      "os.environ.get('CG_OTHER')]))\n";
  auto lines = json_lines(run_python(script));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], json::parse(R"([null, null, "y"])"));
}

TEST_F(E2bPython, EmptyVarsNeedNoCode) {
  EXPECT_EQ(env_code({}), "");
  EXPECT_EQ(env_restore_code({}), "");
}

TEST_F(E2bPython, ContextSetupMakesAnOddPathAndChangesToIt) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "cg e2b 'q\" \\ \u00e9 XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string cwd = tmpl + "/not yet/there";  // mkdir -p
  auto setup = context_setup_code("python", cwd);
  ASSERT_TRUE(setup.has_value());
  const std::string script = "import json, os\n" + *setup +
                             "print(json.dumps(os.getcwd()))\n"
                             "print(json.dumps([k for k in dir() if 'cellgate' in k]))\n";
  auto lines = json_lines(run_python(script));
  std::filesystem::remove_all(tmpl);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], cwd);
  EXPECT_EQ(lines[1], json::array()) << "helpers left in the namespace";
}

TEST(E2bContexts, SetupCodeByLanguage) {
  EXPECT_TRUE(context_setup_code("python", "/home/user").has_value());
  auto r = context_setup_code("r", "/home/user/a \"b\"");
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find(R"(setwd("/home/user/a \"b\""))"), std::string::npos) << *r;
  EXPECT_FALSE(context_setup_code("bash", "/home/user").has_value()) << "syntax unknown to us";
}

}  // namespace
}  // namespace cellgate::api::e2b
