// Internal: what `cellgate run` tells its user. Per notebook, as it ends: its warnings, its
// traceback when it is the only notebook (stderr), and one summary line (stdout):
//
//   ok      notebooks/examples/data_analysis.ipynb  5/5 cells  4.59 s  1 artifact  -> out.ipynb
//   error   fails.ipynb  cells[1] `d = {}`, line 2: KeyError: 'k'  1.45 s
//
// At the end: a count line for a batch, the summary as JSON (--json) and the results files
// (--results FILE.json / FILE.csv), whose fields docs/run.md lists; and the exit code.
#pragma once

#include <string>
#include <vector>

#include "batch.hpp"
#include "cellgate/notebooks/run.hpp"
#include "cellgate/notebooks/runner.hpp"
#include "progress.hpp"

namespace cellgate::notebooks {

// The line printed for a notebook: "<status padded to 8><path>  <what happened>  <seconds>...".
std::string summary_line(const Job& job, const Outcome& outcome);

// One CSV row per notebook of the summary's "notebooks" records, with a header line.
std::string results_csv(const nlohmann::json& records);

// Prints what became of one notebook (above the progress line).
void report_notebook(const NotebookRunOptions& options, const Job& job, const Outcome& outcome,
                     bool single, Progress& progress);

// Prints the summary, writes the results files, and returns the exit code: 130 interrupted,
// else 2 if a notebook was invalid (or the results could not be written), else 1 if one failed,
// else 0.
int summarize(const NotebookRunOptions& options, const std::vector<Job>& jobs,
              const std::vector<Outcome>& outcomes, double wall_seconds, bool interrupted);

}  // namespace cellgate::notebooks
