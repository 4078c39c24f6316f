// run_notebook() against a fake Backend whose kernels answer from a script: which cells run,
// how answers fill the notebook and end the run, the kernel chosen, the files copied into the
// work dir, the progress callback, and what is written (the notebook, artifacts). No kernels.
#include "cellgate/notebooks/runner.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "cellgate/util/text.hpp"
#include "outputs.hpp"

namespace cellgate::notebooks {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// What the fake kernels saw.
struct Calls {
  std::vector<std::string> started;          // kernelspec names
  std::vector<std::string> executed;         // cell sources, in order
  std::vector<double> timeouts;              // per execute
  std::map<std::string, std::string> files;  // put_file: rel → bytes
  int shut_down = 0;
};

// Answers a cell from `answer(code)`; the default is {"status": "ok"} with the code echoed as
// stdout and an execution count that counts up per kernel.
using Answerer = std::function<Result<json>(const std::string& code, int count)>;

class FakeSession final : public KernelSession {
 public:
  FakeSession(Calls& calls, const Answerer& answer) : calls_(calls), answer_(answer) {}
  ~FakeSession() override { ++calls_.shut_down; }
  Result<void> put_file(const std::string& rel, const std::string& bytes) override {
    calls_.files[rel] = bytes;
    return ok_result();
  }
  Result<CellAnswer> execute(const std::string& code, double timeout_seconds) override {
    calls_.executed.push_back(code);
    calls_.timeouts.push_back(timeout_seconds);
    // The script's JSON, read as a gateway's answer is (its "events" as the backends keep them).
    CELLGATE_ASSIGN_OR_RETURN(json answer, answer_(code, ++count_));
    CELLGATE_ASSIGN_OR_RETURN(auto result, execute::CellResult::from_json(answer));
    CellAnswer out{std::move(result), std::nullopt};
    if (auto events = answer.find("events"); events != answer.end() && events->is_array()) {
      out.events = *events;
    }
    return out;
  }
  Result<json> kernel_info() override {
    return json{{"status", "ok"}, {"language_info", {{"name", "python"}, {"version", "3.11.2"}}}};
  }

 private:
  Calls& calls_;
  const Answerer& answer_;
  int count_ = 0;
};

json ok_answer(const std::string& code, int count) {
  return {
      {"status", "ok"},
      {"execution_count", count},
      {"outputs", json::array({{{"output_type", "stream"}, {"name", "stdout"}, {"text", code}}})}};
}

json error_answer(int count, const std::string& ename, const std::string& evalue, int line) {
  return {{"status", "error"},
          {"execution_count", count},
          {"outputs", json::array({{{"output_type", "error"},
                                    {"ename", ename},
                                    {"evalue", evalue},
                                    {"traceback", json::array({"tb1", "tb2"})}}})},
          {"error",
           {{"ename", ename}, {"evalue", evalue}, {"line", line}, {"traceback", {"tb1", "tb2"}}}}};
}

class FakeBackend final : public Backend {
 public:
  Calls calls;
  Answerer answer = [](const std::string& code, int count) -> Result<json> {
    return ok_answer(code, count);
  };
  std::set<std::string> names = {"python3", "ir"};
  bool clamps = false;
  std::optional<Error> start_error;

  const std::set<std::string>& kernelspecs() const override { return names; }
  std::string default_kernel() const override { return "python3"; }
  Result<std::unique_ptr<KernelSession>> start(const std::string& kernel) override {
    if (start_error) {
      return *start_error;
    }
    calls.started.push_back(kernel);
    return std::unique_ptr<KernelSession>(std::make_unique<FakeSession>(calls, answer));
  }
  std::size_t max_file_bytes() const override { return 100; }
  bool clamps_timeouts() const override { return clamps; }
  void cancel() override { cancelled_ = true; }
  bool cancelled() const override { return cancelled_; }

 private:
  bool cancelled_ = false;
};

json code_cell(const std::string& source, json tags = json::array()) {
  return json{{"cell_type", "code"},
              {"execution_count", 7},
              {"metadata", {{"tags", std::move(tags)}}},
              {"outputs",
               json::array({{{"output_type", "stream"}, {"name", "stdout"}, {"text", "stale"}}})},
              {"source", source}};
}

json markdown_cell(const std::string& source) {
  return json{{"cell_type", "markdown"}, {"metadata", json::object()}, {"source", source}};
}

// A vector, not a json: `json cells` from `{one_cell}` is that cell with clang and a one-cell
// array with gcc (nlohmann's brace-initialization caveat).
json notebook_of(std::vector<json> cells, const std::string& kernel = "python3") {
  return json{{"nbformat", 4},
              {"nbformat_minor", 5},
              {"metadata", {{"kernelspec", {{"name", kernel}, {"display_name", kernel}}}}},
              {"cells", json(std::move(cells))}};
}

// A private temp directory, removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/runner-test-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) {
      path_ = pattern;
    }
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string write(const std::string& rel, const std::string& text) const {
    const fs::path p = fs::path(path_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(Runner, RunsTheNonBlankCodeCellsInOrderAndFillsThem) {
  FakeBackend backend;
  json nb = notebook_of(
      {markdown_cell("# title"), code_cell("a = 1"), code_cell("  \n"), code_cell("print(a)")});
  Outcome out = run_notebook(backend, nb, NotebookRun{});
  EXPECT_EQ(out.status, Status::kOk);
  EXPECT_EQ(backend.calls.executed, (std::vector<std::string>{"a = 1", "print(a)"}));
  EXPECT_EQ(backend.calls.started, (std::vector<std::string>{"python3"}));
  EXPECT_EQ(backend.calls.shut_down, 1);
  EXPECT_EQ(out.code_cells, 2u);
  EXPECT_EQ(out.executed, 2u);
  EXPECT_FALSE(out.cell);
  const json& cells = out.notebook["cells"];
  EXPECT_EQ(cells[1]["execution_count"], 1);
  EXPECT_EQ(cells[1]["outputs"][0]["text"], "a = 1");
  EXPECT_EQ(cells[2]["execution_count"], nullptr);  // blank: cleared, not run
  EXPECT_EQ(cells[2]["outputs"], json::array());
  EXPECT_EQ(cells[3]["execution_count"], 2);
  // Markdown untouched but for metadata.papermill: passed over, completed (papermill's).
  json markdown = cells[0];
  EXPECT_EQ(markdown["metadata"]["papermill"]["status"], "completed");
  EXPECT_EQ(cells[3]["metadata"]["papermill"]["status"], "completed");
  markdown["metadata"].erase("papermill");
  EXPECT_EQ(markdown, nb["cells"][0]);
}

TEST(Runner, StopsAtTheFirstErrorAndNamesTheCell) {
  FakeBackend backend;
  backend.answer = [](const std::string& code, int count) -> Result<json> {
    return code.find("raise") != std::string::npos ? error_answer(count, "KeyError", "'k'", 2)
                                                   : ok_answer(code, count);
  };
  json nb = notebook_of(
      {code_cell("x = 1"), code_cell("d = {}\nraise KeyError('k')"), code_cell("print('never')")});
  Outcome out = run_notebook(backend, nb, NotebookRun{});
  EXPECT_EQ(out.status, Status::kError);
  ASSERT_TRUE(out.cell);
  EXPECT_EQ(*out.cell, 1u);
  EXPECT_EQ(out.cell_source, "d = {}");
  EXPECT_EQ(out.line, 2);
  EXPECT_EQ(out.ename, "KeyError");
  EXPECT_EQ(out.evalue, "'k'");
  EXPECT_EQ(out.traceback, (std::vector<std::string>{"tb1", "tb2"}));
  EXPECT_EQ(out.executed, 2u);
  EXPECT_EQ(backend.calls.executed.size(), 2u);
  EXPECT_EQ(out.notebook["cells"][2]["outputs"], json::array());  // after the failure: nothing
  EXPECT_EQ(out.notebook["cells"][1]["outputs"][0]["output_type"], "error");
}

TEST(Runner, RaisesExceptionCellsAndAllowErrorsGoOn) {
  FakeBackend backend;
  backend.answer = [](const std::string& code, int count) -> Result<json> {
    return code.rfind("1/0", 0) == 0 ? error_answer(count, "ZeroDivisionError", "", 1)
                                     : ok_answer(code, count);
  };
  json nb = notebook_of({code_cell("1/0 # expected", json::array({"raises-exception"})),
                         code_cell("1/0"), code_cell("print('end')")});
  Outcome strict = run_notebook(backend, nb, NotebookRun{});
  EXPECT_EQ(strict.status, Status::kError);
  EXPECT_EQ(*strict.cell, 1u);  // the tagged cell did not stop the run

  NotebookRun lenient;
  lenient.allow_errors = true;
  Outcome out = run_notebook(backend, nb, lenient);
  EXPECT_EQ(out.status, Status::kOk);
  EXPECT_EQ(out.errors, 1u);  // the tagged cell's error is not counted
  EXPECT_EQ(out.executed, 3u);
}

TEST(Runner, ATimeoutEndsTheRunAndSaysWhichLimit) {
  FakeBackend backend;
  backend.answer = [](const std::string& code, int count) -> Result<json> {
    if (code == "slow()") {
      json a = error_answer(count, "KeyboardInterrupt", "", 3);
      a["status"] = "timeout";
      a["state_lost"] = true;
      return a;
    }
    return ok_answer(code, count);
  };
  json nb = notebook_of({code_cell("slow()"), code_cell("after()")});
  NotebookRun run;
  run.timeout_seconds = 2;
  run.allow_errors = true;  // a timeout that cost the kernel's state still ends the run
  Outcome out = run_notebook(backend, nb, run);
  EXPECT_EQ(out.status, Status::kTimeout);
  EXPECT_EQ(out.message,
            "the cell ran past --timeout 2 s and was interrupted; the kernel was restarted");
  EXPECT_EQ(backend.calls.timeouts, (std::vector<double>{2}));

  backend.clamps = true;
  out = run_notebook(backend, nb, run);
  EXPECT_EQ(out.message,
            "the cell ran past --timeout 2 s (or the gateway's --execute-max-timeout, if lower) "
            "and was interrupted; the kernel was restarted");
}

TEST(Runner, WithAllowErrorsAnInterruptedTimeoutIsAnErrorAndTheRunGoesOn) {
  FakeBackend backend;
  backend.answer = [](const std::string& code, int count) -> Result<json> {
    if (code == "slow()") {
      json a = error_answer(count, "KeyboardInterrupt", "", 1);
      a["status"] = "timeout";
      a["state_lost"] = false;
      return a;
    }
    return ok_answer(code, count);
  };
  json nb = notebook_of({code_cell("slow()"), code_cell("after()")});
  NotebookRun run;
  run.timeout_seconds = 2;
  Outcome strict = run_notebook(backend, nb, run);
  EXPECT_EQ(strict.status, Status::kTimeout);  // without --allow-errors: as before
  EXPECT_EQ(strict.executed, 1u);

  run.allow_errors = true;
  Outcome out = run_notebook(backend, nb, run);
  EXPECT_EQ(out.status, Status::kOk);
  EXPECT_EQ(out.errors, 1u);
  EXPECT_EQ(out.executed, 2u);
  EXPECT_EQ(out.notebook["cells"][0]["outputs"][0]["ename"], "KeyboardInterrupt");
  EXPECT_EQ(out.warnings, (std::vector<std::string>{
                              "cells[0] ran past --timeout 2 s and was interrupted; the run "
                              "went on (--allow-errors)"}));
}

TEST(Runner, SkipsCellsTaggedSkipExecution) {
  FakeBackend backend;
  json nb =
      notebook_of({code_cell("long()", json::array({"skip-execution"})), code_cell("print('ok')")});
  Outcome out = run_notebook(backend, nb, NotebookRun{});
  EXPECT_EQ(out.status, Status::kOk);
  EXPECT_EQ(backend.calls.executed, (std::vector<std::string>{"print('ok')"}));
  EXPECT_EQ(out.code_cells, 1u);
  EXPECT_EQ(out.notebook["cells"][0]["outputs"], json::array());  // cleared, not run
  EXPECT_EQ(out.notebook["cells"][0]["execution_count"], nullptr);
}

TEST(Runner, WritesTheKernelsLanguageInfoAndKeepsTheKernelspec) {
  FakeBackend backend;
  Outcome out = run_notebook(backend, notebook_of({code_cell("x")}), NotebookRun{});
  EXPECT_EQ(out.notebook["metadata"]["language_info"],
            (json{{"name", "python"}, {"version", "3.11.2"}}));
  EXPECT_EQ(out.notebook["metadata"]["kernelspec"],
            (json{{"name", "python3"}, {"display_name", "python3"}}));
}

// A cell's answer with its events, as the backends give them.
json answer_with_events(int count, json events) {
  return {{"status", "ok"},
          {"execution_count", count},
          {"outputs", json::array()},  // one cell's view: the runner uses the events
          {"events", std::move(events)}};
}

json display(const std::string& type, const std::string& text, const std::string& id = "") {
  json e = {{"type", type}, {"data", {{"text/plain", text}}}, {"metadata", json::object()}};
  if (!id.empty()) {
    e["display_id"] = id;
  }
  return e;
}

json stream(const std::string& text) {
  return {{"type", "stream"}, {"name", "stdout"}, {"text", text}};
}

json clear(bool wait) {
  return {{"type", "clear_output"}, {"wait", wait}};
}

TEST(Runner, OutputsFollowNbclientsDisplayAndClearRules) {
  FakeBackend backend;
  std::map<std::string, json> events = {
      {"show", json::array({display("display_data", "'Hello'", "id1")})},
      {"update", json::array({display("update_display_data", "'world'", "id1")})},
      {"again", json::array({display("display_data", "'again'", "id1"), stream("a"), stream("b")})},
      {"wait_only", json::array({stream("kept"), clear(true)})},
      {"wait_then",
       json::array({display("display_data", "'x'", "id2"), clear(true), stream("new")})},
      {"update_cleared", json::array({display("update_display_data", "'late'", "id2")})},
      {"now", json::array({stream("gone"), clear(false), {{"type", "keepalive"}}})},
  };
  backend.answer = [&events](const std::string& code, int count) -> Result<json> {
    return answer_with_events(count, events.at(code));
  };
  json nb = notebook_of({code_cell("show"), code_cell("update"), code_cell("again"),
                         code_cell("wait_only"), code_cell("wait_then"),
                         code_cell("update_cleared"), code_cell("now")});
  Outcome out = run_notebook(backend, nb, NotebookRun{});
  ASSERT_EQ(out.status, Status::kOk);
  const json& cells = out.notebook["cells"];
  auto plain = [&cells](std::size_t cell, std::size_t output) {
    return cells[cell]["outputs"][output]["data"]["text/plain"];
  };
  // An update, and a new display with the same id, change the display of an earlier cell.
  EXPECT_EQ(plain(0, 0), "'again'");
  EXPECT_EQ(cells[1]["outputs"], json::array());  // an update adds no output
  EXPECT_EQ(plain(2, 0), "'again'");
  EXPECT_EQ(cells[2]["outputs"][1],
            (json{{"output_type", "stream"}, {"name", "stdout"}, {"text", "ab"}}));
  // clear_output(wait=True) with nothing after it leaves the output.
  EXPECT_EQ(cells[3]["outputs"].size(), 1u);
  EXPECT_EQ(cells[3]["outputs"][0]["text"], "kept");
  // ... and with output after it clears first; the cleared display is no longer updated.
  EXPECT_EQ(cells[4]["outputs"].size(), 1u);
  EXPECT_EQ(cells[4]["outputs"][0]["text"], "new");
  EXPECT_EQ(cells[5]["outputs"], json::array());
  EXPECT_EQ(cells[6]["outputs"], json::array());
}

// Issue 24: a remote gateway's stream events may add up to any length. One output's text stops
// at kMaxStreamBytes (64 MiB, the embedded gateway's cap per stream), cut on a character
// boundary, and the run's warnings say so.
TEST(Runner, StreamTextStopsAtTheCapWithANotice) {
  FakeBackend backend;
  std::string mib;
  while (mib.size() < (std::size_t{1} << 20)) {
    mib += "\u00e9";  // 2 bytes: after the "a" below, the cap falls inside one
  }
  backend.answer = [&mib](const std::string&, int count) -> Result<json> {
    json events = json::array({stream("a")});
    for (int i = 0; i < 70; ++i) {
      events.push_back(stream(mib));
    }
    events.push_back({{"type", "stream"}, {"name", "stderr"}, {"text", "err"}});
    return answer_with_events(count, std::move(events));
  };
  Outcome out = run_notebook(backend, notebook_of({code_cell("print")}), NotebookRun{});
  ASSERT_EQ(out.status, Status::kOk);
  const json& outputs = out.notebook["cells"][0]["outputs"];
  ASSERT_EQ(outputs.size(), 2u);
  const std::string& text = outputs[0]["text"].get_ref<const std::string&>();
  EXPECT_EQ(text.size(), kMaxStreamBytes - 1);
  EXPECT_EQ(text.substr(text.size() - 2), "\u00e9");
  EXPECT_EQ(outputs[1]["text"], "err");
  ASSERT_EQ(out.warnings.size(), 1u);
  EXPECT_EQ(out.warnings[0],
            "cells[0]: stdout is over the limit of 67108864 bytes per output: the rest is "
            "dropped");
}

// Display ids are map keys for the whole run: one over kMaxDisplayIdBytes is not tracked (its
// output shows, and is never updated).
TEST(Runner, LongDisplayIdsAreNotTracked) {
  FakeBackend backend;
  const std::string long_id(kMaxDisplayIdBytes + 1, 'i');
  const std::string id(kMaxDisplayIdBytes, 'i');
  std::map<std::string, json> events = {
      {"show", json::array({display("display_data", "'long'", long_id),
                            display("display_data", "'ok'", id)})},
      {"update", json::array({display("update_display_data", "'new'", long_id),
                              display("update_display_data", "'new'", id)})},
  };
  backend.answer = [&events](const std::string& code, int count) -> Result<json> {
    return answer_with_events(count, events.at(code));
  };
  Outcome out =
      run_notebook(backend, notebook_of({code_cell("show"), code_cell("update")}), NotebookRun{});
  ASSERT_EQ(out.status, Status::kOk);
  const json& shown = out.notebook["cells"][0]["outputs"];
  ASSERT_EQ(shown.size(), 2u);
  EXPECT_EQ(shown[0]["data"]["text/plain"], "'long'");
  EXPECT_EQ(shown[1]["data"]["text/plain"], "'new'");
}

TEST(Runner, ADeadKernelAndAnUnknownStatusAreErrors) {
  FakeBackend backend;
  backend.answer = [](const std::string& code, int) -> Result<json> {
    if (code == "die()") {
      return json{{"status", "dead"}, {"outputs", json::array()}};
    }
    return json{{"status", "weird"}, {"outputs", "not a list"}};
  };
  Outcome dead = run_notebook(backend, notebook_of({code_cell("die()")}), NotebookRun{});
  EXPECT_EQ(dead.status, Status::kError);
  EXPECT_EQ(dead.message, "the kernel died while running the cell");
  Outcome weird = run_notebook(backend, notebook_of({code_cell("x")}), NotebookRun{});
  EXPECT_EQ(weird.status, Status::kError);
  EXPECT_EQ(weird.message, "the gateway answered an unknown status 'weird'");
  EXPECT_EQ(weird.notebook["cells"][0]["outputs"], json::array());
  EXPECT_EQ(weird.notebook["cells"][0]["execution_count"], nullptr);
}

TEST(Runner, AKernelThatCannotStart) {
  FakeBackend backend;
  backend.start_error = make_error(ErrorCode::kResourceExhausted, "max_kernels", "too many");
  Outcome out = run_notebook(backend, notebook_of({code_cell("x")}), NotebookRun{});
  EXPECT_EQ(out.status, Status::kError);
  EXPECT_EQ(out.message, "cannot start a 'python3' kernel: too many");
  EXPECT_EQ(out.executed, 0u);

  backend.start_error = make_error(ErrorCode::kFailedPrecondition, "aborted", "interrupted");
  EXPECT_EQ(run_notebook(backend, notebook_of({code_cell("x")}), NotebookRun{}).status,
            Status::kAborted);
}

TEST(Runner, ACancelledRunEndsAborted) {
  FakeBackend backend;
  backend.answer = [&backend](const std::string&, int count) -> Result<json> {
    backend.cancel();  // Ctrl-C while the cell runs: the kernel answers an interrupted cell
    return error_answer(count, "KeyboardInterrupt", "", 1);
  };
  Outcome out = run_notebook(backend, notebook_of({code_cell("x"), code_cell("y")}), NotebookRun{});
  EXPECT_EQ(out.status, Status::kAborted);
  EXPECT_EQ(out.message, "interrupted");
  EXPECT_EQ(*out.cell, 0u);
  EXPECT_EQ(backend.calls.executed.size(), 1u);
}

TEST(Runner, ChoosesTheNotebooksKernelWhenKnownElsePython3) {
  FakeBackend backend;
  Outcome known = run_notebook(backend, notebook_of({code_cell("x")}, "ir"), NotebookRun{});
  EXPECT_EQ(known.kernel, "ir");
  EXPECT_TRUE(known.warnings.empty());
  Outcome unknown = run_notebook(backend, notebook_of({code_cell("x")}, "julia"), NotebookRun{});
  EXPECT_EQ(unknown.kernel, "python3");
  EXPECT_EQ(unknown.warnings,
            (std::vector<std::string>{
                "the notebook's kernelspec 'julia' is not known here; using python3"}));
  NotebookRun forced;
  forced.kernel = "ir";
  EXPECT_EQ(run_notebook(backend, notebook_of({code_cell("x")}, "julia"), forced).kernel, "ir");
  EXPECT_EQ(backend.calls.started, (std::vector<std::string>{"ir", "python3", "ir"}));
}

TEST(Runner, InjectsParametersAndCountsTheNewCell) {
  FakeBackend backend;
  json nb = notebook_of({code_cell("a = 1", json::array({"parameters"})), code_cell("print(a)")});
  NotebookRun run;
  run.parameters = {{"a", "2"}};
  Outcome out = run_notebook(backend, nb, run);
  EXPECT_EQ(out.code_cells, 3u);
  EXPECT_EQ(backend.calls.executed,
            (std::vector<std::string>{"a = 1", "# Parameters\na = 2\n", "print(a)"}));
  EXPECT_TRUE(notebook::has_tag(out.notebook["cells"][1], "injected-parameters"));
  EXPECT_TRUE(out.warnings.empty());

  json plain = notebook_of({code_cell("print(a)")});
  Outcome first = run_notebook(backend, plain, run);
  EXPECT_EQ(first.warnings, (std::vector<std::string>{
                                "no cell is tagged 'parameters': the parameters went in a new "
                                "first cell"}));
}

TEST(Runner, ReportsProgressBeforeEachCell) {
  FakeBackend backend;
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  NotebookRun run;
  run.on_cell = [&](std::size_t cell, std::size_t cells) { seen.emplace_back(cell, cells); };
  (void)run_notebook(backend, notebook_of({code_cell("a"), code_cell("b")}), run);
  EXPECT_EQ(seen, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 2}, {1, 2}, {2, 2}}));
}

TEST(Runner, CopiesTheFilesBesideTheNotebookIntoTheWorkDir) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  dir.write("notebook.ipynb", "{}");
  dir.write("data/sales.csv", "a,b\n");
  dir.write("data/deep/more.txt", "more");
  dir.write(".hidden", "secret");
  dir.write("data/.git/config", "secret");
  dir.write("big.bin", std::string(200, 'x'));  // over the fake's 100-byte file limit
  dir.write("sub/not-copied.txt", "only data/ is recursive");
  fs::create_symlink("/etc/hostname", fs::path(dir.path()) / "link.txt");
  FakeBackend backend;
  NotebookRun run;
  run.files_from = dir.path();
  Outcome out = run_notebook(backend, notebook_of({code_cell("x")}), run);
  std::vector<std::string> copied;
  for (const auto& [rel, bytes] : backend.calls.files) {
    copied.push_back(rel);
  }
  EXPECT_EQ(copied,
            (std::vector<std::string>{"data/deep/more.txt", "data/sales.csv", "notebook.ipynb"}));
  EXPECT_EQ(backend.calls.files["data/sales.csv"], "a,b\n");
  ASSERT_EQ(out.warnings.size(), 1u);
  EXPECT_EQ(out.warnings[0], "big.bin (200 bytes) is over the 100-byte file limit: not copied");
}

TEST(Runner, WritesTheNotebookAndSavesArtifacts) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string png = "\x89PNG\r\n\x1a\n";
  FakeBackend backend;
  backend.answer = [&png](const std::string&, int count) -> Result<json> {
    json display = {{"output_type", "display_data"},
                    {"data", {{"image/png", base64_encode(png)}, {"text/plain", "<Figure>"}}},
                    {"metadata", json::object()}};
    return json{{"status", "ok"}, {"execution_count", count}, {"outputs", {display, display}}};
  };
  NotebookRun run;
  run.output = dir.path() + "/out/executed.ipynb";
  run.artifacts_dir = dir.path() + "/img";
  Outcome out = run_notebook(backend, notebook_of({markdown_cell("m"), code_cell("plot()")}), run);
  EXPECT_EQ(out.status, Status::kOk);
  EXPECT_EQ(out.output, run.output);
  EXPECT_EQ(out.artifacts, 2u);
  EXPECT_EQ(out.artifact_files, (std::vector<std::string>{run.artifacts_dir + "/cell1-1.png",
                                                          run.artifacts_dir + "/cell1-2.png"}));
  EXPECT_EQ(slurp(run.artifacts_dir + "/cell1-2.png"), png);
  EXPECT_EQ(slurp(run.output), notebook::dump(out.notebook));
  auto reread = notebook::parse(slurp(run.output));
  ASSERT_TRUE(reread) << reread.error().message;
  EXPECT_EQ((*reread)["cells"][1]["execution_count"], 1);
}

TEST(Runner, AnOutputThatCannotBeWrittenFailsAnOkRun) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string file = dir.write("file", "x");
  FakeBackend backend;
  NotebookRun run;
  run.output = file + "/below-a-file.ipynb";
  Outcome out = run_notebook(backend, notebook_of({code_cell("x")}), run);
  EXPECT_EQ(out.status, Status::kError);
  EXPECT_NE(out.message.find("cannot write " + run.output), std::string::npos) << out.message;
  EXPECT_EQ(out.output, "");
}

TEST(Runner, StatusNames) {
  std::vector<std::string> names;
  for (Status s : kStatuses) {
    names.emplace_back(to_string(s));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"ok", "error", "timeout", "invalid", "aborted"}));
}

}  // namespace
}  // namespace cellgate::notebooks
