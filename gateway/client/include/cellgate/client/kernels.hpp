// The one client seam over cellgate's kernels: start a kernel of a kernelspec, run a cell with its
// events, move work-dir files, restart, shut down. The MCP tools (`cellgate mcp`, /mcp),
// `cellgate run` and `cellgate exec --url` use it and do not know which implementation they talk
// to:
//   - make_local(): the registry, the executor and the work-dir files in this process (an
//     engine's parts, engine/engine.hpp) — the same calls the agent API's routes make;
//   - make_remote(): a running `cellgate serve` through its agent API over HTTP (http's client).
//     This is the only C++ code that calls the agent API.
//
//   auto kernels = client::make_local(engine.registry(), engine.executor(), {});
//   CELLGATE_ASSIGN_OR_RETURN(std::string id, kernels->start("python3"));   // blocking
//   execute::ExecuteRequest cell{.code = "print(1 + 1)", .timeout_seconds = 30};
//   auto running = kernels->execute(id, cell, {
//       .on_event = [](const nlohmann::json& event) { … },   // {"type": "stream", …}
//       .on_keepalive = [] { … },
//       .done = [](Result<execute::CellResult> answer) { … }});
//   running->cancel();                       // the cell is interrupted
//   // or, blocking: auto answer = client::run_and_wait(*kernels, id, cell, on_event);
//
// A cell's events are the executor's (execute/executor.hpp): stream, execute_result,
// display_data, update_display_data, error, clear_output and notice objects, in order, then the
// typed answer (execute::CellResult). Keepalives go to on_keepalive instead (the local one sends
// them every Options::keepalive when on_keepalive is set; a gateway sends them at its own
// --execute-keepalive). Timeouts, output caps, artifacts and the audit log are the executor's:
// there is no second cell runner here.
//
// Cancel: locally the cell answers "aborted" (executor.hpp's CellHandle); remotely the kernel is
// interrupted (POST /api/kernels/{id}/interrupt) and the gateway answers the cell as it ended.
//
// Thread-safety: every method may be called from any thread at once. The blocking ones (start,
// restart, shutdown, the file calls, kernelspecs, kernel_info, run_and_wait) must not run on a
// network thread or the cell loop. Callbacks must not block: locally they run on the cell's
// strand, remotely on the offload thread that reads the gateway's answer; on_event and
// on_keepalive are called one at a time and before done, which is called once.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/execute/cell_result.hpp"
#include "cellgate/execute/executor.hpp"
#include "cellgate/http/client.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::kernels {
class KernelRegistry;
}

namespace cellgate::client {

struct KernelSpecs {
  struct Spec {
    std::string name;
    std::string language;  // as the kernelspec says it ("python", "R", …)
  };
  std::vector<Spec> specs;
  std::string default_name;
};

struct CellCallbacks {
  // Each event of the cell but keepalives, as the executor sends it; optional.
  std::function<void(const nlohmann::json& event)> on_event;
  // The cell still runs; optional.
  std::function<void()> on_keepalive;
  // Once: the answer, or why the cell could not run (kNotFound: no such kernel).
  std::function<void(Result<execute::CellResult>)> done;
};

class Cell {
 public:
  virtual ~Cell() = default;
  virtual void cancel() = 0;
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Result<KernelSpecs> kernelspecs() = 0;
  // Starts a kernel of this kernelspec; its id once it answers.
  virtual Result<std::string> start(const std::string& kernelspec) = 0;
  virtual Result<void> restart(const std::string& id) = 0;
  virtual Result<void> shutdown(const std::string& id) = 0;
  // Checkpoints an idle kernel that runs on (POST /api/kernels/{id}/snapshots): the snapshot id.
  virtual Result<std::string> snapshot(const std::string& id) = 0;
  // A new kernel restored from a snapshot (POST /api/kernels {"snapshot"}): its id and
  // kernelspec.
  struct Copy {
    std::string id;
    std::string kernelspec;
  };
  virtual Result<Copy> start_from_snapshot(const std::string& snapshot_id) = 0;
  // `count` copies of an idle kernel (POST /api/kernels/{id}/fork): their ids.
  virtual Result<std::vector<std::string>> fork(const std::string& id, int count) = 0;
  // One cell in kernel `id` (its timeout clamped to Options::max_timeout). setup_code and
  // teardown_code are the E2B endpoint's and are not sent to a gateway.
  virtual std::shared_ptr<Cell> execute(const std::string& id, execute::ExecuteRequest request,
                                        CellCallbacks callbacks) = 0;
  // A fresh kernel of `kernelspec` ("" : the default) for one cell, shut down after it
  // (POST /api/execute). Its cancel() cannot interrupt a remote one.
  virtual std::shared_ptr<Cell> execute_once(const std::string& kernelspec,
                                             execute::ExecuteRequest request,
                                             CellCallbacks callbacks) = 0;
  // A directory of the work dir: {"path", "entries": [{name, path, type, size, mtime}],
  // "truncated"}, as GET /api/kernels/{id}/files/{dir} answers.
  virtual Result<nlohmann::json> list_files(const std::string& id, const std::string& dir) = 0;
  virtual Result<std::string> read_file(const std::string& id, const std::string& path) = 0;
  // Creates missing parent directories; the file's entry as list_files gives it.
  virtual Result<nlohmann::json> write_file(const std::string& id, const std::string& path,
                                            const std::string& bytes) = 0;
  // The kernel's kernel_info_reply content. A gateway offers no kernel_info over REST: there it
  // is {"language_info": {"name": <the kernelspec's language>}} (or {} when it has none).
  virtual Result<nlohmann::json> kernel_info(const std::string& id) = 0;
  // The URL prefix a stored artifact is fetched from by its SHA-256 ("/api/artifacts/"), or ""
  // when nobody can fetch it (an embedded run).
  virtual std::string artifact_base() const = 0;
};

struct Options {
  double max_timeout = std::numeric_limits<double>::infinity();  // seconds; longer cells clamped
  std::size_t max_file_bytes = 16u << 20;                        // read_file / write_file
  std::chrono::milliseconds keepalive{3000};                     // local keepalives
  std::string client = "client";  // who runs cells: the audit log's client, the User-Agent
  std::string artifact_base;      // local: "/api/artifacts/" on a gateway; "": not served
};

// The registry and executor outlive it.
std::unique_ptr<Kernels> make_local(kernels::KernelRegistry& registry, execute::Executor& executor,
                                    Options options);

// A running gateway, checked up front (GET /api/kernelspecs) so a wrong URL or token is an error
// now rather than at the first call. Its own --execute-max-timeout clamps cells too. `offload`
// reads each cell's streamed answer (one blocking task per running cell); it and the token stay
// with the Kernels.
Result<std::unique_ptr<Kernels>> make_remote(http::client::Url url, std::string token,
                                             Options options, util::Offload offload);

// Blocking: runs the cell and waits for its answer. `on_event` gets the cell's events as
// CellCallbacks::on_event does; `started`, if given, gets the cell first (to cancel it from
// another thread). Not on the loop's or a network thread. An empty `id` runs execute_once of
// `kernelspec`.
struct WaitOptions {
  std::function<void(const nlohmann::json& event)> on_event;
  std::function<void(std::shared_ptr<Cell>)> started;
  std::string kernelspec;  // for execute_once
};
Result<execute::CellResult> run_and_wait(Kernels& kernels, const std::string& id,
                                         execute::ExecuteRequest request, WaitOptions options = {});

// The agent API's request body for a cell: {"code", "timeout", "stdin"?, "store_history"?}.
nlohmann::json request_json(const execute::ExecuteRequest& request);

}  // namespace cellgate::client
