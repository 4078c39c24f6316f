// `cellgate run`: the command line (add_run_command) and its steps (run_notebooks): check the
// options, plan the jobs, compose a backend, run the batch with Ctrl-C watched, summarize.
#include "cellgate/notebooks/run.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <iostream>
#include <thread>

#include "batch.hpp"
#include "cellgate/cli/exit_codes.hpp"
#include "cellgate/notebooks/backend.hpp"
#include "cellgate/notebooks/parameters.hpp"
#include "cellgate/notebooks/runner.hpp"
#include "files.hpp"
#include "output_log.hpp"
#include "progress.hpp"
#include "report.hpp"

namespace cellgate::notebooks {
namespace {

using Clock = std::chrono::steady_clock;

int usage(const std::string& what) {
  std::cerr << "cellgate run: " << what << "\n";
  return cli::kExitUsage;
}

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
  boost::asio::io_context ctx_;
  boost::asio::signal_set set_;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// Kernel managers log through spdlog's default logger, which writes to stdout: send it to
// stderr, warnings only, so stdout carries the summary (or the JSON) alone.
void quiet_logging() {
  auto logger = std::make_shared<spdlog::logger>("cellgate-run",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_level(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Whether `path` is a notebook an earlier run wrote (it has metadata.papermill).
bool is_executed_notebook(const std::string& path) {
  auto text = read_file(path);
  if (!text) {
    return false;
  }
  auto nb = notebook::parse(*text);
  return nb && (*nb)["metadata"].is_object() && (*nb)["metadata"].contains("papermill");
}

// papermill's `INPUT OUTPUT` (run.hpp): moves the second name to options.output when the two
// names read as papermill's form.
Result<void> take_papermill_output(NotebookRunOptions& options) {
  namespace fs = std::filesystem;
  if (options.inputs.size() != 2 || !options.output.empty() || !options.output_dir.empty() ||
      options.inplace) {
    return ok_result();
  }
  const std::string& in = options.inputs[0];
  const std::string& out = options.inputs[1];
  std::error_code ec;
  const bool in_is_file = in == "-" || fs::is_regular_file(in, ec);
  const bool out_is_notebook =
      out == "-" || (ends_with(out, ".ipynb") && !fs::is_directory(out, ec));
  if (!in_is_file || !out_is_notebook) {
    return ok_result();
  }
  if (out != "-" && fs::exists(out, ec) && !is_executed_notebook(out)) {
    return usage_error(out +
                       " exists and is not an executed notebook (it has no "
                       "metadata.papermill), so `cellgate run " +
                       in + " " + out + "` is ambiguous: to write " + in +
                       "'s run over it, pass -o " + out +
                       "; to run both notebooks, pass --output-dir DIR");
  }
  options.output = out;
  options.inputs.pop_back();
  return ok_result();
}

// Checks the options that do not depend on the inputs; returns the -f, -y, -p and -r parameters
// merged as papermill merges them.
Result<std::vector<notebook::Parameter>> check_options(const NotebookRunOptions& options) {
  if (options.inputs.empty()) {
    return usage_error("name a notebook (or a directory of them)");
  }
  if (std::count(options.inputs.begin(), options.inputs.end(), "-") > 1) {
    return usage_error("- (stdin) can be read once");
  }
  if (options.inplace &&
      std::find(options.inputs.begin(), options.inputs.end(), "-") != options.inputs.end()) {
    return usage_error("--inplace cannot write over stdin (-): name an output");
  }
  if (options.output == "-" && options.json) {
    return usage_error("the notebook goes to stdout (-), and so would --json: pick one");
  }
  if (options.output_dir == "-") {
    return usage_error("--output-dir takes a directory; - (stdout) is for one notebook (-o -)");
  }
  if (options.prepare_only && options.output.empty() && options.output_dir.empty() &&
      !options.inplace) {
    return usage_error("--prepare-only writes the prepared notebook: name an output");
  }
  if (std::error_code ec; !options.cwd.empty() && !std::filesystem::is_directory(options.cwd, ec)) {
    return usage_error("--cwd " + options.cwd + ": not a directory");
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
  std::vector<notebook::Parameter> typed;
  for (const auto& [name, value] : options.parameters) {
    CELLGATE_ASSIGN_OR_RETURN(auto p, parameters::typed(name, value));
    typed.push_back(std::move(p));
  }
  std::vector<notebook::Parameter> raw;
  for (const auto& [name, value] : options.raw_parameters) {
    CELLGATE_ASSIGN_OR_RETURN(auto p, parameters::raw(name, value));
    raw.push_back(std::move(p));
  }
  std::vector<std::vector<notebook::Parameter>> yaml;
  for (const auto& file : options.parameter_files) {
    auto text = read_file(file);
    if (!text) {
      return usage_error("-f " + file + ": " + text.error().message);
    }
    auto ps = parameters::yaml(*text);
    if (!ps) {
      return usage_error("-f " + file + ": " + ps.error().message);
    }
    yaml.push_back(std::move(ps).value());
  }
  for (const auto& text : options.yaml_parameters) {
    CELLGATE_ASSIGN_OR_RETURN(auto ps, parameters::yaml(text));
    yaml.push_back(std::move(ps));
  }
  return parameters::merge(yaml, typed, raw);
}

// The embedded gateway, or the one at --url; and the --kernel checked against it.
Result<std::unique_ptr<Backend>> make_backend(const NotebookRunOptions& options,
                                              std::size_t notebooks) {
  EmbeddedSettings embedded;
  embedded.kernels = static_cast<std::size_t>(options.jobs);
  embedded.no_jail = options.no_jail;
  embedded.notebooks = notebooks;
  auto made = options.url.empty()
                  ? make_embedded_backend(embedded)
                  : make_remote_backend(options.url, options.token, embedded.kernels);
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

}  // namespace

CLI::App* add_run_command(CLI::App& app, NotebookRunOptions& run) {
  auto* cmd = app.add_subcommand(
      "run",
      "execute notebooks headless in jailed kernels (exit 0 ok, 1 a notebook failed, "
      "2 usage or invalid notebook)");
  cmd->add_option("notebooks", run.inputs,
                  "notebooks (.ipynb) or directories of them; or papermill's INPUT OUTPUT: two "
                  "names, an existing file (or - for stdin) then a name ending in .ipynb that is "
                  "not a directory (or - for stdout), with none of -o, --output-dir, --inplace. "
                  "An existing OUTPUT is overwritten only if it is an executed notebook (it has "
                  "metadata.papermill); else pass -o OUTPUT, or --output-dir DIR to run both")
      ->required();
  cmd->add_option("-o,--output", run.output,
                  "write the executed notebook here (one input; -: stdout, the summary then goes "
                  "to stderr)");
  cmd->add_option("--output-dir", run.output_dir,
                  "write each executed notebook to DIR/<name>.ipynb");
  cmd->add_flag("--inplace", run.inplace, "write each executed notebook over its input");
  // Two values per -p / -r (a pair), as papermill's; the notebooks may follow.
  cmd->add_option("-p,--parameters", run.parameters,
                  "NAME VALUE: a parameter, typed as papermill's -p (int, float, True, False, "
                  "None, else a string); injected after the cell tagged 'parameters' (repeat)")
      ->allow_extra_args(false)
      ->type_name("NAME VALUE");
  cmd->add_option("-r,--parameters_raw", run.raw_parameters,
                  "NAME VALUE: a parameter whose value is the string as it is (repeat)")
      ->allow_extra_args(false)
      ->type_name("NAME VALUE");
  cmd->add_option("-y,--parameters_yaml", run.yaml_parameters,
                  "YAML: a mapping of parameters, YAML or JSON ('n: 3' or '{\"n\": 3}'; repeat)")
      ->allow_extra_args(false);
  cmd->add_option("-f,--parameters_file", run.parameter_files,
                  "FILE.yaml: a mapping of parameters from a file, as -y (repeat; before -y)")
      ->allow_extra_args(false);
  cmd->add_option("-t,--timeout,--execution-timeout", run.timeout_seconds,
                  "interrupt a cell after this many seconds; the notebook fails, or with "
                  "--allow-errors the cell is an error and the run goes on (0: never)");
  cmd->add_option("--cwd", run.cwd,
                  "the kernel's work dir (its cwd, in the jail) gets DIR's files (DIR/* and "
                  "DIR/data/, as the notebook's directory's otherwise); DIR itself is not written");
  cmd->add_flag("--prepare-only", run.prepare_only,
                "inject the parameters and write the output notebook without running it");
  cmd->add_flag("--log-output", run.log_output, "write the cells' outputs to stderr as they come");
  cmd->add_flag("--allow-errors", run.allow_errors,
                "run every cell even after errors and timeouts (a timed-out cell is interrupted)");
  cmd->add_option("--artifacts", run.artifacts_dir,
                  "save displayed images and PDFs to DIR/<notebook>/cell<i>-<n>.<ext>");
  cmd->add_option("-k,--kernel", run.kernel,
                  "kernelspec (default: the notebook's, when known here; else python3)");
  cmd->add_option("--url", run.url, "run on this running gateway (http[s]://host:port)")
      ->envname("CELLGATE_URL");
  cmd->add_option("--token", run.token, "the gateway's token")->envname("CELLGATE_TOKEN");
  cmd->add_flag("--json", run.json, "print the summary as JSON on stdout");
  cmd->add_option("-j,--jobs", run.jobs, "notebooks run at once, each in its own kernel")
      ->capture_default_str();
  cmd->add_option("--results", run.results,
                  "write per-notebook results: FILE.json / FILE.csv, or both for another name");
  cmd->add_flag("--no-jail", run.no_jail,
                "run embedded kernels UNJAILED (not for untrusted notebooks)");
  cmd->add_flag("!--no-progress", run.progress, "no progress line on a terminal");
  return cmd;
}

int run_notebooks(const NotebookRunOptions& given) {
  NotebookRunOptions options = given;
  if (auto taken = take_papermill_output(options); !taken) {
    return usage(taken.error().message);
  }
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
  std::size_t runnable = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].notebook) {
      ++runnable;
    } else {
      outcomes[i].status = Status::kInvalid;
      outcomes[i].message = jobs[i].invalid;
      report_notebook(options, jobs[i], outcomes[i], single, progress);
    }
  }

  const auto started = Clock::now();
  bool interrupted = false;
  if (runnable > 0 && options.prepare_only) {
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].notebook) {
        NotebookRun run;
        run.parameters = *parameters;
        run.kernel = options.kernel;
        run.output = jobs[i].output;
        run.input_path = jobs[i].path;
        outcomes[i] = prepare_notebook(*jobs[i].notebook, run);
        outcomes[i].notebook = nullptr;
        report_notebook(options, jobs[i], outcomes[i], single, progress);
      }
    }
  } else if (runnable > 0) {
    quiet_logging();
    auto backend = make_backend(options, runnable);
    if (!backend) {
      return usage(backend.error().message);
    }
    NotebookRun common;
    common.parameters = std::move(parameters).value();
    common.timeout_seconds = options.timeout_seconds;
    common.allow_errors = options.allow_errors;
    common.kernel = options.kernel;
    OutputLog log;
    if (options.log_output) {
      log.start();
      common.on_event = [&log](const nlohmann::json& event) { log.add(event); };
    }
    SignalWatch signals([&backend] { (*backend)->cancel(); });
    auto report = [&](std::size_t i) {
      report_notebook(options, jobs[i], outcomes[i], single, progress);
    };
    run_jobs(jobs, **backend, common, static_cast<std::size_t>(options.jobs), progress, outcomes,
             report);
    log.stop();  // what is queued is written before the summary
    progress.finish();
    interrupted = signals.fired();
    // Leaving this scope stops the signal watch, then the backend: the embedded gateway's
    // kernels and temp dir go.
  }
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();
  return summarize(options, jobs, outcomes, wall, interrupted);
}

}  // namespace cellgate::notebooks
