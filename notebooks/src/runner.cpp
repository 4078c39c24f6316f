#include "cellgate/notebooks/runner.hpp"

#include <chrono>
#include <iostream>
#include <sstream>

#include "cellgate/cli/artifacts.hpp"
#include "files.hpp"
#include "outputs.hpp"
#include "papermill.hpp"
#include "work_dir.hpp"

namespace cellgate::notebooks {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string choose_kernel(const Backend& backend, const NotebookRun& run, const json& nb,
                          Outcome& out) {
  if (!run.kernel.empty()) {
    return run.kernel;
  }
  const std::string wanted = notebook::kernel_name(nb);
  if (!wanted.empty() && backend.kernelspecs().count(wanted) != 0) {
    return wanted;
  }
  const std::string fallback =
      backend.kernelspecs().count("python3") != 0 ? "python3" : backend.default_kernel();
  if (!wanted.empty()) {
    out.warnings.push_back("the notebook's kernelspec '" + wanted + "' is not known here; using " +
                           fallback);
  }
  return fallback;
}

void fail_at(Outcome& out, Status status, std::size_t index, const json& cell) {
  out.status = status;
  out.cell = index;
  out.cell_source = notebook::first_line(notebook::source_of(cell));
}

void take_error(Outcome& out, const execute::CellResult& answer) {
  if (!answer.error) {
    return;
  }
  out.ename = answer.error->ename;
  out.evalue = answer.error->evalue;
  out.line = answer.error->line;
  out.traceback = answer.error->traceback;
}

// What a timed-out cell ran past, for the message.
std::string timeout_limit(const Backend& backend, const NotebookRun& run) {
  if (run.timeout_seconds <= 0) {
    return "the gateway's --execute-max-timeout";
  }
  std::ostringstream limit;
  limit << run.timeout_seconds;
  return "--timeout " + limit.str() + " s" +
         (backend.clamps_timeouts() ? " (or the gateway's --execute-max-timeout, if lower)" : "");
}

// Fills the cell from its answer and judges it: true when the run goes on to the next cell.
bool take_answer(const Backend& backend, const NotebookRun& run, const CellAnswer& cell_answer,
                 std::size_t i, json& cell, NotebookOutputs& outputs, Outcome& out) {
  using execute::CellStatus;
  const execute::CellResult& answer = cell_answer.result;
  std::vector<std::string> cut;
  if (cell_answer.events) {
    cut = outputs.apply(i, *cell_answer.events);  // may update displays of earlier cells too
  } else {
    cell["outputs"] = answer.outputs;
  }
  cell["execution_count"] = answer.execution_count ? json(*answer.execution_count) : json();
  ++out.executed;
  for (const auto& notice : answer.notices) {
    out.warnings.push_back("cells[" + std::to_string(i) + "]: " + notice);
  }
  for (const auto& notice : cut) {
    out.warnings.push_back("cells[" + std::to_string(i) + "]: " + notice);
  }
  const CellStatus status = answer.status;
  if (backend.cancelled() && status != CellStatus::kOk) {
    take_error(out, answer);
    fail_at(out, Status::kAborted, i, cell);
    out.message = "interrupted";
    return false;
  }
  if (status == CellStatus::kOk) {
    return true;
  }
  if (status == CellStatus::kError && notebook::has_tag(cell, "raises-exception")) {
    return true;  // the error is the point of the cell (nbclient's convention)
  }
  if (status == CellStatus::kError && run.allow_errors) {
    ++out.errors;
    return true;
  }
  // nbclient with interrupt_on_timeout and allow_errors: the interrupted cell's error (its
  // KeyboardInterrupt) is recorded and the run goes on with the kernel's state. A cell that did
  // not stop when interrupted cost the kernel (restarted, its state lost): the run ends there.
  const bool state_lost = answer.state_lost;
  if (status == CellStatus::kTimeout && run.allow_errors && !state_lost) {
    ++out.errors;
    out.warnings.push_back("cells[" + std::to_string(i) + "] ran past " +
                           timeout_limit(backend, run) +
                           " and was interrupted; the run went on (--allow-errors)");
    return true;
  }
  take_error(out, answer);
  switch (status) {
    case CellStatus::kError:
      fail_at(out, Status::kError, i, cell);
      break;
    case CellStatus::kTimeout:
      fail_at(out, Status::kTimeout, i, cell);
      out.message = "the cell ran past " + timeout_limit(backend, run) + " and was interrupted" +
                    (state_lost ? "; the kernel was restarted" : "");
      break;
    case CellStatus::kAborted:
      fail_at(out, Status::kAborted, i, cell);
      out.message = "interrupted";
      break;
    case CellStatus::kDead:
      fail_at(out, Status::kError, i, cell);
      out.message =
          answer.message.empty() ? "the kernel died while running the cell" : answer.message;
      break;
    case CellStatus::kOk:
    case CellStatus::kOther:
      fail_at(out, Status::kError, i, cell);
      out.message = "the gateway answered an unknown status '" + answer.other_status + "'";
      break;
  }
  return false;
}

// The indexes of the code cells to run: blank ones and those tagged "skip-execution" are
// skipped, as nbclient does (its skip_cells_with_tag).
std::vector<std::size_t> code_cells(const json& cells) {
  std::vector<std::size_t> code;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    if (cells[i].value("cell_type", "") == "code" &&
        !notebook::first_line(notebook::source_of(cells[i])).empty() &&
        !notebook::has_tag(cells[i], "skip-execution")) {
      code.push_back(i);
    }
  }
  return code;
}

// nbclient writes the kernel's language_info into the notebook's metadata before the first
// cell (nbconvert's exporters read it); the rest of the metadata stays as it was.
void take_language_info(KernelSession& session, json& nb, Outcome& out) {
  auto info = session.kernel_info();
  if (!info) {
    out.warnings.push_back("no language_info for the notebook's metadata: " + info.error().message);
    return;
  }
  if (info->contains("language_info") && (*info)["language_info"].is_object()) {
    if (!nb["metadata"].is_object()) {
      nb["metadata"] = json::object();
    }
    nb["metadata"]["language_info"] = (*info)["language_info"];
  }
}

// Writes the notebook to run.output as the run goes (papermill's autosave): a file is replaced
// whole each time (files.hpp's write_file: temp file and rename), so a killed run leaves the
// last save; "-" is stdout, written once at the end. A failed save before the end is a warning
// (once); the last one's error is returned.
class Saver {
 public:
  explicit Saver(const NotebookRun& run) : output_(run.output) {}
  void progress(const json& nb, Outcome& out) {
    if (output_.empty() || output_ == "-") {
      return;
    }
    if (auto w = write_file(output_, notebook::dump(nb)); !w && !warned_) {
      warned_ = true;
      out.warnings.push_back("saving the notebook as it runs: " + w.error().message);
    }
  }
  Result<void> last(const json& nb) {
    if (output_ == "-") {
      std::cout << notebook::dump(nb) << std::flush;
      if (!std::cout) {
        return make_error(ErrorCode::kInternal, "write_failed", "cannot write to stdout");
      }
      return ok_result();
    }
    return write_file(output_, notebook::dump(nb));
  }

 private:
  const std::string output_;
  bool warned_ = false;
};

// Starts a kernel, copies the files in, and runs the cells until one ends the run; each cell's
// metadata.papermill follows it, and the notebook is saved as each cell starts and ends.
void run_cells(Backend& backend, const NotebookRun& run, const std::vector<std::size_t>& code,
               json& nb, Outcome& out, papermill::Tracker& tracker, Saver& saver) {
  auto session = backend.start(out.kernel);
  if (!session) {
    out.status = session.error().reason == "aborted" ? Status::kAborted : Status::kError;
    out.message = "cannot start a '" + out.kernel + "' kernel: " + session.error().message;
    return;
  }
  if (run.on_event) {
    (*session)->watch_events(run.on_event);
  }
  take_language_info(**session, nb, out);
  json& cells = nb["cells"];
  NotebookOutputs outputs(cells);
  if (!run.files_from.empty()) {
    copy_beside(run.files_from, **session, backend.max_file_bytes(), out.warnings);
  }
  for (std::size_t k = 0; k < code.size(); ++k) {
    const std::size_t i = code[k];
    json& cell = cells[i];
    if (run.on_cell) {
      run.on_cell(k + 1, code.size());
    }
    tracker.start(i);
    saver.progress(nb, out);
    auto answer = (*session)->execute(notebook::source_of(cell), run.timeout_seconds);
    if (!answer) {
      fail_at(out, answer.error().reason == "aborted" ? Status::kAborted : Status::kError, i, cell);
      out.message = answer.error().message;
      tracker.end(i, true);
      return;
    }
    const bool go_on = take_answer(backend, run, *answer, i, cell, outputs, out);
    tracker.end(i, !go_on);
    if (!go_on) {
      return;
    }
    saver.progress(nb, out);
  }
  // Leaving shuts the kernel down.
}

// Counts the images and PDFs in the outputs and, with a directory, saves them as
// cell<i>-<n>.<ext>.
void save_artifacts(const NotebookRun& run, const json& nb, Outcome& out) {
  const json& cells = nb["cells"];
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const json& cell = cells[i];
    if (cell.value("cell_type", "") != "code" || !cell.contains("outputs")) {
      continue;
    }
    std::size_t n = 0;
    for (const auto& output : cell["outputs"]) {
      for (auto& artifact : notebook::artifacts_of(output)) {
        ++out.artifacts;
        ++n;
        if (run.artifacts_dir.empty()) {
          continue;
        }
        const std::string path = run.artifacts_dir + "/cell" + std::to_string(i) + "-" +
                                 std::to_string(n) + "." + artifact.extension;
        if (auto w = write_file(path, artifact.bytes); w) {
          out.artifact_files.push_back(path);
        } else {
          out.warnings.push_back(w.error().message);
        }
      }
    }
  }
}

}  // namespace

const char* to_string(Status status) {
  switch (status) {
    case Status::kOk:
      return "ok";
    case Status::kError:
      return "error";
    case Status::kTimeout:
      return "timeout";
    case Status::kInvalid:
      return "invalid";
    case Status::kAborted:
      return "aborted";
  }
  return "error";
}

Outcome run_notebook(Backend& backend, json nb, const NotebookRun& run) {
  Outcome out;
  const auto started = Clock::now();
  notebook::clear_outputs(nb);
  if (!run.parameters.empty()) {
    auto injected = notebook::inject_parameters(nb, run.parameters);
    if (!injected.after_parameters_cell) {
      out.warnings.push_back(
          "no cell is tagged 'parameters': the parameters went in a new first cell");
    }
  }
  json& cells = nb["cells"];
  const std::vector<std::size_t> code = code_cells(cells);
  out.code_cells = code.size();
  out.kernel = choose_kernel(backend, run, nb, out);
  if (run.on_cell) {
    run.on_cell(0, code.size());
  }
  papermill::Tracker tracker(nb, run.parameters, run.input_path, run.output);
  Saver saver(run);
  saver.progress(nb, out);
  if (!code.empty()) {
    run_cells(backend, run, code, nb, out, tracker, saver);
  }
  tracker.finish(out.status == Status::kOk);
  out.duration_s = std::chrono::duration<double>(Clock::now() - started).count();

  save_artifacts(run, nb, out);
  if (!run.output.empty()) {
    if (auto written = saver.last(nb); written) {
      out.output = run.output;
    } else if (out.status == Status::kOk) {
      out.status = Status::kError;
      out.message = written.error().message;
    } else {
      out.warnings.push_back(written.error().message);
    }
  }
  out.notebook = std::move(nb);
  return out;
}

Outcome prepare_notebook(json nb, const NotebookRun& run) {
  Outcome out;
  notebook::clear_outputs(nb);
  if (!run.parameters.empty()) {
    if (!notebook::inject_parameters(nb, run.parameters).after_parameters_cell) {
      out.warnings.push_back(
          "no cell is tagged 'parameters': the parameters went in a new first cell");
    }
  }
  out.code_cells = code_cells(nb["cells"]).size();
  out.kernel = run.kernel.empty() ? notebook::kernel_name(nb) : run.kernel;
  papermill::describe(nb, run.parameters, run.input_path, run.output);
  if (!run.output.empty()) {
    if (auto written = Saver(run).last(nb); written) {
      out.output = run.output;
    } else {
      out.status = Status::kError;
      out.message = written.error().message;
    }
  }
  out.notebook = std::move(nb);
  return out;
}

}  // namespace cellgate::notebooks
