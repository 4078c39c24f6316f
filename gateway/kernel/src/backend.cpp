#include "cellgate/kernel/backend.hpp"

#include "cellgate/kernel/process.hpp"

namespace cellgate::kernel {

ProcessBackend::ProcessBackend(ProcessBackendOptions options) : options_(std::move(options)) {}

ProcessBackend::~ProcessBackend() = default;

void ProcessBackend::start() {
  if (options_.zygote && !zygote_) {
    ZygoteOptions zo = *options_.zygote;
    if (zo.launcher_path.empty()) {
      zo.launcher_path = options_.launcher_path;
    }
    zygote_ = std::make_unique<Zygote>(std::move(zo));
  }
}

void ProcessBackend::tick() {
  if (zygote_) {
    zygote_->tick();
  }
}

bool ProcessBackend::wait_fast(std::chrono::milliseconds timeout) {
  if (!zygote_ || zygote_->failed()) {
    return false;
  }
  return zygote_->wait_ready(timeout);
}

Result<std::unique_ptr<KernelProcessHandle>> ProcessBackend::launch(LaunchRequest request) {
  if (request.launcher_path.empty()) {
    request.launcher_path = options_.launcher_path;
  }
  if (zygote_ && request.jail && request.zygote_socket.empty()) {
    request.zygote_socket = zygote_->ready_socket();
  }
  CELLGATE_ASSIGN_OR_RETURN(auto process, KernelProcess::start(std::move(request)));
  return std::unique_ptr<KernelProcessHandle>(std::move(process));
}

Result<std::unique_ptr<KernelProcessHandle>> ProcessBackend::adopt(const AdoptionFacts& facts) {
  CELLGATE_ASSIGN_OR_RETURN(auto process, KernelProcess::adopt(facts));
  return std::unique_ptr<KernelProcessHandle>(std::move(process));
}

Result<std::unique_ptr<KernelProcessHandle>> ProcessBackend::adopt_hibernated(
    const AdoptionFacts& facts) {
  CELLGATE_ASSIGN_OR_RETURN(auto process,
                            KernelProcess::hibernated_from(facts, options_.launcher_path));
  return std::unique_ptr<KernelProcessHandle>(std::move(process));
}

}  // namespace cellgate::kernel
