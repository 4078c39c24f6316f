// Internal: the notebooks of one `cellgate run`. plan_jobs() expands the inputs (directories
// into their *.ipynb files), decides where each executed notebook and its artifacts go, and
// reads and validates each notebook; run_jobs() runs the valid ones on --jobs worker threads,
// each notebook in its own kernel.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/notebooks/backend.hpp"
#include "cellgate/notebooks/run.hpp"
#include "cellgate/notebooks/runner.hpp"
#include "progress.hpp"

namespace cellgate::notebooks {

struct Job {
  std::string path;  // as given, or found in a directory
  std::string dir;   // its files go to the work dir: --cwd, else the notebook's directory ("." for
                     // a bare name; "" for stdin: none)
  std::optional<nlohmann::json> notebook;  // parsed and valid
  std::string invalid;                     // why it is not, when it is not
  std::string output;                      // where the executed notebook goes; "" nowhere
  std::string artifacts_dir;               // DIR/<name>; "" not saved
};

// An error in how `cellgate run` was called (kInvalidArgument, reason "usage"): exit code 2.
Error usage_error(std::string message);

// A usage error for -o with many inputs, an output that is
// the input without --inplace, two notebooks with one output, or an input that does not exist.
// An invalid notebook is a Job with `invalid` set, not an error: the others still run.
Result<std::vector<Job>> plan_jobs(const NotebookRunOptions& options);

// Runs every job with a notebook on up to `workers` threads, `common` giving the settings they
// share. A job not started before the backend is cancelled ends "aborted". `done` is called as
// each notebook ends, from its worker thread. Other jobs' outcomes are left as they are.
void run_jobs(const std::vector<Job>& jobs, Backend& backend, const NotebookRun& common,
              std::size_t workers, Progress& progress, std::vector<Outcome>& outcomes,
              const std::function<void(std::size_t job)>& done);

}  // namespace cellgate::notebooks
