// Hibernate and resume (registry.hpp): an idle kernel's jail checkpointed with CRIU into its
// home (<state_dir>/kernels/<id>/hibernated, 0700, removed with the home), and restored on the
// first touch. One kernel is hibernated or resumed by one caller at a time (its lifecycle lock).
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "records.hpp"
#include "registry_impl.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using Ms = std::chrono::milliseconds;

constexpr int kDumpAttempts = 3;

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

Result<KernelModel> KernelRegistry::Impl::hibernate(const std::string& id) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  if (!options_.checkpoints_unavailable.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "checkpoints_unavailable",
                      "kernels cannot hibernate here: " + options_.checkpoints_unavailable);
  }
  MutexLock life(k->lifecycle());
  // Refused before anything is closed: a zygote kernel, an adopted one.
  {
    auto running = k->begin_hibernate();
    if (!running) {
      return std::move(running).error();
    }
    auto& [process, connection] = *running;
    if (auto can = process->checkpointable(); !can) {
      (void)k->resumed(std::move(*running));
      return std::move(can).error();
    }
    // CRIU cannot dump a unix stream whose other end is outside the jail: our ZeroMQ sockets
    // close first (the connection's destructor joins its I/O thread).
    connection.reset();
    const auto start = std::chrono::steady_clock::now();
    auto dumped = process->checkpoint(image_dir(*k));
    // zmq_close() returns before libzmq's I/O thread has closed the descriptors: a dump that
    // started first finds a unix stream still connected to us ("External socket"), and CRIU
    // resumed the jail. Those close within milliseconds; the next attempt finds them closed.
    for (int attempt = 1; !dumped && attempt < kDumpAttempts &&
                          dumped.error().message.find("socket") != std::string::npos;
         ++attempt) {
      std::error_code ec;
      fs::remove_all(image_dir(*k), ec);
      dumped = process->checkpoint(image_dir(*k));
    }
    if (!dumped) {
      // CRIU resumed the jail: connect again and carry on as before.
      spdlog::warn("kernel {}: {}", id, dumped.error().message);
      std::error_code ec;
      fs::remove_all(image_dir(*k), ec);
      auto again = connect(k, std::move(process));
      if (!again) {
        k->resume_failed("a failed checkpoint left it unreachable: " + again.error().message);
        return std::move(again).error();
      }
      (void)k->resumed(std::move(again).value());
      return std::move(dumped).error();
    }
    spdlog::info("kernel {} hibernated in {:.0f} ms", id, ms_since(start));
    k->hibernated(std::move(process));
  }
  return k->model();
}

Result<void> KernelRegistry::Impl::resume(const std::string& id) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  return resume(k);
}

Result<void> KernelRegistry::Impl::resume(const std::shared_ptr<ManagedKernel>& k) {
  if (k->state() != KernelState::kHibernated) {
    return {};  // the common case: no lock taken
  }
  MutexLock life(k->lifecycle());
  auto process = k->take_hibernated();
  if (!process) {
    return {};  // resumed (or ended) by whoever held the lock before us
  }
  const auto start = std::chrono::steady_clock::now();
  const Ms timeout(static_cast<long long>(options_.kernel_start_timeout * 1000));
  auto restored = [&]() -> Result<ManagedKernel::Running> {
    CELLGATE_TRY(process->restore(image_dir(*k), timeout));
    return connect(k, std::move(process));
  }();
  if (!restored) {
    const std::string why = "the kernel could not be resumed: " + restored.error().message;
    spdlog::error("kernel {}: {}", k->id(), why);
    k->resume_failed(why);
    k->publish_status("dead", why);
    return make_error(ErrorCode::kInternal, "resume_failed", why);
  }
  (void)write_record(options_.state_dir, *k, ProcessFacts::of(*restored->process), options_.jail);
  CELLGATE_TRY(k->resumed(std::move(restored).value()));
  std::error_code ec;
  fs::remove_all(image_dir(*k), ec);
  spdlog::info("kernel {} resumed in {:.0f} ms", k->id(), ms_since(start));
  return {};
}

}  // namespace cellgate::kernels
