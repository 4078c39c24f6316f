// `cellgate serve --api notebook-http`: Kernel Gateway's notebook-http mode
// (kernel_gateway.notebook_http, 2.5.2). The seed notebook's annotated cells are HTTP endpoints
// (annotations.hpp), served by a fixed pool of `prespawn` kernels of its kernelspec, each seeded
// with the notebook's other code cells, handed out first in, first out.
//
//   auto service = Service::create(std::move(notebook), options, kernels, offload);
//   CELLGATE_TRY((*service)->prespawn());   // blocking: starts and seeds every kernel, or fails
//   // then serve it: an http::Handler
//
// A request to an endpoint: its token checked (when one is set; OPTIONS never), a kernel taken
// from the pool (waiting for one), then three cells in it: `REQUEST = "…"` (request.hpp), the
// endpoint's code for the verb, and its ResponseInfo code if any. The answer is the code's stdout,
// else its execute_result's MIME bundle as JSON, else empty; text/plain, 200, unless ResponseInfo
// printed {"status": …, "headers": {…}}. A cell that raises: 500 "Error {ename}: {evalue} \n".
// A verb the endpoint lacks: 405 with an empty body (PATCH, HEAD and others: 405 in JSON).
// Unknown paths: 404 {"reason": "Not Found", "message": ""}. Also /_api/spec/swagger.json,
// /_api/source (allow_notebook_download) and /public/… (static_path). Every path is below
// base_url. A kernel whose cell ran past the timeout is restarted by the executor: it is seeded
// again before it serves again, and leaves the pool if that fails.
//
// Thread-safety: handle() from any network thread; prespawn() once, before serving.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cellgate/client/kernels.hpp"
#include "cellgate/http/handler.hpp"
#include "cellgate/notebook_http/notebook.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::notebook_http {

struct Options {
  std::string base_url = "/";
  std::string token;  // "" : no token asked for
  std::vector<std::string> allow_origins;
  int prespawn = 1;         // kernels in the pool (at least 1)
  std::string kernel_name;  // "" : the notebook's kernelspec (then the gateway's default)
  bool allow_notebook_download = false;
  std::string static_path;    // "" : no /public
  double cell_timeout = 600;  // seconds each cell of a request may run
  std::size_t max_static_bytes = 16u << 20;
};

class Service : public http::Handler {
 public:
  // Errors: the notebook has no endpoints, or a bad annotation (kInvalidArgument).
  static Result<std::unique_ptr<Service>> create(SeedNotebook notebook, Options options,
                                                 client::Kernels& kernels, util::Offload offload);
  ~Service() override;

  // Starts the pool's kernels at once and seeds each (blocking; not on a network thread). An
  // error names the kernel's start failure or the seed cell that failed; the kernels started are
  // shut down.
  Result<void> prespawn();
  // The kernelspec the pool runs.
  const std::string& kernel_name() const;

  void handle(http::Request req, std::shared_ptr<http::Exchange> exchange) override;
  http::Upgrade upgrade(const http::Request& req) override;

  struct Impl;

 private:
  explicit Service(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// Kernel Gateway's Swagger 2.0 document for the notebook, as its JSON text.
std::string swagger_json(const SeedNotebook& notebook, std::string_view comment_prefix);

}  // namespace cellgate::notebook_http
