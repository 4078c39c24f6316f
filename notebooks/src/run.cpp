// `cellgate run`: inputs and outputs, the worker pool, one notebook's run, the progress line,
// the summary and the results files. nbformat lives in run_notebook.cpp, kernels in
// run_backend.cpp.
#include "cellgate/notebooks/run.hpp"
#include "cellgate/cli/exec.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "cellgate/notebooks/backend.hpp"
#include "cellgate/notebooks/notebook.hpp"

namespace cellgate::notebooks {
using cli::kExitCellError;
using cli::kExitInterrupted;
using cli::kExitOk;
using cli::kExitUsage;

namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;
using nlohmann::json;
using Clock = std::chrono::steady_clock;


// A notebook's status, in the order summaries list them.
constexpr const char* kStatuses[] = {"ok", "error", "timeout", "invalid", "aborted"};

// What is copied into each kernel's work dir from beside the notebook.
constexpr std::size_t kCopyTotalBytes = std::size_t{64} << 20;
constexpr int kCopyDataDepth = 8;  // directories below data/

int usage(const std::string& what) {
  std::cerr << "cellgate run: " << what << "\n";
  return kExitUsage;
}

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

// ---- what is run -------------------------------------------------------------------------------

struct Job {
  std::string path;              // as given or found in a directory
  fs::path dir;                  // the notebook's directory
  std::optional<json> notebook;  // parsed and valid
  std::string invalid;           // why it is not, when it is not
  std::string output;            // where the executed notebook goes; "" nowhere
  std::string artifacts_dir;     // DIR/<name>; "" not saved
};

struct Outcome {
  std::string status = "ok";  // ok | error | timeout | invalid | aborted
  double duration_s = 0;
  std::string kernel;
  std::size_t code_cells = 0;  // non-empty code cells
  std::size_t executed = 0;
  std::optional<std::size_t> cell;  // the failing cell's index in the (written) notebook
  std::string cell_source;          // its first line
  int line = 0;                     // the failing line of that cell, when the traceback says
  std::string ename, evalue;
  std::vector<std::string> traceback;
  std::size_t errors = 0;  // cell errors let through by --allow-errors
  std::size_t artifacts = 0;
  std::vector<std::string> artifact_files;
  std::string output;   // the file written
  std::string message;  // what went wrong, for people
  std::vector<std::string> warnings;
};

// ---- the progress line -------------------------------------------------------------------------

// One line on stderr, redrawn in place, when stderr is a terminal: notebooks done, and for each
// running notebook its name and cell i/n. Lines printed through print() appear above it.
class Progress {
 public:
  Progress(bool enabled, std::size_t total) : enabled_(enabled), total_(total) {}

  void begin(std::size_t job, std::string name, std::size_t cells) {
    std::lock_guard lock(mu_);
    active_[job] = Active{std::move(name), 0, cells};
    draw();
  }
  void cell(std::size_t job, std::size_t current) {
    std::lock_guard lock(mu_);
    if (auto it = active_.find(job); it != active_.end()) {
      it->second.current = current;
      draw();
    }
  }
  void end(std::size_t job) {
    std::lock_guard lock(mu_);
    active_.erase(job);
    ++done_;
    draw();
  }
  void print(const std::string& line, std::FILE* to) {
    std::lock_guard lock(mu_);
    clear();
    std::fputs((line + "\n").c_str(), to);
    std::fflush(to);
    draw();
  }
  void finish() {
    std::lock_guard lock(mu_);
    clear();
    enabled_ = false;
  }

 private:
  struct Active {
    std::string name;
    std::size_t current = 0;
    std::size_t cells = 0;
  };

  static std::size_t columns() {
    winsize ws{};
    if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 10) {
      return ws.ws_col;
    }
    return 80;
  }

  void clear() {
    if (enabled_ && drawn_) {
      std::fputs("\r\x1b[K", stderr);
      std::fflush(stderr);
      drawn_ = false;
    }
  }

  void draw() {
    if (!enabled_ || active_.empty()) {
      clear();
      return;
    }
    std::string line;
    if (total_ > 1) {
      line = "[" + std::to_string(done_) + "/" + std::to_string(total_) + "] ";
    }
    if (active_.size() == 1) {
      const Active& a = active_.begin()->second;
      constexpr std::size_t kWidth = 20;
      const std::size_t filled = a.cells == 0 ? 0 : kWidth * a.current / a.cells;
      line += a.name + " [" + std::string(filled, '=') + std::string(kWidth - filled, ' ') +
              "] cell " + std::to_string(a.current) + "/" + std::to_string(a.cells);
    } else {
      bool first = true;
      for (const auto& [job, a] : active_) {
        line += (first ? "" : " | ") + a.name + " " + std::to_string(a.current) + "/" +
                std::to_string(a.cells);
        first = false;
      }
    }
    const std::size_t width = columns() - 1;
    if (line.size() > width) {
      line = line.substr(0, width - 3) + "...";
    }
    std::fputs(("\r" + line + "\x1b[K").c_str(), stderr);
    std::fflush(stderr);
    drawn_ = true;
  }

  std::mutex mu_;
  bool enabled_;
  std::size_t total_;
  std::size_t done_ = 0;
  std::map<std::size_t, Active> active_;
  bool drawn_ = false;
};

// ---- Ctrl-C ------------------------------------------------------------------------------------

// The first SIGINT or SIGTERM calls on_signal once (the run stops its cells and cleans up); the
// handlers are then removed, so a second Ctrl-C ends the process at once.
class SignalWatch {
 public:
  explicit SignalWatch(std::function<void()> on_signal) : set_(ctx_, SIGINT, SIGTERM) {
    set_.async_wait(
        [this, on_signal = std::move(on_signal)](const boost::system::error_code& ec, int) {
          if (ec) {
            return;
          }
          fired_ = true;
          boost::system::error_code ignored;
          set_.clear(ignored);
          on_signal();
        });
    thread_ = std::thread([this] { ctx_.run(); });
  }
  ~SignalWatch() {
    ctx_.stop();
    thread_.join();
  }
  bool fired() const { return fired_; }

 private:
  net::io_context ctx_;
  net::signal_set set_;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// ---- inputs ------------------------------------------------------------------------------------

bool is_hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name.front() == '.';
}

Result<std::vector<std::string>> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> paths;
  for (const auto& input : inputs) {
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
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

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return errno_error(ErrorCode::kInvalidArgument, "unreadable", "open('" + path + "')", errno);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return make_error(ErrorCode::kInvalidArgument, "unreadable", "cannot read " + path);
  }
  return text.str();
}

// Writes through a temp file in the same directory and renames it over `path`, so a reader
// (or a crash) never sees half a notebook.
Result<void> write_atomically(const std::string& path, const std::string& text) {
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
  }
  const std::string tmp = path + ".cellgate-tmp-" + std::to_string(::getpid()) + "-" +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      return make_error(ErrorCode::kInternal, "write_failed", "cannot write " + path);
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return make_error(ErrorCode::kInternal, "write_failed",
                      "cannot write " + path + ": " + ec.message());
  }
  return ok_result();
}

// ---- the work dir ------------------------------------------------------------------------------

// Copies the regular files beside the notebook, and those under its data/ folder, into the
// kernel's work dir. Hidden files and symlinks are skipped (a symlink could hand a host file to
// the notebook's code); so are files over the per-file limit, and everything past the total cap.
void copy_neighbours(const Job& job, runner::KernelSession& session, std::size_t max_file_bytes,
                     Outcome& out) {
  std::size_t total = 0;
  auto copy = [&](const fs::path& file, const std::string& rel) -> bool {
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    if (ec) {
      return true;
    }
    if (size > max_file_bytes) {
      out.warnings.push_back(rel + " (" + std::to_string(size) + " bytes) is over the " +
                             std::to_string(max_file_bytes) + "-byte file limit: not copied");
      return true;
    }
    if (total + size > kCopyTotalBytes) {
      out.warnings.push_back("the files beside the notebook are over " +
                             std::to_string(kCopyTotalBytes >> 20) +
                             " MiB: copying stopped before " + rel);
      return false;
    }
    auto bytes = read_file(file.string());
    if (!bytes) {
      out.warnings.push_back(bytes.error().message + ": not copied");
      return true;
    }
    if (auto put = session.put_file(rel, *bytes); !put) {
      out.warnings.push_back("cannot copy " + rel +
                             " into the kernel's work dir: " + put.error().message);
      return true;
    }
    total += size;
    return true;
  };
  std::error_code ec;
  const fs::path dir = job.dir.empty() ? fs::path(".") : job.dir;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::error_code type_ec;
    if (!is_hidden(entry.path()) &&
        entry.symlink_status(type_ec).type() == fs::file_type::regular) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    if (!copy(file, file.filename().string())) {
      return;
    }
  }
  const fs::path data = dir / "data";
  if (fs::symlink_status(data, ec).type() != fs::file_type::directory) {
    return;
  }
  std::vector<std::pair<fs::path, std::string>> data_files;
  fs::recursive_directory_iterator it(data, fs::directory_options::none, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    const auto type = it->symlink_status(type_ec).type();
    if (is_hidden(it->path()) || it.depth() >= kCopyDataDepth) {
      if (type == fs::file_type::directory) {
        it.disable_recursion_pending();
      }
      continue;
    }
    if (type == fs::file_type::regular) {
      data_files.emplace_back(it->path(), "data/" + fs::relative(it->path(), data).string());
    }
  }
  std::sort(data_files.begin(), data_files.end());
  for (const auto& [file, rel] : data_files) {
    if (!copy(file, rel)) {
      return;
    }
  }
}

// ---- one notebook ------------------------------------------------------------------------------

struct Settings {
  const NotebookRunOptions& options;
  std::vector<notebook::Parameter> parameters;
  runner::Backend& backend;
  Progress& progress;
  const std::atomic<bool>& interrupted;  // Ctrl-C or SIGTERM
};

std::string choose_kernel(const Settings& s, const json& nb, Outcome& out) {
  if (!s.options.kernel.empty()) {
    return s.options.kernel;
  }
  const std::string wanted = notebook::kernel_name(nb);
  if (!wanted.empty() && s.backend.kernelspecs().count(wanted) != 0) {
    return wanted;
  }
  const std::string fallback =
      s.backend.kernelspecs().count("python3") != 0 ? "python3" : s.backend.default_kernel();
  if (!wanted.empty()) {
    out.warnings.push_back("the notebook's kernelspec '" + wanted + "' is not known here; using " +
                           fallback);
  }
  return fallback;
}

// The answer comes from a gateway over the network when --url is used: read it defensively.
std::string string_at(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

json array_at(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_array() ? *it : json::array();
}

void fail_at(Outcome& out, const std::string& status, std::size_t index, const json& cell) {
  out.status = status;
  out.cell = index;
  out.cell_source = notebook::first_line(notebook::source_of(cell));
}

void take_error(Outcome& out, const json& answer) {
  const json& error = answer.contains("error") ? answer["error"] : json();
  if (!error.is_object()) {
    return;
  }
  out.ename = string_at(error, "ename");
  out.evalue = string_at(error, "evalue");
  out.line =
      error.contains("line") && error["line"].is_number_integer() ? error["line"].get<int>() : 0;
  out.traceback.clear();
  for (const auto& line : array_at(error, "traceback")) {
    if (line.is_string()) {
      out.traceback.push_back(line.get<std::string>());
    }
  }
}

void save_artifacts(const Job& job, const json& nb, Outcome& out) {
  bool made = false;
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
        if (job.artifacts_dir.empty()) {
          continue;
        }
        std::error_code ec;
        if (!made) {
          fs::create_directories(job.artifacts_dir, ec);
          made = true;
        }
        const std::string path = job.artifacts_dir + "/cell" + std::to_string(i) + "-" +
                                 std::to_string(n) + "." + artifact.extension;
        if (auto w = write_atomically(path, artifact.bytes); w) {
          out.artifact_files.push_back(path);
        } else {
          out.warnings.push_back(w.error().message);
        }
      }
    }
  }
}

// Fills the cell from its answer and judges it: true when the run goes on to the next cell.
bool take_answer(const json& answer, std::size_t i, json& cell, const Settings& s, Outcome& out) {
  cell["outputs"] = array_at(answer, "outputs");
  const json count = answer.contains("execution_count") ? answer["execution_count"] : json();
  cell["execution_count"] = count.is_number_integer() ? count : json();
  ++out.executed;
  for (const auto& notice : array_at(answer, "notices")) {
    if (notice.is_string()) {
      out.warnings.push_back("cells[" + std::to_string(i) + "]: " + notice.get<std::string>());
    }
  }
  const std::string status = string_at(answer, "status");
  if (s.interrupted && status != "ok") {
    take_error(out, answer);
    fail_at(out, "aborted", i, cell);
    out.message = "interrupted";
    return false;
  }
  if (status == "ok") {
    return true;
  }
  if (status == "error" && notebook::has_tag(cell, "raises-exception")) {
    return true;  // the error is the point of the cell (nbclient's convention)
  }
  if (status == "error" && s.options.allow_errors) {
    ++out.errors;
    return true;
  }
  take_error(out, answer);
  if (status == "error") {
    fail_at(out, "error", i, cell);
  } else if (status == "timeout") {
    fail_at(out, "timeout", i, cell);
    std::ostringstream limit;
    limit << s.options.timeout_seconds;
    const std::string which =
        s.options.timeout_seconds <= 0 ? "the gateway's --execute-max-timeout"
        : s.options.url.empty()
            ? "--timeout " + limit.str() + " s"
            : "--timeout " + limit.str() + " s (or the gateway's --execute-max-timeout, if lower)";
    out.message = "the cell ran past " + which + " and was interrupted" +
                  (answer.contains("state_lost") && answer["state_lost"] == true
                       ? "; the kernel was restarted"
                       : "");
  } else if (status == "aborted") {
    fail_at(out, "aborted", i, cell);
    out.message = "interrupted";
  } else if (status == "dead") {
    const std::string said = string_at(answer, "message");
    fail_at(out, "error", i, cell);
    out.message = said.empty() ? "the kernel died while running the cell" : said;
  } else {
    fail_at(out, "error", i, cell);
    out.message = "the gateway answered an unknown status '" + status + "'";
  }
  return false;
}

Outcome run_one(const Job& job, std::size_t index, const Settings& s) {
  Outcome out;
  const auto started = Clock::now();
  json nb = *job.notebook;
  notebook::clear_outputs(nb);
  if (!s.parameters.empty()) {
    auto injected = notebook::inject_parameters(nb, s.parameters);
    if (!injected.after_parameters_cell) {
      out.warnings.push_back(
          "no cell is tagged 'parameters': the parameters went in a new "
          "first cell");
    }
  }
  json& cells = nb["cells"];
  std::vector<std::size_t> code;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    if (cells[i].value("cell_type", "") == "code" &&
        !notebook::first_line(notebook::source_of(cells[i])).empty()) {
      code.push_back(i);  // blank cells are skipped, as nbclient does
    }
  }
  out.code_cells = code.size();
  out.kernel = choose_kernel(s, nb, out);
  s.progress.begin(index, fs::path(job.path).filename().string(), code.size());

  auto session = code.empty() ? Result<std::unique_ptr<runner::KernelSession>>(nullptr)
                              : s.backend.start(out.kernel);
  if (!session) {
    out.status = session.error().reason == "aborted" ? "aborted" : "error";
    out.message = "cannot start a '" + out.kernel + "' kernel: " + session.error().message;
  } else if (*session) {
    copy_neighbours(job, **session, s.backend.max_file_bytes(), out);
    for (std::size_t k = 0; k < code.size(); ++k) {
      const std::size_t i = code[k];
      json& cell = cells[i];
      s.progress.cell(index, k + 1);
      auto answer = (*session)->execute(notebook::source_of(cell), s.options.timeout_seconds);
      if (!answer) {
        fail_at(out, answer.error().reason == "aborted" ? "aborted" : "error", i, cell);
        out.message = answer.error().message;
        break;
      }
      if (!take_answer(*answer, i, cell, s, out)) {
        break;
      }
    }
    session->reset();  // shuts the kernel down
  }
  out.duration_s = std::chrono::duration<double>(Clock::now() - started).count();

  save_artifacts(job, nb, out);
  if (!job.output.empty()) {
    if (auto written = write_atomically(job.output, notebook::dump(nb)); written) {
      out.output = job.output;
    } else {
      if (out.status == "ok") {
        out.status = "error";
        out.message = written.error().message;
      } else {
        out.warnings.push_back(written.error().message);
      }
    }
  }
  s.progress.end(index);
  return out;
}

// ---- the summary -------------------------------------------------------------------------------

std::string plural(std::size_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string summary_line(const Job& job, const Outcome& o) {
  std::string status = o.status;
  status.resize(std::max<std::size_t>(status.size(), 8), ' ');
  std::string line = status + job.path + "  ";
  if (o.status == "invalid") {
    return line + o.message;
  }
  if (o.cell) {
    line += "cells[" + std::to_string(*o.cell) + "] `" + o.cell_source + "`" +
            (o.line > 0 ? ", line " + std::to_string(o.line) : "") + ": ";
    if (!o.ename.empty() && o.status == "error") {
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

json nullable(const std::string& s) {
  return s.empty() ? json() : json(s);
}

json record(const Job& job, const Outcome& o) {
  json r = {{"path", job.path},
            {"status", o.status},
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

std::string csv(const json& records) {
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

// FILE.json or FILE.csv by its extension; any other name gets both, FILE.json and FILE.csv.
Result<std::vector<std::string>> write_results(const std::string& file, const json& summary) {
  const std::string ext = fs::path(file).extension().string();
  std::vector<std::string> written;
  auto write = [&](const std::string& path, const std::string& text) -> Result<void> {
    CELLGATE_TRY(write_atomically(path, text));
    written.push_back(path);
    return ok_result();
  };
  if (ext == ".json") {
    CELLGATE_TRY(write(file, summary.dump(2) + "\n"));
  } else if (ext == ".csv") {
    CELLGATE_TRY(write(file, csv(summary["notebooks"])));
  } else {
    CELLGATE_TRY(write(file + ".json", summary.dump(2) + "\n"));
    CELLGATE_TRY(write(file + ".csv", csv(summary["notebooks"])));
  }
  return written;
}

// Kernel managers log through spdlog's default logger, which writes to stdout: send it to
// stderr, warnings only, so stdout carries the summary (or the JSON) alone.
void quiet_logging() {
  auto logger = std::make_shared<spdlog::logger>("cellgate-run",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_level(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
}

// ---- the steps of run_notebooks -----------------------------------------------------------------

Error usage_error(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "usage", std::move(message));
}

// Checks the options that do not depend on the inputs; returns the parsed -p parameters.
Result<std::vector<notebook::Parameter>> check_options(const NotebookRunOptions& options) {
  if (options.inputs.empty()) {
    return usage_error("name a notebook (or a directory of them)");
  }
  if (options.inplace && (!options.output.empty() || !options.output_dir.empty())) {
    return usage_error("--inplace writes over the input: it goes with neither -o nor --output-dir");
  }
  if (!options.output.empty() && !options.output_dir.empty()) {
    return usage_error("-o names one output notebook, --output-dir a directory for many: pick one");
  }
  if (options.timeout_seconds < 0) {
    return usage_error("--timeout must be 0 (none) or a positive number of seconds");
  }
  if (options.no_jail && !options.url.empty()) {
    return usage_error("--no-jail is for the embedded gateway; a gateway at --url decides itself");
  }
  if (options.jobs < 1) {
    return usage_error("--jobs must be at least 1");
  }
  std::vector<notebook::Parameter> parameters;
  for (const auto& p : options.parameters) {
    CELLGATE_ASSIGN_OR_RETURN(auto parsed, notebook::parse_parameter(p));
    parameters.push_back(std::move(parsed));
  }
  return parameters;
}

// The notebooks to run, where each goes, and whether each is valid (an invalid one is a Job
// with `invalid` set, not an error: the others still run).
Result<std::vector<Job>> plan_jobs(const NotebookRunOptions& options) {
  CELLGATE_ASSIGN_OR_RETURN(auto paths, expand_inputs(options.inputs));
  if (!options.output.empty() && paths.size() != 1) {
    return usage_error("-o takes one notebook; " + std::to_string(paths.size()) +
                       " were given (use --output-dir DIR)");
  }
  std::vector<Job> jobs;
  std::set<std::string> outputs;
  std::map<std::string, int> artifact_names;
  for (const auto& path : paths) {
    Job job;
    job.path = path;
    job.dir = fs::path(path).parent_path();
    if (options.inplace) {
      job.output = path;
    } else if (!options.output.empty()) {
      job.output = options.output;
    } else if (!options.output_dir.empty()) {
      job.output = (fs::path(options.output_dir) / fs::path(path).filename()).string();
    }
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
    auto text = read_file(path);
    if (!text) {
      job.invalid = text.error().message;
    } else if (auto nb = notebook::parse(*text); !nb) {
      job.invalid = nb.error().message;
    } else {
      job.notebook = std::move(nb).value();
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

Result<std::unique_ptr<runner::Backend>> make_backend(const NotebookRunOptions& options) {
  auto made =
      options.url.empty()
          ? runner::make_embedded_backend({static_cast<std::size_t>(options.jobs), options.no_jail})
          : runner::make_remote_backend(options.url, options.token);
  if (!made) {
    return usage_error((options.url.empty() ? "cannot start the embedded gateway: "
                                            : "cannot use the gateway at " + options.url + ": ") +
                       made.error().message);
  }
  if (!options.kernel.empty() && (*made)->kernelspecs().count(options.kernel) == 0) {
    std::string known;
    for (const auto& name : (*made)->kernelspecs()) {
      known += (known.empty() ? "" : ", ") + name;
    }
    return usage_error("no kernelspec named '" + options.kernel + "' (known: " + known + ")");
  }
  return made;
}

// Prints what became of one notebook: warnings and, for a single notebook, the traceback on
// stderr; the summary line on stdout (not with --json).
void report(const NotebookRunOptions& options, const Job& job, const Outcome& o, bool single,
            Progress& progress) {
  for (const auto& w : o.warnings) {
    progress.print("cellgate run: " + job.path + ": " + w, stderr);
  }
  if (o.status == "invalid") {
    progress.print("cellgate run: " + job.path + ": not a valid notebook: " + o.message, stderr);
    return;
  }
  if (single && (o.status == "error" || o.status == "timeout") && !o.traceback.empty()) {
    std::string tb;
    for (const auto& line : o.traceback) {
      tb += (tb.empty() ? "" : "\n") + line;
    }
    progress.print(tb, stderr);
  }
  if (!options.json) {
    progress.print(summary_line(job, o), stdout);
  }
}

// The summary (printed, and written with --results) and the exit code.
int summarize(const NotebookRunOptions& options, const std::vector<Job>& jobs,
              const std::vector<Outcome>& outcomes, double wall, bool interrupted) {
  std::map<std::string, std::size_t> counts;
  for (const char* status : kStatuses) {
    counts[status] = 0;
  }
  json records = json::array();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    ++counts[outcomes[i].status];
    records.push_back(record(jobs[i], outcomes[i]));
  }
  int exit_code = kExitOk;
  if (interrupted) {
    exit_code = kExitInterrupted;
  } else if (counts["invalid"] > 0) {
    exit_code = kExitUsage;
  } else if (counts["error"] + counts["timeout"] + counts["aborted"] > 0) {
    exit_code = kExitCellError;
  }
  json summary = {{"notebooks", records},
                  {"counts", counts},
                  {"duration_s", round_ms(wall)},
                  {"exit_code", exit_code}};
  if (!options.results.empty()) {
    auto written = write_results(options.results, summary);
    if (!written) {
      std::cerr << "cellgate run: " << written.error().message << "\n";
      exit_code = std::max(exit_code, kExitUsage);
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
        plural(jobs.size(), "notebook", "notebooks") + " in " + format_seconds(wall) + ":";
    bool first = true;
    for (const char* status : kStatuses) {
      if (const std::size_t n = counts[status]; n > 0) {
        line += (first ? " " : ", ") + std::to_string(n) + " " + status;
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

}  // namespace

int run_notebooks(const NotebookRunOptions& options) {
  auto parameters = check_options(options);
  if (!parameters) {
    return usage(parameters.error().message);
  }
  auto planned = plan_jobs(options);
  if (!planned) {
    return usage(planned.error().message);
  }
  const std::vector<Job>& jobs = *planned;
  const bool single = jobs.size() == 1;
  Progress progress(options.progress && ::isatty(STDERR_FILENO) == 1, jobs.size());
  std::vector<Outcome> outcomes(jobs.size());
  std::vector<std::size_t> runnable;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].notebook) {
      runnable.push_back(i);
    } else {
      outcomes[i].status = "invalid";
      outcomes[i].message = jobs[i].invalid;
      report(options, jobs[i], outcomes[i], single, progress);
    }
  }

  const auto started = Clock::now();
  std::atomic<bool> interrupted{false};
  if (!runnable.empty()) {
    quiet_logging();
    auto backend = make_backend(options);
    if (!backend) {
      return usage(backend.error().message);
    }
    SignalWatch signals([&] {
      interrupted = true;
      (*backend)->cancel();
    });
    Settings settings{options, *parameters, **backend, progress, interrupted};
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
      for (std::size_t k = next++; k < runnable.size(); k = next++) {
        const std::size_t i = runnable[k];
        if (interrupted) {
          outcomes[i].status = "aborted";
          outcomes[i].message = "not run: interrupted";
        } else {
          outcomes[i] = run_one(jobs[i], i, settings);
        }
        report(options, jobs[i], outcomes[i], single, progress);
      }
    };
    std::vector<std::thread> workers;
    const std::size_t n =
        std::min<std::size_t>(static_cast<std::size_t>(options.jobs), runnable.size());
    for (std::size_t w = 0; w < n; ++w) {
      workers.emplace_back(worker);
    }
    for (auto& t : workers) {
      t.join();
    }
    progress.finish();
    // Leaving this scope stops the signal watch, then the backend: the embedded gateway's
    // kernels and temp dir go.
  }
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();
  return summarize(options, jobs, outcomes, wall, interrupted);
}

}  // namespace cellgate::notebooks
