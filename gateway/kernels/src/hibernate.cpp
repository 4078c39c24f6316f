// Hibernate and resume (registry.hpp): an idle kernel's jail checkpointed with CRIU into its
// home (<state_dir>/kernels/<id>/hibernated, 0700, removed with the home), and restored on the
// first touch. One kernel is hibernated or resumed by one caller at a time (its lifecycle lock).
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <filesystem>

#include "adoption.hpp"
#include "cellgate/jail/userns.hpp"
#include "records.hpp"
#include "registry_impl.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using Ms = std::chrono::milliseconds;

constexpr int kDumpAttempts = 3;

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<long long>(s * 1000));
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Bytes of the regular files below `dir` (an image: a few dozen files).
std::uint64_t dir_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return 0;
  }
  for (const auto& f : fs::recursive_directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (f.is_regular_file(ec2)) {
      total += f.file_size(ec2);
    }
  }
  return total;
}

// Bytes of every image under <state_dir>/kernels/*/hibernated (a walk over at most the kernels'
// homes and their images' few dozen files).
std::uint64_t images_bytes(const std::string& state_dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (const auto& home : fs::directory_iterator(state_dir + "/kernels", ec)) {
    std::error_code ec2;
    if (home.is_directory(ec2)) {
      total += dir_bytes(home.path() / "hibernated");
    }
  }
  return total;
}

}  // namespace

std::uint64_t KernelRegistry::Impl::image_bytes(const std::string& id) const {
  auto k = find(id);
  return k ? dir_bytes(image_dir(**k)) : 0;
}

Result<void> KernelRegistry::Impl::disk_room_for(const kernel::KernelProcessHandle& process) const {
  const std::uint64_t budget = options_.hibernate_disk_max;
  if (budget == 0) {
    return {};
  }
  // The kernel's cgroup memory is an upper bound of its image: CRIU writes its anonymous and
  // shared memory (compressed), not the files it maps, and the work dir stays outside.
  auto stats = process.cgroup_stats();
  const std::uint64_t estimate = stats ? stats->memory_current_bytes : 0;
  const std::uint64_t used = images_bytes(options_.state_dir);
  if (used + estimate <= budget) {
    return {};
  }
  auto mib = [](std::uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; };
  return make_error(ErrorCode::kResourceExhausted, "no_space",
                    "no room to hibernate the kernel: its image may take up to " + mib(estimate) +
                        " and hibernated kernels hold " + mib(used) + " of the " + mib(budget) +
                        " --hibernate-disk-max; the kernel runs on");
}

Result<ManagedKernel::Running> KernelRegistry::Impl::begin_checkpoint(ManagedKernel& k) {
  auto running = k.begin_hibernate();
  if (!running) {
    return running;
  }
  if (auto can = running->process->checkpointable(); !can) {
    (void)k.resumed(std::move(*running));
    return std::move(can).error();
  }
  return running;
}

Result<void> KernelRegistry::Impl::dump_retrying(const std::string& dir,
                                                 const std::function<Result<void>()>& dump) {
  auto dumped = dump();
  // zmq_close() returns before libzmq's I/O thread has closed the descriptors: a dump that
  // started first finds a unix stream still connected to us ("External socket"), and CRIU
  // resumed the jail. Those close within milliseconds; the next attempt finds them closed.
  for (int attempt = 1; !dumped && attempt < kDumpAttempts &&
                        dumped.error().message.find("socket") != std::string::npos;
       ++attempt) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    dumped = dump();
  }
  return dumped;
}

Result<KernelModel> KernelRegistry::Impl::hibernate(const std::string& id) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  if (!options_.checkpoints_unavailable.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "checkpoints_unavailable",
                      "kernels cannot hibernate here: " + options_.checkpoints_unavailable);
  }
  MutexLock life(k->lifecycle());
  // Refused before anything is closed: a zygote kernel, an adopted one.
  {
    auto running = begin_checkpoint(*k);
    if (!running) {
      return std::move(running).error();
    }
    auto& [process, connection] = *running;
    if (auto room = disk_room_for(*process); !room) {
      (void)k->resumed(std::move(*running));
      return std::move(room).error();
    }
    // CRIU cannot dump a unix stream whose other end is outside the jail: our ZeroMQ sockets
    // close first (the connection's destructor joins its I/O thread).
    connection.reset();
    const auto start = std::chrono::steady_clock::now();
    // A pointer, not the structured binding: clang 14 cannot capture one in a lambda.
    kernel::KernelProcessHandle* dumping = process.get();
    auto dumped = dump_retrying(image_dir(*k), [&] { return dumping->checkpoint(image_dir(*k)); });
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
    // The record says so: a gateway started after this one ends (kill -9, an upgrade) lists it
    // hibernated again instead of cleaning up after a kernel whose launcher is gone.
    const ProcessFacts facts = ProcessFacts::of(*process);
    k->hibernated(std::move(process));
    if (auto recorded = write_record(options_.state_dir, *k, facts, options_.jail,
                                     /*pooled=*/false, /*hibernated=*/true);
        !recorded) {
      spdlog::warn(
          "kernel {}: its record could not say it is hibernated ({}): a gateway "
          "restarted before it resumes will not find it",
          id, recorded.error().message);
    }
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
  // Said each time: the operator accepted it once, at the gateway's start.
  spdlog::warn(
      "kernel {} resumed in {:.0f} ms, without its Landlock layer (CRIU cannot save it; "
      "--checkpoint-without-landlock)",
      k->id(), ms_since(start));
  return {};
}

void KernelRegistry::Impl::hibernate_idle() {
  const auto now = now_();
  const auto after = seconds_to_ms(options_.hibernate_after);
  for (const auto& k : snapshot()) {
    if (k->state() != KernelState::kIdle || now - k->last_activity() < after) {
      continue;
    }
    if (auto it = not_hibernated_.find(k->id()); it != not_hibernated_.end()) {
      if (!it->second || *it->second == k->last_activity()) {
        continue;  // said already; tried again once the kernel has been used
      }
    }
    auto slept = hibernate(k->id());
    if (slept || slept.error().reason == "kernel_busy") {
      continue;  // busy: a cell came in meanwhile
    }
    const bool for_good = slept.error().reason == "not_hibernatable";
    not_hibernated_[k->id()] =
        for_good ? std::nullopt : std::optional<util::Clock::time_point>(k->last_activity());
    spdlog::warn("kernel {} stays up after {} s idle ({}): {}", k->id(), options_.hibernate_after,
                 for_good ? "for good" : "until it is used again", slept.error().message);
  }
  // Ids of kernels gone since: the map stays as small as the kernels that are.
  std::erase_if(not_hibernated_, [this](const auto& entry) { return !find(entry.first); });
}

void KernelRegistry::Impl::hibernate_and_stop() {
  pool_.stop();
  std::size_t slept = 0;
  for (const auto& id : kernel_ids()) {
    auto k = find(id);
    if (!k) {
      continue;
    }
    if (k.value()->state() != KernelState::kHibernated) {
      if (auto done = hibernate(id); !done) {
        spdlog::warn("kernel {} did not hibernate at stop: {}; it ends", id, done.error().message);
        (void)shutdown(id);
        continue;
      }
    }
    // Left as hand_over() leaves a kernel: the process handle detached (its runtime dir, with
    // the jail spec and connection file the restore needs, stays), the record and image kept.
    std::shared_ptr<ManagedKernel> kernel;
    {
      MutexLock lock(mu_);
      auto it = kernels_.find(id);
      if (it == kernels_.end()) {
        continue;
      }
      kernel = it->second.kernel;
      kernels_.erase(it);
    }
    ManagedKernel::Ended ended = kernel->end();
    if (ended.running.process) {
      ended.running.process->detach();
    }
    for (auto& l : ended.listeners) {
      l->kernel_gone("the gateway is stopping; the kernel is hibernated and resumes on first use");
    }
    ++slept;
  }
  spdlog::info("stopping: {} kernel(s) hibernated in {} for the next gateway", slept,
               options_.state_dir);
}

Result<void> KernelRegistry::Impl::adopt_hibernated(const Record& record,
                                                    const kernel::KernelSpec& spec) {
  auto k = make_kernel(record.id, spec, record.uid, record.env);
  std::error_code ec;
  if (!fs::is_directory(image_dir(*k), ec)) {
    return make_error(ErrorCode::kNotFound, "image_gone",
                      "its record says hibernated but its image " + image_dir(*k) + " is gone");
  }
  if (!options_.no_jail && !jail::in_single_uid_user_namespace()) {
    // CRIU restores the uid it dumped: the kernel can only come back as that uid, which must be
    // ours and no other kernel's.
    if (auto reserved = uids_.reserve(record.uid); !reserved) {
      return make_error(ErrorCode::kFailedPrecondition, kLeftOnDisk, reserved.error().message);
    }
  }
  auto process = backend_.adopt_hibernated(*record.process);
  if (!process) {
    uids_.release(record.uid);
    return std::move(process).error();
  }
  if (auto adopted = k->adopted_hibernated(std::move(process).value()); !adopted) {
    uids_.release(record.uid);
    return adopted;
  }
  {
    MutexLock lock(mu_);
    kernels_[k->id()] = Live{k, admission_.admit_adopted()};
  }
  spdlog::info("kernel {} adopted hibernated ({}), uid {}: it resumes on first use", k->id(),
               k->spec().name, k->uid());
  return {};
}

}  // namespace cellgate::kernels
