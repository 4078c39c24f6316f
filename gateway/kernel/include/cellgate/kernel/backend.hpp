// ProcessBackend: the real KernelBackend. Kernels are started through the cellgate-kernel
// launcher (KernelProcess) — python3 ipykernels forked from the zygote when one is configured
// and ready, everything else cold — and connected to over ZeroMQ (KernelClient).
//
//   kernel::ProcessBackend backend({.zygote = kernel::ZygoteOptions{…}});
//   backend.start();                        // spawns the zygote
//   auto process = backend.launch(request);
//   auto conn = backend.connect(*process.value(), options);
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "cellgate/kernel/kernel.hpp"
#include "cellgate/kernel/zygote.hpp"

namespace cellgate::kernel {

struct ProcessBackendOptions {
  std::string launcher_path;            // "": cellgate-kernel beside the running binary
  std::optional<ZygoteOptions> zygote;  // jailed python3 kernels fork from it
};

class ProcessBackend : public KernelBackend {
 public:
  explicit ProcessBackend(ProcessBackendOptions options);
  ~ProcessBackend() override;

  void start() override;
  void tick() override;
  // True once the zygote is ready; false at once without one (or once it failed for good).
  bool wait_fast(std::chrono::milliseconds timeout) override;
  Result<std::unique_ptr<KernelProcessHandle>> launch(LaunchRequest request) override;
  Result<std::unique_ptr<KernelProcessHandle>> adopt(const AdoptionFacts& facts) override;
  Result<std::unique_ptr<KernelProcessHandle>> adopt_hibernated(
      const AdoptionFacts& facts) override;

  // The zygote's handle (null without one, or before start()), for tests.
  Zygote* zygote() { return zygote_.get(); }

 private:
  ProcessBackendOptions options_;
  std::unique_ptr<Zygote> zygote_;
};

}  // namespace cellgate::kernel
