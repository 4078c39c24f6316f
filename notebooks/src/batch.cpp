#include "batch.hpp"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "files.hpp"

namespace cellgate::notebooks {
namespace {

namespace fs = std::filesystem;

// Files as given; directories as their *.ipynb files (not hidden, sorted, not recursive).
Result<std::vector<std::string>> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> paths;
  for (const auto& input : inputs) {
    std::error_code ec;
    if (input == "-") {
      paths.push_back(input);  // stdin
    } else if (fs::is_directory(input, ec)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(input, ec)) {
        std::error_code type_ec;
        if (entry.path().extension() == ".ipynb" && !is_hidden(entry.path()) &&
            entry.is_regular_file(type_ec)) {
          found.push_back(entry.path().string());
        }
      }
      if (ec) {
        return make_error(ErrorCode::kInvalidArgument, "bad_input",
                          "cannot list " + input + ": " + ec.message());
      }
      if (found.empty()) {
        return make_error(ErrorCode::kInvalidArgument, "bad_input", input + " has no .ipynb files");
      }
      std::sort(found.begin(), found.end());
      paths.insert(paths.end(), found.begin(), found.end());
    } else if (fs::exists(input, ec)) {
      paths.push_back(input);
    } else {
      return make_error(ErrorCode::kInvalidArgument, "bad_input", "no such file: " + input);
    }
  }
  return paths;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

std::string output_of(const NotebookRunOptions& options, const std::string& path) {
  if (options.inplace) {
    return path;
  }
  if (!options.output.empty()) {
    return options.output;
  }
  if (!options.output_dir.empty()) {
    return (fs::path(options.output_dir) / fs::path(path).filename()).string();
  }
  return {};
}

Result<std::string> read_stdin() {
  std::ostringstream text;
  text << std::cin.rdbuf();
  if (std::cin.bad()) {
    return make_error(ErrorCode::kInvalidArgument, "unreadable", "cannot read stdin");
  }
  return text.str();
}

// Reads and validates the notebook, or says why it cannot be run.
void load(Job& job) {
  auto text = job.path == "-" ? read_stdin() : read_file(job.path);
  if (!text) {
    job.invalid = text.error().message;
  } else if (auto nb = notebook::parse(*text); !nb) {
    job.invalid = nb.error().message;
  } else {
    job.notebook = std::move(nb).value();
  }
}

}  // namespace

Error usage_error(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "usage", std::move(message));
}

Result<std::vector<Job>> plan_jobs(const NotebookRunOptions& options) {
  CELLGATE_ASSIGN_OR_RETURN(auto paths, expand_inputs(options.inputs));
  if (!options.output.empty() && paths.size() != 1) {
    return usage_error("-o takes one notebook; " + std::to_string(paths.size()) +
                       " were given (use --output-dir DIR)");
  }
  std::vector<Job> jobs;
  std::set<std::string> outputs;
  std::map<std::string, int> artifact_names;  // a notebook name seen again gets "-2", "-3", ...
  for (const auto& path : paths) {
    Job job;
    job.path = path;
    job.dir = fs::path(path).parent_path().string();
    if (job.dir.empty()) {
      job.dir = ".";
    }
    if (path == "-") {
      job.dir.clear();  // stdin: no directory beside it
    }
    if (!options.cwd.empty()) {
      job.dir = options.cwd;
    }
    job.output = output_of(options, path);
    if (!job.output.empty() && !options.inplace && same_file(job.output, path)) {
      return usage_error("the output " + job.output + " is the input notebook: pass --inplace " +
                         "to overwrite it, or choose another output");
    }
    std::error_code ec;
    if (!job.output.empty() &&
        !outputs.insert(fs::weakly_canonical(job.output, ec).string()).second) {
      return usage_error("two notebooks would be written to " + job.output);
    }
    if (!options.artifacts_dir.empty()) {
      const std::string stem = fs::path(path).stem().string();
      const int seen = artifact_names[stem]++;
      const std::string name = seen == 0 ? stem : stem + "-" + std::to_string(seen + 1);
      job.artifacts_dir = (fs::path(options.artifacts_dir) / name).string();
    }
    load(job);
    jobs.push_back(std::move(job));
  }
  return jobs;
}

void run_jobs(const std::vector<Job>& jobs, Backend& backend, const NotebookRun& common,
              std::size_t workers, Progress& progress, std::vector<Outcome>& outcomes,
              const std::function<void(std::size_t job)>& done) {
  std::vector<std::size_t> runnable;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].notebook) {
      runnable.push_back(i);
    }
  }
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t k = next++; k < runnable.size(); k = next++) {
      const std::size_t i = runnable[k];
      const Job& job = jobs[i];
      if (backend.cancelled()) {
        outcomes[i].status = Status::kAborted;
        outcomes[i].message = "not run: interrupted";
      } else {
        NotebookRun run = common;
        run.files_from = job.dir;
        run.artifacts_dir = job.artifacts_dir;
        run.output = job.output;
        run.input_path = job.path;
        const std::string name = fs::path(job.path).filename().string();
        run.on_cell = [&progress, i, &name](std::size_t cell, std::size_t cells) {
          if (cell == 0) {
            progress.begin(i, name, cells);
          } else {
            progress.cell(i, cell);
          }
        };
        outcomes[i] = run_notebook(backend, *job.notebook, run);
        outcomes[i].notebook = nullptr;  // written; a batch does not keep them all in memory
        progress.end(i);
      }
      done(i);
    }
  };
  std::vector<std::thread> threads;
  const std::size_t n = std::min(workers, runnable.size());
  for (std::size_t w = 0; w < n; ++w) {
    threads.emplace_back(worker);
  }
  for (auto& t : threads) {
    t.join();
  }
}

}  // namespace cellgate::notebooks
