// What both implementations share: the blocking form of a cell, the agent API's request body.
#include <future>

#include "cellgate/client/kernels.hpp"

namespace cellgate::client {

using nlohmann::json;

Result<execute::CellResult> run_and_wait(Kernels& kernels, const std::string& id,
                                         execute::ExecuteRequest request, WaitOptions options) {
  // The promise orders the cell's events before its answer: done is called after the last
  // on_event, on the same strand or thread.
  auto answer = std::make_shared<std::promise<Result<execute::CellResult>>>();
  auto future = answer->get_future();
  CellCallbacks callbacks;
  callbacks.on_event = std::move(options.on_event);
  callbacks.done = [answer](Result<execute::CellResult> a) { answer->set_value(std::move(a)); };
  auto cell = id.empty() ? kernels.execute_once(options.kernelspec, std::move(request),
                                                std::move(callbacks))
                         : kernels.execute(id, std::move(request), std::move(callbacks));
  if (options.started) {
    options.started(cell);
  }
  return future.get();
}

json request_json(const execute::ExecuteRequest& request) {
  json body = {{"code", request.code}, {"timeout", request.timeout_seconds}};
  if (!request.stdin_lines.empty()) {
    body["stdin"] = request.stdin_lines;
  }
  if (!request.store_history) {
    body["store_history"] = false;
  }
  return body;
}

}  // namespace cellgate::client
