// Where a notebook run gets its kernels: an embedded gateway (a KernelRegistry and an Executor in
// this process, state in a temp dir removed at the end) or a running `cellgate serve` (--url).
// Both are one implementation over the client seam (cellgate/client/kernels.hpp: make_local or
// make_remote): one KernelSession per notebook, each cell answered with the Executor's answer
// (see cellgate/execute/executor.hpp), so the runner does not know which it talks to.
//
//   CELLGATE_ASSIGN_OR_RETURN(auto backend, make_embedded_backend(settings));
//   CELLGATE_ASSIGN_OR_RETURN(auto session, backend->start("python3"));
//   CELLGATE_TRY(session->put_file("data/sales.csv", bytes));
//   CELLGATE_ASSIGN_OR_RETURN(CellAnswer answer, session->execute("1 + 1", 30));
//   session.reset();                      // the kernel is shut down
//
// An answer also carries the executor's events of the cell in order (stream, display_data,
// execute_result, update_display_data with its display_id, error, clear_output with its wait
// flag; no keepalives), from which the runner builds outputs as nbclient does (outputs.hpp); the
// result's own outputs are one cell's view.
//
// Thread-safety: a Backend's methods may be called from many threads at once (one notebook per
// worker thread); a KernelSession is used by one thread. cancel() may be called from any thread
// and makes running and later cells stop soon (answers "aborted" or an interrupted cell).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "cellgate/execute/cell_result.hpp"
#include "cellgate/result.hpp"

namespace cellgate::notebooks {

// One cell's answer: the executor's (or a gateway's) CellResult, and the cell's events when the
// backend kept them (a JSON array; none: the runner uses result.outputs).
struct CellAnswer {
  execute::CellResult result;
  std::optional<nlohmann::json> events;
};

class KernelSession {
 public:
  virtual ~KernelSession() = default;  // shuts the kernel down
  // Places a file in the kernel's work dir (its cwd); missing directories are made.
  virtual Result<void> put_file(const std::string& rel, const std::string& bytes) = 0;
  // Runs one cell; timeout_seconds <= 0: no limit (a remote gateway clamps it to its maximum).
  virtual Result<CellAnswer> execute(const std::string& code, double timeout_seconds) = 0;
  // The kernel's kernel_info_reply content (its "language_info" goes into the notebook's
  // metadata, as nbclient writes it). A remote gateway offers no kernel_info over REST: there it
  // is {"language_info": {"name": <the kernelspec's language>}}.
  virtual Result<nlohmann::json> kernel_info() = 0;

  // Called with each of a cell's events (the executor's, untrimmed) as it arrives, before
  // execute() returns, on the strand or thread that delivers them (not execute()'s caller): it
  // must not block. `cellgate run --log-output`. Set it before execute(); empty: none.
  void watch_events(std::function<void(const nlohmann::json& event)> watch) {
    watch_ = std::move(watch);
  }

 protected:
  const std::function<void(const nlohmann::json& event)>& event_watch() const { return watch_; }

 private:
  std::function<void(const nlohmann::json& event)> watch_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The kernelspec names this backend can start, and the one it starts by default.
  virtual const std::set<std::string>& kernelspecs() const = 0;
  virtual std::string default_kernel() const = 0;
  // Blocking: returns once the kernel answers.
  virtual Result<std::unique_ptr<KernelSession>> start(const std::string& kernel) = 0;
  // The largest file put_file accepts.
  virtual std::size_t max_file_bytes() const = 0;
  // Whether a cell may be cut short of the timeout it asks for (a remote gateway's
  // --execute-max-timeout).
  virtual bool clamps_timeouts() const = 0;
  // Stops running cells (Ctrl-C); later execute() calls answer "aborted" or fail.
  virtual void cancel() = 0;
  virtual bool cancelled() const = 0;
};

struct EmbeddedSettings {
  std::size_t kernels = 1;  // kernels at once (--jobs)
  bool no_jail = false;
  // Notebooks this run will start kernels for. Jailed, more than one forks python3 kernels from
  // a zygote started once (as `cellgate serve` does); a single one starts cold, sooner than the
  // zygote's imports would be done.
  std::size_t notebooks = 1;
};
// Jailed, on cgroup v2 the process may first move itself into a leaf of its delegated cgroup
// (jail::place_kernel_cgroups); an undelegated cgroup is an error saying what to run instead.
// A temp state dir under $TMPDIR (removed when the backend is destroyed), a KernelRegistry and an
// Executor. Server-side caps are set high enough for notebooks (64 MiB per stream and output).
Result<std::unique_ptr<Backend>> make_embedded_backend(const EmbeddedSettings& settings);

// Checks the URL and token up front (GET /api/kernelspecs), so a wrong token is a usage error.
// `jobs`: notebooks run at once (each holds a thread while its cell runs).
Result<std::unique_ptr<Backend>> make_remote_backend(const std::string& url,
                                                     const std::string& token,
                                                     std::size_t jobs = 1);

}  // namespace cellgate::notebooks
