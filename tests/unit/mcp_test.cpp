// The MCP server over a fake of its seam (client::Kernels): lifecycle and version negotiation,
// JSON-RPC errors, the tools and their named sessions, the content an execute answer becomes,
// cancellation, the stdio framing over pipes and the Streamable HTTP endpoint's rules. The real
// kernels and the official SDK client are tests/js/mcp.test.mjs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "cellgate/client/kernels.hpp"
#include "cellgate/mcp/http_endpoint.hpp"
#include "cellgate/mcp/server.hpp"
#include "cellgate/mcp/stdio.hpp"
#include "cellgate/util/text.hpp"
#include "content.hpp"

namespace cellgate::mcp {
namespace {

using nlohmann::json;

// An answer as the executor gives it, from its JSON.
execute::CellResult result_of(const json& answer) {
  return execute::CellResult::from_json(answer).value();
}

// Kernels in a map; cells answer at once with what the test queued (or an echo of the code).
class FakeKernels : public client::Kernels {
 public:
  struct FakeCell : client::Cell {
    void cancel() override { cancelled = true; }
    bool cancelled = false;
  };

  Result<client::KernelSpecs> kernelspecs() override {
    return client::KernelSpecs{{{"python3", "python"}, {"ir", "R"}}, "python3"};
  }
  Result<std::string> start(const std::string& spec) override {
    std::lock_guard lock(mu);
    const std::string id = "k" + std::to_string(++starts);
    live[id] = spec;
    return id;
  }
  Result<void> restart(const std::string& id) override {
    std::lock_guard lock(mu);
    if (!live.count(id)) {
      return make_error(ErrorCode::kNotFound, "no_such_kernel", "gone");
    }
    ++restarts;
    return ok_result();
  }
  Result<void> shutdown(const std::string& id) override {
    std::lock_guard lock(mu);
    return live.erase(id) != 0 ? ok_result()
                               : Result<void>(make_error(ErrorCode::kNotFound, "x", "gone"));
  }
  // Snapshots: "s-<kernel>"; a copy is a new kernel of the same spec.
  Result<std::string> snapshot(const std::string& id) override {
    std::lock_guard lock(mu);
    if (!live.count(id)) {
      return make_error(ErrorCode::kNotFound, "no_such_kernel", "gone");
    }
    return "s-" + id;
  }
  Result<Copy> start_from_snapshot(const std::string& snapshot_id) override {
    std::string spec;
    {
      std::lock_guard lock(mu);
      auto it = live.find(snapshot_id.substr(2));
      if (snapshot_id.rfind("s-", 0) != 0 || it == live.end()) {
        return make_error(ErrorCode::kNotFound, "no_snapshot", "no snapshot " + snapshot_id);
      }
      spec = it->second;
    }
    CELLGATE_ASSIGN_OR_RETURN(std::string id, start(spec));
    return Copy{id, spec};
  }
  Result<std::vector<std::string>> fork(const std::string& id, int count) override {
    std::vector<std::string> ids;
    for (int i = 0; i < count; ++i) {
      CELLGATE_ASSIGN_OR_RETURN(auto copy, start_from_snapshot("s-" + id));
      ids.push_back(copy.id);
    }
    return ids;
  }
  std::shared_ptr<client::Cell> execute(const std::string& id, execute::ExecuteRequest typed,
                                        client::CellCallbacks cb) override {
    const json request = client::request_json(typed);
    auto cell = std::make_shared<FakeCell>();
    last_cell = cell;
    last_request = request;
    if (hold) {  // the test ends the cell later
      held = std::move(cb);
      return cell;
    }
    bool known;
    {
      std::lock_guard lock(mu);
      known = live.count(id) != 0;
    }
    if (!known) {
      cb.done(make_error(ErrorCode::kNotFound, "no_such_kernel", "Kernel does not exist"));
    } else if (!answers.empty()) {
      json a = answers.front();
      answers.erase(answers.begin());
      cb.done(execute::CellResult::from_json(a));
    } else {
      cb.done(execute::CellResult::from_json(json{
          {"status", "ok"},
          {"execution_count", 1},
          {"stdout", request["code"]},
          {"outputs",
           json::array(
               {{{"output_type", "stream"}, {"name", "stdout"}, {"text", request["code"]}}})}}));
    }
    return cell;
  }
  Result<json> list_files(const std::string&, const std::string& dir) override {
    return json{
        {"path", dir},
        {"entries",
         json::array({{{"name", "a.txt"}, {"path", "a.txt"}, {"type", "file"}, {"size", 3}}})},
        {"truncated", false}};
  }
  Result<std::string> read_file(const std::string&, const std::string& path) override {
    auto it = files.find(path);
    if (it == files.end()) {
      return make_error(ErrorCode::kNotFound, "not_found", "no such file: " + path);
    }
    return it->second;
  }
  Result<json> write_file(const std::string&, const std::string& path,
                          const std::string& bytes) override {
    files[path] = bytes;
    return json{{"path", path}, {"size", bytes.size()}};
  }
  std::shared_ptr<client::Cell> execute_once(const std::string&, execute::ExecuteRequest,
                                             client::CellCallbacks cb) override {
    cb.done(make_error(ErrorCode::kInternal, "unused", "the MCP tools run no one-shot cells"));
    return std::make_shared<FakeCell>();
  }
  Result<json> kernel_info(const std::string&) override { return json::object(); }
  std::string artifact_base() const override { return "/api/artifacts/"; }

  std::mutex mu;
  int starts = 0;
  int restarts = 0;
  std::map<std::string, std::string> live;
  std::map<std::string, std::string> files;
  std::vector<json> answers;
  json last_request;
  std::shared_ptr<FakeCell> last_cell;
  bool hold = false;
  client::CellCallbacks held;
};

util::Offload inline_offload() {
  return [](std::function<void()> fn) { fn(); };
}

class McpServerTest : public ::testing::Test {
 protected:
  // One request through the server; its response.
  json rpc(const std::string& method, json params = json::object(), json id = 1) {
    json response;
    server.handle(conversation,
                  json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}},
                  {.reply = [&](json r) { response = std::move(r); },
                   .notify = [&](json n) { notes.push_back(std::move(n)); },
                   .keepalive = nullptr});
    return response;
  }
  json call(const std::string& tool, json args) {
    return rpc("tools/call", {{"name", tool}, {"arguments", std::move(args)}})["result"];
  }
  static std::string text_of(const json& result) {
    std::string t;
    for (const auto& c : result["content"]) {
      if (c["type"] == "text") {
        t += c["text"].get<std::string>();
      }
    }
    return t;
  }

  FakeKernels kernels;
  Server server{kernels, inline_offload(), {}};
  std::shared_ptr<Conversation> conversation = server.open();
  std::vector<json> notes;
};

TEST_F(McpServerTest, InitializeAnswersTheClientsVersionWhenSupported) {
  json r = rpc("initialize", {{"protocolVersion", "2025-06-18"},
                              {"capabilities", json::object()},
                              {"clientInfo", {{"name", "t"}, {"version", "1"}}}});
  EXPECT_EQ(r["result"]["protocolVersion"], "2025-06-18");
  EXPECT_EQ(r["result"]["serverInfo"]["name"], "cellgate");
  EXPECT_EQ(r["result"]["capabilities"]["tools"]["listChanged"], false);
  r = rpc("initialize", {{"protocolVersion", "2099-01-01"}});
  EXPECT_EQ(r["result"]["protocolVersion"], Server::supported_versions().front());
  EXPECT_EQ(Server::supported_versions().front(), "2025-11-25");
  r = rpc("initialize", json::object());
  EXPECT_EQ(r["error"]["code"], -32602);
}

TEST_F(McpServerTest, ProtocolFaultsAreJsonRpcErrors) {
  EXPECT_EQ(rpc("ping")["result"], json::object());
  EXPECT_EQ(rpc("resources/list")["error"]["code"], -32601);
  EXPECT_EQ(rpc("tools/call", {{"arguments", json::object()}})["error"]["code"], -32602);
  EXPECT_EQ(rpc("tools/call", {{"name", "nope"}})["error"]["code"], -32602);
  EXPECT_EQ(rpc("tools/call", {{"name", "run_code"}, {"arguments", "x"}})["error"]["code"], -32602);
  json response;
  const Outbox out{
      .reply = [&](json r) { response = std::move(r); }, .notify = nullptr, .keepalive = nullptr};
  server.handle(conversation,
                json::array({json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", "ping"}}}), out);
  EXPECT_EQ(response["error"]["code"], -32600);
  EXPECT_TRUE(response["id"].is_null());
  server.handle(conversation, json{{"jsonrpc", "1.0"}, {"id", 7}, {"method", "ping"}}, out);
  EXPECT_EQ(response["error"]["code"], -32600);
  EXPECT_EQ(response["id"], 7);
  // Notifications and responses get no answer.
  response = nullptr;
  server.handle(conversation, json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}},
                out);
  server.handle(conversation, json{{"jsonrpc", "2.0"}, {"id", 3}, {"result", json::object()}}, out);
  EXPECT_TRUE(response.is_null());
}

TEST_F(McpServerTest, ToolsListHasSchemas) {
  json tools = rpc("tools/list")["result"]["tools"];
  ASSERT_EQ(tools.size(), 10u);
  for (const auto& t : tools) {
    EXPECT_EQ(t["inputSchema"]["type"], "object") << t["name"];
    EXPECT_TRUE(t.contains("description")) << t["name"];
  }
  EXPECT_EQ(tools[0]["name"], "run_code");
  EXPECT_EQ(tools[0]["inputSchema"]["required"], json::array({"code"}));
  EXPECT_EQ(tools[0]["outputSchema"]["required"], json::array({"session", "status"}));
}

TEST_F(McpServerTest, NamedSessionsStartOnceAndKeepTheirKernel) {
  json r = call("run_code", {{"code", "print(1)"}});
  EXPECT_EQ(r["isError"], false);
  EXPECT_EQ(r["structuredContent"]["session"], "default");
  EXPECT_EQ(r["structuredContent"]["new_session"], true);
  EXPECT_EQ(r["structuredContent"]["kernel"], "python3");
  r = call("run_code", {{"code", "x"}, {"timeout", 5}, {"stdin", {"a"}}});
  EXPECT_EQ(r["structuredContent"]["new_session"], false);
  EXPECT_EQ(kernels.last_request, (json{{"code", "x"}, {"timeout", 5}, {"stdin", {"a"}}}));
  r = call("run_code", {{"code", "y"}, {"session", "r1"}, {"language", "r"}});
  EXPECT_EQ(r["structuredContent"]["kernel"], "ir");
  EXPECT_EQ(kernels.starts, 2);
  // A session keeps its kernel: asking for another one is a tool error.
  r = call("run_code", {{"code", "y"}, {"session", "r1"}, {"kernel", "python3"}});
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text_of(r).find("runs kernel ir"), std::string::npos);
  r = call("list_sessions", json::object());
  EXPECT_EQ(r["structuredContent"]["sessions"].size(), 2u);
  // Another conversation has its own "default".
  auto other = server.open();
  json response;
  server.handle(
      other,
      json{{"jsonrpc", "2.0"},
           {"id", 1},
           {"method", "tools/call"},
           {"params", {{"name", "run_code"}, {"arguments", {{"code", "1"}}}}}},
      {.reply = [&](json x) { response = std::move(x); }, .notify = nullptr, .keepalive = nullptr});
  EXPECT_EQ(response["result"]["structuredContent"]["new_session"], true);
  EXPECT_EQ(kernels.starts, 3);
  server.close(*conversation);
  EXPECT_EQ(kernels.live.size(), 1u);  // only the other conversation's
  r = call("run_code", {{"code", "1"}});
  EXPECT_EQ(r["isError"], true);
}

TEST_F(McpServerTest, ForkAndSnapshotsMakeSessionsOfTheirOwn) {
  ASSERT_EQ(call("run_code", {{"code", "x = 1"}, {"session", "a"}, {"language", "r"}})["isError"],
            false);
  json r = call("fork_session", {{"session", "a"}, {"into", "b"}});
  ASSERT_EQ(r["isError"], false) << r;
  EXPECT_EQ(r["structuredContent"]["session"], "b");
  EXPECT_EQ(r["structuredContent"]["kernel"], "ir");
  const std::string b_kernel = r["structuredContent"]["kernel_id"];
  // The copy is a session with its own kernel, of the source's language.
  r = call("run_code", {{"code", "x"}, {"session", "b"}, {"language", "r"}});
  EXPECT_EQ(r["isError"], false) << r;
  EXPECT_EQ(r["structuredContent"]["kernel_id"], b_kernel);
  EXPECT_EQ(r["structuredContent"]["new_session"], false);
  // Names are checked: an open target, a missing source, a bad name.
  EXPECT_EQ(call("fork_session", {{"session", "a"}, {"into", "b"}})["isError"], true);
  EXPECT_EQ(call("fork_session", {{"session", "zz"}, {"into", "c"}})["isError"], true);
  EXPECT_EQ(call("fork_session", {{"session", "a"}, {"into", "../x"}})["isError"], true);
  EXPECT_EQ(call("fork_session", {{"session", "a"}})["isError"], true);
  // A megabyte of name is refused by its length, as any name the client sends.
  EXPECT_EQ(
      call("fork_session", {{"session", "a"}, {"into", std::string(1 << 20, 'a')}})["isError"],
      true);
  EXPECT_EQ(call("run_code", {{"code", "1"}, {"session", std::string(1 << 20, 'a')}})["isError"],
            true);

  r = call("snapshot_session", {{"session", "a"}});
  ASSERT_EQ(r["isError"], false) << r;
  const std::string snap = r["structuredContent"]["snapshot"];
  r = call("restore_snapshot", {{"snapshot", snap}, {"session", "c"}});
  ASSERT_EQ(r["isError"], false) << r;
  EXPECT_EQ(r["structuredContent"]["kernel"], "ir");
  EXPECT_EQ(call("restore_snapshot", {{"snapshot", "s-nope"}, {"session", "d"}})["isError"], true);
  EXPECT_EQ(call("list_sessions", json::object())["structuredContent"]["sessions"].size(), 3u);
}

TEST_F(McpServerTest, BadArgumentsAreToolErrors) {
  for (const json& args :
       {json{{"timeout", 3}}, json{{"code", 1}}, json{{"code", "1"}, {"timeout", -1}},
        json{{"code", "1"}, {"session", "../x"}}, json{{"code", "1"}, {"timout", 3}},
        json{{"code", "1"}, {"stdin", {1, 2}}}, json{{"code", "1"}, {"kernel", "nope"}}}) {
    json r = call("run_code", args);
    EXPECT_EQ(r["isError"], true) << args;
    EXPECT_FALSE(text_of(r).empty()) << args;
  }
  EXPECT_EQ(kernels.starts, 0);
  EXPECT_EQ(call("read_file", {{"path", "a"}})["isError"], true);  // no session yet
  const json bad64 = {{"path", "a"}, {"content", "%%%"}, {"encoding", "base64"}};
  EXPECT_EQ(call("write_file", bad64)["isError"], true);
}

TEST_F(McpServerTest, AKernelThatWentAwayIsReplacedAndSaidSo) {
  call("run_code", {{"code", "x = 1"}});
  kernels.live.clear();  // culled
  json r = call("run_code", {{"code", "x"}});
  EXPECT_EQ(r["isError"], false);
  EXPECT_EQ(r["structuredContent"]["new_session"], true);
  EXPECT_NE(text_of(r).find("lost its kernel"), std::string::npos);
  EXPECT_EQ(kernels.starts, 2);
}

TEST_F(McpServerTest, FilesRestartAndClose) {
  call("write_file", {{"path", "d/a.txt"}, {"content", "aGk="}, {"encoding", "base64"}});
  EXPECT_EQ(kernels.files["d/a.txt"], "hi");
  json r = call("read_file", {{"path", "d/a.txt"}});
  EXPECT_EQ(r["content"][0], (json{{"type", "text"}, {"text", "hi"}}));
  kernels.files["p.png"] = "\x89PNG";
  r = call("read_file", {{"path", "p.png"}});
  EXPECT_EQ(r["content"][0]["type"], "image");
  EXPECT_EQ(r["content"][0]["data"], base64_encode("\x89PNG"));
  kernels.files["b"] = std::string("\0\xff", 2);
  r = call("read_file", {{"path", "b"}});
  EXPECT_EQ(r["content"][0]["type"], "resource");
  r = call("list_files", json::object());
  EXPECT_EQ(r["structuredContent"]["entries"][0]["name"], "a.txt");
  r = call("restart_session", json::object());
  EXPECT_EQ(r["isError"], false);
  EXPECT_EQ(kernels.restarts, 1);
  r = call("close_session", json::object());
  EXPECT_EQ(r["structuredContent"]["closed"], true);
  EXPECT_TRUE(kernels.live.empty());
  r = call("close_session", json::object());  // idempotent
  EXPECT_EQ(r["isError"], false);
  EXPECT_EQ(r["structuredContent"]["closed"], false);
  EXPECT_EQ(call("restart_session", json::object())["isError"], true);
}

TEST_F(McpServerTest, CancelledNotificationStopsTheCellAndProgressFlows) {
  call("run_code", {{"code", "1"}});  // the session exists
  kernels.hold = true;
  json response;
  std::function<void()> keepalive;
  server.handle(conversation,
                json{{"jsonrpc", "2.0"},
                     {"id", "r9"},
                     {"method", "tools/call"},
                     {"params",
                      {{"name", "run_code"},
                       {"arguments", {{"code", "sleep"}}},
                       {"_meta", {{"progressToken", "p1"}}}}}},
                {.reply = [&](json r) { response = std::move(r); },
                 .notify = [&](json n) { notes.push_back(std::move(n)); },
                 .keepalive = nullptr});
  ASSERT_TRUE(kernels.held.on_keepalive);
  kernels.held.on_keepalive();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0]["method"], "notifications/progress");
  EXPECT_EQ(notes[0]["params"]["progressToken"], "p1");
  EXPECT_EQ(notes[0]["params"]["progress"], 1);
  server.handle(conversation,
                json{{"jsonrpc", "2.0"},
                     {"method", "notifications/cancelled"},
                     {"params", {{"requestId", "r9"}}}},
                {});
  EXPECT_TRUE(kernels.last_cell->cancelled);
  kernels.held.done(execute::CellResult::from_json(json{{"status", "aborted"}}));
  EXPECT_EQ(response["id"], "r9");
  EXPECT_EQ(response["result"]["isError"], true);
}

TEST(McpContent, AnswerBecomesTextImagesAndStructuredContent) {
  const std::string png = base64_encode("\x89PNG\r\n\x1a\nfake");
  json answer = {
      {"status", "error"},
      {"execution_count", 3},
      {"stdout", "a\n"},
      {"stderr", "w\n"},
      {"outputs",
       {{{"output_type", "stream"}, {"name", "stdout"}, {"text", "a\n"}},
        {{"output_type", "display_data"},
         {"data",
          {{"image/png", png.substr(0, 4) + "\n" + png.substr(4)}, {"text/plain", "<Figure>"}}},
         {"chart", {{"type", "line"}, {"title", "t"}}}},
        {{"output_type", "stream"}, {"name", "stderr"}, {"text", "w\n"}},
        {{"output_type", "execute_result"}, {"data", {{"text/plain", "42"}}}},
        {{"output_type", "error"}, {"ename", "E"}, {"evalue", "v"}}}},
      {"result", {{"text/plain", "42"}}},
      {"error",
       {{"ename", "KeyError"},
        {"evalue", "'k'"},
        {"line", 2},
        {"traceback", {"\x1b[31mKeyError\x1b[0m: 'k'"}}}},
      {"artifacts",
       {{{"sha256", "abc"}, {"mime_type", "image/png"}},
        {{"sha256", "def"}, {"mime_type", "image/png"}, {"kernel_id", "0003a71c-k"}}}},
      {"state_lost", false}};
  json r = run_code_result(result_of(answer), {"s", "k1", "python3", false, ""}, "/api/artifacts/");
  ASSERT_EQ(r["content"].size(), 3u) << r["content"];
  EXPECT_EQ(r["content"][0], (json{{"type", "text"}, {"text", "a\n"}}));
  EXPECT_EQ(r["content"][1], (json{{"type", "image"}, {"data", png}, {"mimeType", "image/png"}}));
  const std::string rest = r["content"][2]["text"];
  EXPECT_EQ(rest.find("<Figure>"), std::string::npos);
  EXPECT_NE(rest.find("[chart] {\"title\":\"t\",\"type\":\"line\"}"), std::string::npos) << rest;
  EXPECT_NE(rest.find("w\n42\nKeyError: 'k'"), std::string::npos) << rest;  // ANSI stripped
  EXPECT_EQ(r["isError"], true);
  const json& s = r["structuredContent"];
  EXPECT_EQ(s["status"], "error");
  EXPECT_EQ(s["execution_count"], 3);
  EXPECT_EQ(s["result"], "42");
  EXPECT_EQ(s["error"], (json{{"ename", "KeyError"}, {"evalue", "'k'"}, {"line", 2}}));
  EXPECT_EQ(s["artifacts"][0]["url"], "/api/artifacts/abc");
  // With its kernel known, the URL routes to that kernel's node (docs/scale-out.md).
  EXPECT_EQ(s["artifacts"][1]["url"], "/api/kernels/0003a71c-k/artifacts/def");
  EXPECT_EQ(s["charts"], json::array({{{"type", "line"}, {"title", "t"}}}));

  json timeout = {{"status", "timeout"}, {"state_lost", true}, {"message", "ran past 2 s"}};
  r = run_code_result(result_of(timeout), {"s", "k1", "python3", false, "a note"}, "");
  const std::string t = r["content"][0]["text"];
  EXPECT_NE(t.find("[note] a note"), std::string::npos);
  EXPECT_NE(t.find("[timeout] ran past 2 s"), std::string::npos);
  EXPECT_NE(t.find("[state_lost]"), std::string::npos);
  EXPECT_TRUE(r["structuredContent"]["execution_count"].is_null());
  EXPECT_EQ(r["isError"], true);

  // The display formatters' chart: under its mime type in the bundle, in the answer's
  // "charts", and on the artifact — one chart, placed after its image.
  const json chart = {{"type", "bar"}};
  json formatted = {
      {"status", "ok"},
      {"outputs",
       {{{"output_type", "display_data"},
         {"data", {{"image/png", png}, {"application/vnd.cellgate.chart+json", chart}}}},
        {{"output_type", "stream"}, {"name", "stdout"}, {"text", "after\n"}}}},
      {"charts", {chart}},
      {"artifacts", {{{"sha256", "abc"}, {"chart", chart}}}}};
  r = run_code_result(result_of(formatted), {}, "");
  ASSERT_EQ(r["content"].size(), 2u) << r["content"];
  EXPECT_EQ(r["content"][1]["text"], "[chart] {\"type\":\"bar\"}\nafter\n");
  EXPECT_EQ(r["structuredContent"]["charts"], json::array({chart}));

  r = run_code_result(result_of(json{{"status", "ok"}, {"outputs", json::array()}}), {}, "");
  EXPECT_EQ(r["content"][0]["text"], "(no output)");
  EXPECT_EQ(r["isError"], false);
}

TEST(McpContent, Utf8) {
  EXPECT_TRUE(valid_utf8("héllo €𝄞"));
  EXPECT_FALSE(valid_utf8("\xff"));
  EXPECT_FALSE(valid_utf8("\xc0\x80"));      // overlong
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));  // a surrogate
  EXPECT_FALSE(valid_utf8("\xe2\x82"));      // cut short
}

TEST(McpStdio, OneMessagePerLineAndParseErrors) {
  FakeKernels kernels;
  Server server(kernels, inline_offload(), {});
  int in[2];
  int out[2];
  ASSERT_EQ(::pipe(in), 0);
  ASSERT_EQ(::pipe(out), 0);
  const std::string input =
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n"
      "\n"
      "{oops\n"
      "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"run_code\","
      "\"arguments\":{\"code\":\"a\\nb\"}}}\n"
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}";  // no newline at the end
  ASSERT_EQ(::write(in[1], input.data(), input.size()), static_cast<ssize_t>(input.size()));
  ::close(in[1]);
  EXPECT_EQ(serve_stdio(server, in[0], out[1], -1), 0);
  ::close(out[1]);
  std::string output;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) {
    output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(in[0]);
  ::close(out[0]);
  std::istringstream lines(output);
  std::vector<json> messages;
  for (std::string line; std::getline(lines, line);) {
    messages.push_back(json::parse(line));
  }
  ASSERT_EQ(messages.size(), 4u) << output;
  EXPECT_EQ(messages[0], (json{{"jsonrpc", "2.0"}, {"id", 1}, {"result", json::object()}}));
  EXPECT_EQ(messages[1]["error"]["code"], -32700);
  EXPECT_EQ(messages[2]["result"]["content"][0]["text"], "a\nb");  // escaped, one line
  EXPECT_EQ(messages[3]["id"], 3);
  EXPECT_TRUE(kernels.live.empty());  // the end of input closed the session
}

// ---- the Streamable HTTP endpoint --------------------------------------------------------------

http::Response send(HttpEndpoint& endpoint, http::Verb verb, const std::string& body,
                    std::map<std::string, std::string> headers) {
  http::Request req{verb, "/mcp", 11};
  req.set(http::Field::host, "127.0.0.1:8888");
  req.set(http::Field::content_type, "application/json");
  req.set(http::Field::accept, "application/json, text/event-stream");
  for (const auto& [k, v] : headers) {
    req.set(k, v);
  }
  req.body() = body;
  req.prepare_payload();
  http::Response res;
  endpoint.handle(std::move(req), std::make_shared<http::LambdaExchange>(
                                      [&](http::Response r) { res = std::move(r); }));
  return res;
}

TEST(McpHttp, SessionsHeadersAndRefusals) {
  FakeKernels kernels;
  Server server(kernels, inline_offload(), {});
  HttpEndpoint endpoint(server, inline_offload(),
                        {.allow_origins = {"https://app.example"}, .max_conversations = 2});
  EXPECT_TRUE(endpoint.origin_allowed("http://localhost:3000"));
  EXPECT_TRUE(endpoint.origin_allowed("http://127.0.0.1"));
  EXPECT_TRUE(endpoint.origin_allowed("http://[::1]:8888"));
  EXPECT_TRUE(endpoint.origin_allowed("https://app.example"));
  EXPECT_FALSE(endpoint.origin_allowed("http://evil.example:8888"));
  EXPECT_FALSE(endpoint.origin_allowed("http://localhost.evil.example"));
  EXPECT_FALSE(endpoint.origin_allowed("null"));

  const std::string init =
      R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}})";
  auto res = send(endpoint, http::Verb::post, init, {{"Origin", "http://evil.example"}});
  EXPECT_EQ(res.result(), http::Status::forbidden);
  res = send(endpoint, http::Verb::post, init, {});
  ASSERT_EQ(res.result(), http::Status::ok);
  const std::string sid(res["Mcp-Session-Id"]);
  EXPECT_EQ(sid.size(), 32u);
  EXPECT_EQ(endpoint.conversations(), 1u);

  const std::string ping = R"({"jsonrpc":"2.0","id":2,"method":"ping"})";
  EXPECT_EQ(send(endpoint, http::Verb::post, ping, {}).result(), http::Status::bad_request);
  EXPECT_EQ(send(endpoint, http::Verb::post, ping, {{"Mcp-Session-Id", "x"}}).result(),
            http::Status::not_found);
  EXPECT_EQ(send(endpoint, http::Verb::post, ping,
                 {{"Mcp-Session-Id", sid}, {"MCP-Protocol-Version", "2024-01-01"}})
                .result(),
            http::Status::bad_request);
  EXPECT_EQ(send(endpoint, http::Verb::post, ping,
                 {{"Mcp-Session-Id", sid}, {"Content-Type", "text/plain"}})
                .result(),
            http::Status::unsupported_media_type);
  EXPECT_EQ(
      send(endpoint, http::Verb::post, ping, {{"Mcp-Session-Id", sid}, {"Accept", "text/html"}})
          .result(),
      http::Status::not_acceptable);
  res = send(endpoint, http::Verb::post, ping,
             {{"Mcp-Session-Id", sid}, {"MCP-Protocol-Version", "2025-11-25"}});
  EXPECT_EQ(res.result(), http::Status::ok);
  EXPECT_EQ(json::parse(res.body())["result"], json::object());
  res =
      send(endpoint, http::Verb::post, R"({"jsonrpc":"2.0","method":"notifications/initialized"})",
           {{"Mcp-Session-Id", sid}});
  EXPECT_EQ(res.result(), http::Status::accepted);
  EXPECT_TRUE(res.body().empty());
  res = send(endpoint, http::Verb::post, "[1", {{"Mcp-Session-Id", sid}});
  EXPECT_EQ(res.result(), http::Status::bad_request);
  EXPECT_EQ(json::parse(res.body())["error"]["code"], -32700);
  res = send(endpoint, http::Verb::get, "", {{"Mcp-Session-Id", sid}});
  EXPECT_EQ(res.result(), http::Status::method_not_allowed);

  // tools/call streamed as SSE: the response is one "message" event.
  res = send(endpoint, http::Verb::post,
             R"({"jsonrpc":"2.0","id":5,"method":"tools/call",)"
             R"("params":{"name":"run_code","arguments":{"code":"hi"}}})",
             {{"Mcp-Session-Id", sid}});
  EXPECT_EQ(res[http::Field::content_type], "text/event-stream");
  const std::string body = res.body();
  ASSERT_EQ(body.rfind("event: message\ndata: ", 0), 0u) << body;
  json message = json::parse(body.substr(body.find("data: ") + 6));
  EXPECT_EQ(message["result"]["content"][0]["text"], "hi");
  EXPECT_EQ(kernels.live.size(), 1u);

  // Past max_conversations the least recently used one ends, kernels and all.
  send(endpoint, http::Verb::post, init, {});
  send(endpoint, http::Verb::post, init, {});
  EXPECT_EQ(endpoint.conversations(), 2u);
  EXPECT_TRUE(kernels.live.empty());
  EXPECT_EQ(send(endpoint, http::Verb::post, ping, {{"Mcp-Session-Id", sid}}).result(),
            http::Status::not_found);

  res = send(endpoint, http::Verb::post, init, {});
  const std::string sid2(res["Mcp-Session-Id"]);
  EXPECT_EQ(send(endpoint, http::Verb::delete_, "", {{"Mcp-Session-Id", sid2}}).result(),
            http::Status::no_content);
  EXPECT_EQ(send(endpoint, http::Verb::delete_, "", {{"Mcp-Session-Id", sid2}}).result(),
            http::Status::not_found);
}

}  // namespace
}  // namespace cellgate::mcp
