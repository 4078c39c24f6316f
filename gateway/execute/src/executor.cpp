// The Executor: starts cells (cell.hpp) on strands of the loop, one FIFO per kernel
// (queue.hpp); one-shot runs (a kernel started and shut down on the offload pool around one
// cell), silent runs, and blocking wrappers for callers that may wait.
#include "cellgate/execute/executor.hpp"

#include <spdlog/spdlog.h>

#include <future>
#include <utility>

#include "cell.hpp"
#include "cellgate/store/artifacts.hpp"
#include "cellgate/store/files.hpp"

namespace cellgate::execute {
namespace {

using nlohmann::json;

constexpr auto kCancelPoll = std::chrono::milliseconds(50);  // run_and_wait's cancel flag

// What run() hands back: cancel() reaches the cell if it is still there.
class CellRef : public CellHandle {
 public:
  explicit CellRef(std::weak_ptr<Cell> cell) : cell_(std::move(cell)) {}
  void cancel() override {
    if (auto cell = cell_.lock()) {
      cell->cancel();
    }
  }

 private:
  std::weak_ptr<Cell> cell_;
};

// A one-shot run: cancel() before its cell exists is kept and handed to the cell when it is
// made, so a client that leaves while the kernel starts gets "aborted" without the cell running.
class OneShotRef : public CellHandle {
 public:
  void cancel() override {
    std::shared_ptr<Cell> cell;
    {
      MutexLock lock(mu_);
      cancelled_ = true;
      cell = cell_.lock();
    }
    if (cell) {
      cell->cancel();
    }
  }
  void attach(const std::shared_ptr<Cell>& cell) {
    bool cancelled = false;
    {
      MutexLock lock(mu_);
      cell_ = cell;
      cancelled = cancelled_;
    }
    if (cancelled && cell) {
      cell->cancel();
    }
  }

 private:
  Mutex mu_;
  bool cancelled_ CELLGATE_GUARDED_BY(mu_) = false;
  std::weak_ptr<Cell> cell_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace

struct Executor::Impl {
  std::shared_ptr<CellContext> context;
};

Executor::Executor(kernels::KernelRegistry& registry, store::ArtifactStore& artifacts,
                   store::AuditLog& audit, ExecuteLimits limits, util::Loop& loop,
                   util::Offload offload)
    : impl_(new Impl{std::make_shared<CellContext>(registry, artifacts, audit, limits, loop,
                                                   std::move(offload))}),
      artifacts_(artifacts),
      limits_(limits) {}

const CellStats& Executor::stats() const {
  return impl_->context->stats;
}

Executor::~Executor() {
  // Cells outlive the executor only as long as it takes them to answer "aborted" on their
  // strands; they hold the context, never the executor.
  std::map<const Cell*, std::shared_ptr<Cell>> live;
  {
    MutexLock lock(impl_->context->mu);
    impl_->context->closed = true;
    live.swap(impl_->context->live);
  }
  for (auto& [_, cell] : live) {
    cell->abandon();
  }
}

std::shared_ptr<CellHandle> Executor::run(const std::string& kernel_id, ExecuteRequest request,
                                          RunOptions options, Done done) {
  auto& context = impl_->context;
  auto cell = Cell::launch(
      context, context->loop.strand(),
      {.kernel_id = kernel_id, .request = std::move(request), .options = std::move(options)},
      std::move(done));
  return std::make_shared<CellRef>(cell);
}

std::shared_ptr<CellHandle> Executor::run_once(OneShotRequest request, RunOptions options,
                                               Done done) {
  auto handle = std::make_shared<OneShotRef>();
  auto context = impl_->context;
  auto strand = context->loop.strand();
  auto answer = [strand, done = std::make_shared<Done>(std::move(done))](Answer a) {
    strand->post([done, a = std::move(a)]() mutable { (*done)(std::move(a)); });
  };
  // Blocking: the start, the files, and after the cell the shutdown, on the offload pool; the
  // cell itself on `strand`, where `done` is called too.
  context->offload([context, strand, handle, answer, request = std::move(request),
                    options = std::move(options)]() mutable {
    auto& registry = context->registry;
    const std::string name =
        request.kernel_name.empty() ? registry.default_kernel_name() : request.kernel_name;
    auto model = registry.start(name, json::object());
    if (!model) {
      return answer(std::move(model).error());
    }
    const std::string id = model->id;
    auto shutdown = [context, id] {
      (void)context->registry.shutdown(id);
      context->artifacts.forget(id);  // its artifacts stay reachable by SHA-256
    };
    auto placed = [&]() -> Result<void> {
      if (request.files.empty()) {
        return ok_result();
      }
      CELLGATE_ASSIGN_OR_RETURN(auto kernel, registry.find(id));
      CELLGATE_ASSIGN_OR_RETURN(auto dir,
                                store::files::WorkDir::open(kernel->work_dir(), kernel->files_uid(),
                                                            kernel->files_uid()));
      for (const auto& [path, bytes] : request.files) {
        CELLGATE_TRY(dir.write(path, bytes, bytes.size(), /*make_parents=*/true));
      }
      return ok_result();
    }();
    if (!placed) {
      shutdown();
      return answer(std::move(placed).error());
    }
    // The kernel is shut down before the answer goes out: a client that reads it finds the
    // kernel gone.
    auto finished = [context, shutdown, answer, id](Answer a) {
      if (a) {
        a->kernel_id = id;
      }
      context->offload([shutdown, answer, a = std::move(a)]() mutable {
        shutdown();
        answer(std::move(a));
      });
    };
    auto cell = Cell::launch(
        context, strand,
        {.kernel_id = id, .request = std::move(request.cell), .options = std::move(options)},
        std::move(finished));
    if (!cell) {
      shutdown();
      return answer(
          make_error(ErrorCode::kUnavailable, "shutting_down", "the gateway is shutting down"));
    }
    handle->attach(cell);
  });
  return handle;
}

void Executor::run_silently(const std::string& kernel_id, std::string code,
                            std::chrono::milliseconds timeout,
                            std::function<void(Result<void>)> done) {
  ExecuteRequest request;
  request.code = std::move(code);
  request.timeout_seconds = std::chrono::duration<double>(timeout).count();
  request.store_history = false;
  auto& context = impl_->context;
  Cell::launch(
      context, context->loop.strand(),
      {.kernel_id = kernel_id, .request = std::move(request), .options = {}, .silent = true},
      // By reference: GCC 12 warns (maybe-uninitialized, a false positive) on the variant's
      // move into a by-value parameter here.
      [done = std::move(done)](const Answer& answer) {
        done(answer ? ok_result() : Result<void>(answer.error()));
      });
}

Answer Executor::run_and_wait(const std::string& kernel_id, ExecuteRequest request,
                              RunOptions options,
                              const std::shared_ptr<std::atomic<bool>>& cancelled) {
  auto promise = std::make_shared<std::promise<Answer>>();
  auto future = promise->get_future();
  auto handle = run(kernel_id, std::move(request), std::move(options),
                    [promise](Answer answer) { promise->set_value(std::move(answer)); });
  if (!cancelled) {
    return future.get();
  }
  bool sent = false;
  while (future.wait_for(kCancelPoll) != std::future_status::ready) {
    if (!sent && cancelled->load()) {
      handle->cancel();
      sent = true;
    }
  }
  return future.get();
}

Result<void> Executor::run_silently_and_wait(const std::string& kernel_id, std::string code,
                                             std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<Result<void>>>();
  auto future = promise->get_future();
  run_silently(kernel_id, std::move(code), timeout,
               [promise](Result<void> r) { promise->set_value(std::move(r)); });
  return future.get();
}

}  // namespace cellgate::execute
