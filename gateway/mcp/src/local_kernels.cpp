// Kernels in this process: the registry starts and stops them, the executor runs cells (its
// timeouts, caps, artifacts and audit log), store::files reaches their work dirs — the same
// calls the agent API's routes make (api/src/agent.cpp, api/src/jupyter.cpp).
#include <chrono>

#include "cellgate/execute/executor.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/mcp/kernels.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/files.hpp"

namespace cellgate::mcp {
namespace {

using nlohmann::json;

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
  LocalKernels(kernels::KernelRegistry& registry, execute::Executor& executor,
               KernelsOptions options, util::Offload offload)
      : registry_(registry),
        executor_(executor),
        options_(std::move(options)),
        offload_(std::move(offload)) {}

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

  Result<void> shutdown(const std::string& id) override {
    auto r = registry_.shutdown(id);
    executor_.artifacts().forget(id);  // the content stays, by SHA-256
    return r;
  }

  std::shared_ptr<Cell> execute(const std::string& id, const json& body,
                                CellCallbacks callbacks) override {
    auto request = execute::ExecuteRequest::from_json(body, options_.max_timeout);
    if (!request) {
      callbacks.done(std::move(request).error());
      return std::make_shared<LocalCell>(nullptr);
    }
    execute::RunOptions run;
    run.client = options_.client;
    if (callbacks.on_keepalive) {
      run.keepalive = options_.keepalive;
      // on_event runs on the cell's strand and must not block; a progress notification is
      // written to a pipe or a socket, so it goes to the offload pool.
      run.on_event = [tick = callbacks.on_keepalive, offload = offload_](const json& event) {
        if (event.value("type", std::string()) == "keepalive") {
          offload(tick);
        }
      };
    }
    return std::make_shared<LocalCell>(executor_.run(
        id, std::move(request).value(), std::move(run),
        [done = std::move(callbacks.done)](execute::Answer answer) { done(std::move(answer)); }));
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

  std::string artifact_base() const override { return options_.artifact_base; }

 private:
  Result<store::files::WorkDir> open(const std::string& id) {
    CELLGATE_ASSIGN_OR_RETURN(auto kernel, registry_.find(id));
    return store::files::WorkDir::open(kernel->work_dir(), kernel->files_uid(),
                                       kernel->files_uid());
  }

  kernels::KernelRegistry& registry_;
  execute::Executor& executor_;
  const KernelsOptions options_;
  util::Offload offload_;
};

}  // namespace

std::unique_ptr<Kernels> make_local_kernels(kernels::KernelRegistry& registry,
                                            execute::Executor& executor, KernelsOptions options,
                                            util::Offload offload) {
  return std::make_unique<LocalKernels>(registry, executor, std::move(options), std::move(offload));
}

}  // namespace cellgate::mcp
