// `cellgate run`: execute notebooks headless in jailed kernels, as nbclient or papermill do.
//
//   cellgate run analysis.ipynb -o analysis.out.ipynb
//   cellgate run report.ipynb -p region South -p threshold 0.5 -o report.South.ipynb
//   cellgate run notebooks/ --jobs 4 --output-dir out/ --results out/results --artifacts out/img
//   cellgate run eval.ipynb --url http://127.0.0.1:8888 --token "$TOKEN" --json
//   cellgate run report.ipynb out/report.ipynb -f params.yaml --log-output   # papermill's form
//
// papermill's command line (`papermill INPUT OUTPUT [options]`) is accepted: with neither -o,
// --output-dir nor --inplace, exactly two names of which the first is `-` or an existing file
// and the second is `-` or ends in .ipynb and is not a directory are INPUT and OUTPUT. An
// OUTPUT that exists is overwritten when it is an executed notebook (it has metadata.papermill:
// an earlier run's output, papermill's or cellgate's); any other existing notebook makes the
// call ambiguous, a usage error naming the fixes (-o to overwrite it, --output-dir DIR to run
// both). `-` as OUTPUT writes the notebook to stdout (the summary then goes to stderr); `-` as
// an input reads the notebook from stdin (no files are copied beside it, unless --cwd). Also
// papermill's: -f FILE.yaml (parameters from a file), --cwd DIR (the files the kernel finds in
// its work dir come from DIR instead of the notebook's directory), --prepare-only (inject the
// parameters, write OUTPUT, run nothing), --log-output (the cells' outputs on stderr as they
// arrive), --execution-timeout (= --timeout), and metadata.papermill in the output, saved as
// each cell starts and ends.
//
// Each notebook (nbformat 4, validated first) gets a fresh kernel whose work dir (its cwd) holds
// a copy of the files beside the notebook (that directory and its data/ subfolder, capped), and
// its code cells run in order. Outputs and execution counts are written in nbformat's shapes; the
// input is never overwritten unless --inplace. The run stops at the first cell that raises, unless
// --allow-errors or the cell is tagged "raises-exception" (as nbclient does). A cell past
// --timeout is interrupted and ends the notebook with status "timeout" (with --allow-errors it
// is recorded as an error and the run goes on). `-p NAME VALUE`, `-r NAME VALUE` and `-y YAML`
// (papermill's options, parameters.hpp) add an "injected-parameters" cell after the cell tagged
// "parameters" (papermill's convention). Cells tagged "skip-execution" do not run (nbclient's).
//
// By default the kernels run in an embedded gateway (a KernelRegistry and an Executor in this
// process, state in a temp dir removed at the end); with --url on a running `cellgate serve`.
// docs/run.md has the details and examples.
//
// Exit codes: 0 every notebook ran to its end (cell errors allowed by --allow-errors included);
// 1 some notebook failed (a cell raised, timed out or its kernel died; or the output could not
// be written); 2 usage errors, an unreachable gateway, or an invalid notebook; 130 interrupted.
//
// The library underneath: runner.hpp runs one notebook against a Backend (backend.hpp);
// notebook.hpp reads, validates and writes nbformat.
//
// Thread-safety: run_notebooks blocks; it runs --jobs notebooks at once on its own threads.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace cellgate::notebooks {

struct NotebookRunOptions {
  std::vector<std::string> inputs;  // notebooks, or directories of *.ipynb
  std::string output;               // -o: the executed notebook (one input only)
  std::string output_dir;           // --output-dir: DIR/<name>.ipynb per notebook
  bool inplace = false;             // write the executed notebook over its input
  std::vector<std::pair<std::string, std::string>> parameters;      // -p NAME VALUE
  std::vector<std::pair<std::string, std::string>> raw_parameters;  // -r NAME VALUE
  std::vector<std::string> yaml_parameters;                         // -y YAML
  std::vector<std::string> parameter_files;                         // -f FILE.yaml
  std::string cwd;             // --cwd: the directory whose files go to the kernel's work dir
  bool prepare_only = false;   // inject and write, run nothing
  bool log_output = false;     // the cells' outputs on stderr as they arrive
  double timeout_seconds = 0;  // per cell; 0: none
  bool allow_errors = false;   // run every cell even after errors
  std::string artifacts_dir;   // save images and PDFs to DIR/<notebook>/
  std::string kernel;          // "": the notebook's kernelspec when known, else python3
  std::string url;             // a running gateway; "": an embedded one
  std::string token;
  bool json = false;     // the summary as JSON on stdout
  int jobs = 1;          // notebooks at once
  std::string results;   // FILE.json / FILE.csv (by extension; none: both)
  bool no_jail = false;  // embedded kernels unjailed (explicit only)
  bool progress = true;  // a progress line on stderr when it is a terminal
};

// Declares the `run` subcommand on `app`, its options bound to `options`; returns it (so that the
// caller can tell whether it was parsed).
CLI::App* add_run_command(CLI::App& app, NotebookRunOptions& options);

// Runs the notebooks; returns the exit code.
int run_notebooks(const NotebookRunOptions& options);

}  // namespace cellgate::notebooks
