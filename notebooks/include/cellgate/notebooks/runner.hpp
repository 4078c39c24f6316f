// Runs one notebook against a Backend, as nbclient does: the core of cellgate::notebooks.
// `cellgate run` (run.hpp) is a batch of these with a command line around it.
//
//   CELLGATE_ASSIGN_OR_RETURN(auto backend, make_embedded_backend({}));
//   CELLGATE_ASSIGN_OR_RETURN(nlohmann::json nb, notebook::parse(text));
//   NotebookRun run;
//   run.timeout_seconds = 60;
//   run.files_from = "notebooks/examples";  // copied into the kernel's work dir
//   run.output = "out/data_analysis.ipynb";
//   Outcome done = run_notebook(*backend, std::move(nb), run);
//   if (done.status != Status::kOk) { std::cerr << done.message << "\n"; }
//
// One run (docs/run.md, "How a notebook runs"): every code cell's outputs are cleared and the
// parameters injected; a fresh kernel starts and the files beside the notebook are copied into
// its work dir and the kernel's language_info goes into the notebook's metadata; the non-blank
// code cells not tagged "skip-execution" run in order, each filled with its outputs (made from
// the answer's events by nbclient's rules, outputs.hpp: clear_output(wait=True), display ids
// updated across cells) and execution count. The run stops at the first cell that raises
// (unless allow_errors, or the cell is tagged "raises-exception", as nbclient does), that times
// out (unless allow_errors and the interrupt stopped it: nbclient's interrupt_on_timeout), whose
// kernel dies, or once the backend is cancelled. Then the kernel is shut down, images and PDFs are
// saved, and the executed notebook is written (also when the run failed, so the error is in it).
// metadata.papermill records the run and each cell's status and times as papermill writes them
// (src/papermill.hpp), and the output file is saved as each cell starts and ends (replaced whole
// each time), so a run that is killed leaves the cells it ran and the one it was running.
//
// Thread-safety: run_notebook blocks; many may run at once on one Backend, one per thread. The
// progress callback runs on the calling thread.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/notebooks/backend.hpp"
#include "cellgate/notebooks/notebook.hpp"

namespace cellgate::notebooks {

// How a notebook's run ended, in the order summaries list them.
enum class Status {
  kOk,       // every cell ran (errors let through by allow_errors included)
  kError,    // a cell raised, its kernel died or could not start, or the output was not written
  kTimeout,  // a cell ran past its timeout and was interrupted
  kInvalid,  // not a valid notebook: nothing ran (set by callers; run_notebook takes a valid one)
  kAborted,  // cancelled (Ctrl-C)
};
inline constexpr Status kStatuses[] = {Status::kOk, Status::kError, Status::kTimeout,
                                       Status::kInvalid, Status::kAborted};
// "ok", "error", "timeout", "invalid", "aborted"
const char* to_string(Status status);

// What to run and where its results go.
struct NotebookRun {
  std::vector<notebook::Parameter> parameters;  // injected after the "parameters" cell
  double timeout_seconds = 0;                   // per cell; 0: none
  bool allow_errors = false;  // run every cell even after errors and interrupted timeouts
  std::string kernel;         // "": the notebook's kernelspec when the backend has it, else python3
  std::string files_from;     // a directory whose files go to the work dir; "": none
  std::string artifacts_dir;  // images and PDFs saved as DIR/cell<i>-<n>.<ext>; "": not saved
  std::string output;      // the executed notebook is written here ("-": stdout); "": not written
  std::string input_path;  // the notebook's path as given ("-": stdin), for metadata.papermill
  // Each of a cell's events as it arrives (KernelSession::watch_events: must not block).
  std::function<void(const nlohmann::json& event)> on_event;
  // Called with (0, n) once the n code cells to run are known, then (k, n) before the k-th runs.
  std::function<void(std::size_t cell, std::size_t cells)> on_cell;
};

// What became of one notebook; the fields of `cellgate run --json` (docs/run.md, "Results").
struct Outcome {
  Status status = Status::kOk;
  double duration_s = 0;  // from the start to the last cell's answer
  std::string kernel;
  std::size_t code_cells = 0;  // non-blank code cells
  std::size_t executed = 0;
  std::optional<std::size_t> cell;  // the cell that ended the run: its index in `notebook`
  std::string cell_source;          // its first line
  int line = 0;                     // the line of that cell the traceback points at; 0: unknown
  std::string ename, evalue;
  std::vector<std::string> traceback;
  std::size_t errors = 0;     // cell errors and interrupted timeouts let through by allow_errors
  std::size_t artifacts = 0;  // images and PDFs in the outputs
  std::vector<std::string> artifact_files;
  std::string output;   // the file written
  std::string message;  // what went wrong when it is not a cell's error, for people
  std::vector<std::string> warnings;
  nlohmann::json notebook;  // the executed notebook
};

// `nb` must be valid (notebook::parse or notebook::validate).
Outcome run_notebook(Backend& backend, nlohmann::json nb, const NotebookRun& run);

// papermill's --prepare-only: the outputs cleared, the parameters injected and metadata.papermill
// written (without times), then written to run.output; no kernel starts. `executed` is 0.
Outcome prepare_notebook(nlohmann::json nb, const NotebookRun& run);

}  // namespace cellgate::notebooks
