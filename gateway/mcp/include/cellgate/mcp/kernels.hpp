// Where the kernels behind MCP sessions live: the seam between the MCP server and the rest of
// cellgate. Two implementations: LocalKernels drives the registry, the executor and the work-dir
// files in this process (`cellgate serve`'s /mcp, and `cellgate mcp` embedded); RemoteKernels
// drives a running gateway's agent API over HTTP (`cellgate mcp --url`). Both answer a cell with
// the agent API's answer (cellgate/execute/executor.hpp), so the tools do not know which they use.
//
//   LocalKernels kernels(registry, executor, {.max_timeout = 600}, offload);
//   CELLGATE_ASSIGN_OR_RETURN(std::string id, kernels.start("python3"));   // blocking
//   auto cell = kernels.execute(id, {{"code", "1 + 1"}, {"timeout", 30}},
//                               {.on_keepalive = …, .done = [](Result<CellResult> answer) {…}});
//   cell->cancel();                       // the cell is interrupted; the answer says "aborted"
//
// Cells never hold a thread in LocalKernels (the executor's state machines); RemoteKernels waits
// for the gateway on an offload thread. Timeouts, output caps, artifacts and the audit log are
// the executor's, as for POST /api/kernels/{id}/execute: there is no second cell runner here.
//
// Thread-safety: every method may be called from any thread. The blocking ones (start, restart,
// shutdown, the file calls, kernelspecs) must not run on a network thread or the cell loop.
// CellCallbacks are called on whatever thread the cell ends on and must not block.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cellgate/execute/cell_result.hpp"
#include "cellgate/http/client.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::kernels {
class KernelRegistry;
}
namespace cellgate::execute {
class Executor;
}

namespace cellgate::mcp {

struct KernelSpecs {
  struct Spec {
    std::string name;
    std::string language;  // as the kernelspec says it ("python", "R", …)
  };
  std::vector<Spec> specs;
  std::string default_name;
};

struct CellCallbacks {
  // The cell still runs (about every KernelsOptions::keepalive); optional.
  std::function<void()> on_keepalive;
  // Once: the agent API's answer, or why the cell could not run (kNotFound: no such kernel).
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
  // `request` is the agent API's body: {"code", "timeout", "stdin"?}.
  virtual std::shared_ptr<Cell> execute(const std::string& id, const nlohmann::json& request,
                                        CellCallbacks callbacks) = 0;
  // A directory of the work dir: {"path", "entries": [{name, path, type, size, mtime}],
  // "truncated"}, as GET /api/kernels/{id}/files/{dir} answers.
  virtual Result<nlohmann::json> list_files(const std::string& id, const std::string& dir) = 0;
  virtual Result<std::string> read_file(const std::string& id, const std::string& path) = 0;
  // Creates missing parent directories; the file's entry as list_files gives it.
  virtual Result<nlohmann::json> write_file(const std::string& id, const std::string& path,
                                            const std::string& bytes) = 0;
  // The URL prefix a stored artifact is fetched from by its SHA-256 ("/api/artifacts/"), or ""
  // when nobody can fetch it (an embedded run).
  virtual std::string artifact_base() const = 0;
};

struct KernelsOptions {
  double max_timeout = 600;                // seconds; longer cells are clamped
  std::size_t max_file_bytes = 16u << 20;  // read_file / write_file
  std::chrono::milliseconds keepalive{3000};
  std::string client = "mcp";  // who runs cells, for the audit log
  std::string artifact_base;   // "/api/artifacts/" on a gateway; "" : artifacts are not served
};

// The registry and executor outlive it; `offload` runs the blocking work.
std::unique_ptr<Kernels> make_local_kernels(kernels::KernelRegistry& registry,
                                            execute::Executor& executor, KernelsOptions options,
                                            util::Offload offload);

// A running gateway, checked up front (GET /api/kernelspecs) so a wrong URL or token is an error
// now rather than at the first tool call. Its own --execute-max-timeout clamps cells too.
Result<std::unique_ptr<Kernels>> make_remote_kernels(http::client::Url url, std::string token,
                                                     KernelsOptions options, util::Offload offload);

}  // namespace cellgate::mcp
