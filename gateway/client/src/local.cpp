// Kernels in this process: the registry starts and stops them, the executor runs cells (its
// timeouts, caps, artifacts and audit log), store::files reaches their work dirs — the same
// calls the agent API's routes make (api/src/agent.cpp, api/src/jupyter.cpp).
#include <algorithm>
#include <chrono>

#include "cellgate/client/kernels.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/files.hpp"

namespace cellgate::client {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr auto kKernelInfoTimeout = 10s;

class LocalCell : public Cell {
 public:
  explicit LocalCell(std::shared_ptr<execute::CellHandle> handle) : handle_(std::move(handle)) {}
  void cancel() override {
    if (handle_) {
      handle_->cancel();
    }
  }

 private:
  std::shared_ptr<execute::CellHandle> handle_;
};

class LocalKernels : public Kernels {
 public:
  LocalKernels(kernels::KernelRegistry& registry, execute::Executor& executor, Options options)
      : registry_(registry), executor_(executor), options_(std::move(options)) {}

  Result<KernelSpecs> kernelspecs() override {
    KernelSpecs specs;
    for (const auto& s : registry_.kernelspecs()) {
      specs.specs.push_back({s.name, s.language});
    }
    specs.default_name = registry_.default_kernel_name();
    return specs;
  }

  Result<std::string> start(const std::string& kernelspec) override {
    CELLGATE_ASSIGN_OR_RETURN(auto model, registry_.start(kernelspec, json::object()));
    return model.id;
  }

  Result<void> restart(const std::string& id) override {
    CELLGATE_TRY(registry_.restart(id));
    return ok_result();
  }

  Result<std::string> snapshot(const std::string& id) override {
    CELLGATE_ASSIGN_OR_RETURN(auto snap, registry_.snapshot(id));
    return snap.id;
  }

  Result<Copy> start_from_snapshot(const std::string& snapshot_id) override {
    CELLGATE_ASSIGN_OR_RETURN(auto model,
                              registry_.start_from_snapshot(snapshot_id, "", json::object()));
    return Copy{model.id, model.name};
  }

  Result<std::vector<std::string>> fork(const std::string& id, int count) override {
    CELLGATE_ASSIGN_OR_RETURN(auto models, registry_.fork(id, count));
    std::vector<std::string> ids;
    for (const auto& m : models) {
      ids.push_back(m.id);
    }
    return ids;
  }

  Result<void> shutdown(const std::string& id) override {
    auto r = registry_.shutdown(id);
    executor_.artifacts().forget(id);  // the content stays, by SHA-256
    return r;
  }

  std::shared_ptr<Cell> execute(const std::string& id, execute::ExecuteRequest request,
                                CellCallbacks callbacks) override {
    clamp(request);
    auto run = run_options(callbacks);
    return std::make_shared<LocalCell>(executor_.run(
        id, std::move(request), std::move(run),
        [done = std::move(callbacks.done)](execute::Answer a) { done(std::move(a)); }));
  }

  std::shared_ptr<Cell> execute_once(const std::string& kernelspec, execute::ExecuteRequest request,
                                     CellCallbacks callbacks) override {
    clamp(request);
    auto run = run_options(callbacks);
    execute::OneShotRequest once;
    once.cell = std::move(request);
    once.kernel_name = kernelspec;
    return std::make_shared<LocalCell>(executor_.run_once(
        std::move(once), std::move(run),
        [done = std::move(callbacks.done)](execute::Answer a) { done(std::move(a)); }));
  }

  Result<json> list_files(const std::string& id, const std::string& dir) override {
    CELLGATE_ASSIGN_OR_RETURN(auto work, open(id));
    std::string rel;
    if (!dir.empty() && dir != "." && dir != "/") {
      CELLGATE_ASSIGN_OR_RETURN(rel, store::files::normalize(dir));
    }
    CELLGATE_ASSIGN_OR_RETURN(auto listing, work.list(rel));
    json entries = json::array();
    for (const auto& e : listing.entries) {
      entries.push_back(store::files::to_json(e));
    }
    return json{{"path", rel}, {"entries", entries}, {"truncated", listing.truncated}};
  }

  Result<std::string> read_file(const std::string& id, const std::string& path) override {
    CELLGATE_ASSIGN_OR_RETURN(auto work, open(id));
    return work.read(path, options_.max_file_bytes);
  }

  Result<json> write_file(const std::string& id, const std::string& path,
                          const std::string& bytes) override {
    CELLGATE_ASSIGN_OR_RETURN(auto work, open(id));
    CELLGATE_ASSIGN_OR_RETURN(
        auto info, work.write(path, bytes, options_.max_file_bytes, /*make_parents=*/true));
    return store::files::to_json(info);
  }

  Result<json> kernel_info(const std::string& id) override {
    CELLGATE_ASSIGN_OR_RETURN(auto kernel, registry_.find(id));
    auto connection = kernel->connection();
    if (!connection) {
      return make_error(ErrorCode::kUnavailable, "no_connection", "the kernel is not connected");
    }
    CELLGATE_ASSIGN_OR_RETURN(auto collected,
                              connection->request(protocol::Channel::kShell, "kernel_info_request",
                                                  json::object(), kKernelInfoTimeout,
                                                  /*wait_for_idle=*/false));
    if (!collected.reply || !collected.reply->content.is_object()) {
      return make_error(ErrorCode::kUnavailable, "no_reply",
                        "the kernel sent no kernel_info_reply");
    }
    return collected.reply->content;
  }

  std::string artifact_base() const override { return options_.artifact_base; }

 private:
  void clamp(execute::ExecuteRequest& request) const {
    request.timeout_seconds = std::min(request.timeout_seconds, options_.max_timeout);
  }

  execute::RunOptions run_options(const CellCallbacks& callbacks) const {
    execute::RunOptions run;
    run.client = options_.client;
    if (callbacks.on_keepalive) {
      run.keepalive = options_.keepalive;
    }
    if (callbacks.on_event || callbacks.on_keepalive) {
      run.on_event = [on_event = callbacks.on_event,
                      tick = callbacks.on_keepalive](const json& event) {
        const auto type = event.find("type");
        if (type != event.end() && *type == "keepalive") {
          if (tick) {
            tick();
          }
        } else if (on_event) {
          on_event(event);
        }
      };
    }
    return run;
  }

  Result<store::files::WorkDir> open(const std::string& id) {
    CELLGATE_ASSIGN_OR_RETURN(auto kernel, registry_.find(id));
    return store::files::WorkDir::open(kernel->work_dir(), kernel->files_uid(),
                                       kernel->files_uid());
  }

  kernels::KernelRegistry& registry_;
  execute::Executor& executor_;
  const Options options_;
};

}  // namespace

std::unique_ptr<Kernels> make_local(kernels::KernelRegistry& registry, execute::Executor& executor,
                                    Options options) {
  return std::make_unique<LocalKernels>(registry, executor, std::move(options));
}

}  // namespace cellgate::client
