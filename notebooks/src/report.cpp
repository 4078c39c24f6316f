#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "cellgate/cli/exit_codes.hpp"
#include "files.hpp"

namespace cellgate::notebooks {
namespace {

using nlohmann::json;

std::string format_seconds(double s) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(s < 10 ? 2 : 1);
  out << s << " s";
  return out.str();
}

double round_ms(double s) {
  return std::round(s * 1000) / 1000;
}

std::string plural(std::size_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

json nullable(const std::string& s) {
  return s.empty() ? json() : json(s);
}

json record(const Job& job, const Outcome& o) {
  json r = {{"path", job.path},
            {"status", to_string(o.status)},
            {"duration_s", round_ms(o.duration_s)},
            {"kernel", nullable(o.kernel)},
            {"cells", o.code_cells},
            {"executed", o.executed},
            {"cell", o.cell ? json(*o.cell) : json()},
            {"cell_source", o.cell ? json(o.cell_source) : json()},
            {"line", o.line > 0 ? json(o.line) : json()},
            {"ename", nullable(o.ename)},
            {"evalue", o.ename.empty() ? json() : json(o.evalue)},
            {"errors", o.errors},
            {"artifacts", o.artifacts},
            {"output", nullable(o.output)},
            {"message", nullable(o.message)},
            {"warnings", o.warnings}};
  if (!job.artifacts_dir.empty()) {
    r["artifact_files"] = o.artifact_files;
  }
  return r;
}

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
std::string csv_field(const json& v) {
  std::string s;
  if (v.is_null()) {
    return s;
  }
  if (v.is_string()) {
    s = v.get<std::string>();
  } else if (v.is_number_float()) {
    std::ostringstream out;
    out << v.get<double>();
    s = out.str();
  } else {
    s = v.dump();
  }
  if (s.find_first_of(",\"\n\r") == std::string::npos) {
    return s;
  }
  std::string quoted = "\"";
  for (char c : s) {
    quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  }
  return quoted + "\"";
}

// FILE.json or FILE.csv by its extension; any other name gets both, FILE.json and FILE.csv.
Result<std::vector<std::string>> write_results(const std::string& file, const json& summary) {
  const std::string ext = std::filesystem::path(file).extension().string();
  std::vector<std::string> written;
  auto write = [&](const std::string& path, const std::string& text) -> Result<void> {
    CELLGATE_TRY(write_file(path, text));
    written.push_back(path);
    return ok_result();
  };
  if (ext == ".json") {
    CELLGATE_TRY(write(file, summary.dump(2) + "\n"));
  } else if (ext == ".csv") {
    CELLGATE_TRY(write(file, results_csv(summary["notebooks"])));
  } else {
    CELLGATE_TRY(write(file + ".json", summary.dump(2) + "\n"));
    CELLGATE_TRY(write(file + ".csv", results_csv(summary["notebooks"])));
  }
  return written;
}

}  // namespace

std::string summary_line(const Job& job, const Outcome& o) {
  std::string status = to_string(o.status);
  status.resize(std::max<std::size_t>(status.size(), 8), ' ');
  std::string line = status + job.path + "  ";
  if (o.status == Status::kInvalid) {
    return line + o.message;
  }
  if (o.cell) {
    line += "cells[" + std::to_string(*o.cell) + "] `" + o.cell_source + "`" +
            (o.line > 0 ? ", line " + std::to_string(o.line) : "") + ": ";
    if (!o.ename.empty() && o.status == Status::kError) {
      line += o.ename + (o.evalue.empty() ? "" : ": " + o.evalue);
    } else {
      line += o.message;
    }
    line += "  ";
  } else if (!o.message.empty()) {
    line += o.message + "  ";
  } else {
    line += std::to_string(o.executed) + "/" + plural(o.code_cells, "cell", "cells") + "  ";
  }
  if (o.errors > 0) {
    line += plural(o.errors, "error", "errors") + " allowed  ";
  }
  line += format_seconds(o.duration_s);
  if (o.artifacts > 0) {
    line += "  " + plural(o.artifacts, "artifact", "artifacts");
  }
  if (!o.output.empty()) {
    line += "  -> " + o.output;
  }
  return line;
}

std::string results_csv(const json& records) {
  static const std::vector<std::string> kColumns = {
      "path", "status", "duration_s", "kernel", "cells",     "executed", "cell",   "cell_source",
      "line", "ename",  "evalue",     "errors", "artifacts", "output",   "message"};
  std::string text;
  for (std::size_t c = 0; c < kColumns.size(); ++c) {
    text += (c == 0 ? "" : ",") + kColumns[c];
  }
  text += "\n";
  for (const auto& r : records) {
    for (std::size_t c = 0; c < kColumns.size(); ++c) {
      text += (c == 0 ? "" : ",") + csv_field(r.value(kColumns[c], json()));
    }
    text += "\n";
  }
  return text;
}

void report_notebook(const NotebookRunOptions& options, const Job& job, const Outcome& o,
                     bool single, Progress& progress) {
  for (const auto& w : o.warnings) {
    progress.print("cellgate run: " + job.path + ": " + w, stderr);
  }
  if (o.status == Status::kInvalid) {
    progress.print("cellgate run: " + job.path + ": not a valid notebook: " + o.message, stderr);
    return;
  }
  if (single && (o.status == Status::kError || o.status == Status::kTimeout) &&
      !o.traceback.empty()) {
    std::string tb;
    for (const auto& line : o.traceback) {
      tb += (tb.empty() ? "" : "\n") + line;
    }
    progress.print(tb, stderr);
  }
  if (!options.json) {
    // With the notebook on stdout (-o -), stdout carries it alone.
    progress.print(summary_line(job, o), options.output == "-" ? stderr : stdout);
  }
}

int summarize(const NotebookRunOptions& options, const std::vector<Job>& jobs,
              const std::vector<Outcome>& outcomes, double wall_seconds, bool interrupted) {
  std::map<std::string, std::size_t> counts;
  for (Status status : kStatuses) {
    counts[to_string(status)] = 0;
  }
  json records = json::array();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    ++counts[to_string(outcomes[i].status)];
    records.push_back(record(jobs[i], outcomes[i]));
  }
  int exit_code = cli::kExitOk;
  if (interrupted) {
    exit_code = cli::kExitInterrupted;
  } else if (counts["invalid"] > 0) {
    exit_code = cli::kExitUsage;
  } else if (counts["error"] + counts["timeout"] + counts["aborted"] > 0) {
    exit_code = cli::kExitCellError;
  }
  json summary = {{"notebooks", records},
                  {"counts", counts},
                  {"duration_s", round_ms(wall_seconds)},
                  {"exit_code", exit_code}};
  if (!options.results.empty()) {
    auto written = write_results(options.results, summary);
    if (!written) {
      std::cerr << "cellgate run: " << written.error().message << "\n";
      exit_code = std::max(exit_code, cli::kExitUsage);
      summary["exit_code"] = exit_code;
    } else if (!options.json) {
      for (const auto& path : *written) {
        std::cerr << "cellgate run: results in " << path << "\n";
      }
    }
  }
  if (options.json) {
    std::cout << summary.dump(2) << std::endl;
  } else if (jobs.size() > 1) {
    std::string line =
        plural(jobs.size(), "notebook", "notebooks") + " in " + format_seconds(wall_seconds) + ":";
    bool first = true;
    for (Status status : kStatuses) {
      if (const std::size_t n = counts[to_string(status)]; n > 0) {
        line += (first ? " " : ", ") + std::to_string(n) + " " + to_string(status);
        first = false;
      }
    }
    std::cout << line << std::endl;
  }
  const bool ran = jobs.size() > counts["invalid"];
  if (!options.json && options.output.empty() && options.output_dir.empty() && !options.inplace &&
      ran) {
    std::cerr << "cellgate run: executed notebooks were not saved (use -o OUT.ipynb, "
                 "--output-dir DIR or --inplace)\n";
  }
  return exit_code;
}

}  // namespace cellgate::notebooks
