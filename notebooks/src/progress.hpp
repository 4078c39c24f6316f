// Internal: `cellgate run`'s progress line: one line on stderr, redrawn in place when stderr is a
// terminal, with the notebooks done and, for each running notebook, its name and cell i/n.
// Lines printed through print() appear above it.
//
//   Progress progress(isatty(STDERR_FILENO) == 1, jobs.size());
//   progress.begin(0, "analysis.ipynb", 5);   // [0/2] analysis.ipynb [    ] cell 0/5
//   progress.cell(0, 1);
//   progress.print("ok      analysis.ipynb ...", stdout);
//   progress.end(0);
//
// Thread-safety: all methods may be called from any thread (the workers of a batch).
#pragma once

#include <cstddef>
#include <cstdio>
#include <map>
#include <string>

#include "cellgate/mutex.hpp"

namespace cellgate::notebooks {

class Progress {
 public:
  // Disabled, it only prints lines.
  Progress(bool enabled, std::size_t total) : enabled_(enabled), total_(total) {}

  void begin(std::size_t job, std::string name, std::size_t cells);
  void cell(std::size_t job, std::size_t current);
  void end(std::size_t job);
  // Prints `line` (and a newline) to `to`, above the progress line.
  void print(const std::string& line, std::FILE* to);
  // Clears the line for good.
  void finish();

 private:
  struct Active {
    std::string name;
    std::size_t current = 0;
    std::size_t cells = 0;
  };

  void clear() CELLGATE_REQUIRES(mu_);
  void draw() CELLGATE_REQUIRES(mu_);

  Mutex mu_;
  bool enabled_ CELLGATE_GUARDED_BY(mu_);
  const std::size_t total_;
  std::size_t done_ CELLGATE_GUARDED_BY(mu_) = 0;
  std::map<std::size_t, Active> active_ CELLGATE_GUARDED_BY(mu_);
  bool drawn_ CELLGATE_GUARDED_BY(mu_) = false;
};

}  // namespace cellgate::notebooks
