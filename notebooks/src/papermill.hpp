// Internal: the metadata papermill writes into the notebooks it runs (papermill's
// NotebookExecutionManager), so tools that read papermill's outputs (scrapbook, dashboards that
// show a run's status and timings) read `cellgate run`'s too:
//
//   metadata.papermill        {parameters, input_path, output_path, start_time, end_time,
//                              duration, exception, environment_variables, default_parameters}
//   cells[i].metadata.papermill {start_time, end_time, duration, status, exception}
//
// Times are UTC in Python's datetime.isoformat() ("2026-11-29T05:00:43.123456", papermill's
// datetime.utcnow()), durations seconds as floats. A cell is "pending" until the run reaches it,
// "running" while it runs, then "completed" or "failed" (exception true); markdown, raw, blank
// and skip-execution cells are completed as the run passes them, as papermill passes every cell.
// The notebook's exception is true when a cell failed, null before the end.
//
// Thread-safety: none; one notebook's metadata is written by the thread running it.
#pragma once

#include <chrono>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/notebooks/notebook.hpp"

namespace cellgate::notebooks::papermill {

// Now, as papermill writes times.
std::string utc_now();

// metadata.papermill without times (papermill's prepare_notebook_metadata): what --prepare-only
// writes; cells get no metadata.papermill.
void describe(nlohmann::json& nb, const std::vector<notebook::Parameter>& parameters,
              const std::string& input_path, const std::string& output_path);

class Tracker {
 public:
  // Writes metadata.papermill (start_time now) and every cell's "pending" metadata into `nb`.
  Tracker(nlohmann::json& nb, const std::vector<notebook::Parameter>& parameters,
          const std::string& input_path, const std::string& output_path);

  // Cell `index` starts: the cells before it the run passed over are completed first.
  void start(std::size_t index);
  // Cell `index` (started) ends.
  void end(std::size_t index, bool failed);
  // The run ended: with `reached_end`, the cells after the last started one are completed; the
  // notebook's end_time, duration and exception are written.
  void finish(bool reached_end);

 private:
  void pass_to(std::size_t index);  // completes the cells before `index` not yet reached
  nlohmann::json& cell_metadata(std::size_t index);

  nlohmann::json& nb_;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point cell_started_;
  std::size_t next_ = 0;  // the first cell the run has not reached
  bool failed_ = false;
};

}  // namespace cellgate::notebooks::papermill
