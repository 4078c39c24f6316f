// After a gateway crash or an upgrade: kernels outlive the gateway (their launchers are not tied
// to it), and their state records say how to find them. A new gateway on the same state dir
// adopts every client kernel whose launcher still runs — same id, same uid, same client env,
// connected again over its connection file — and ends and cleans up everything else a previous
// gateway left: pooled kernels (a pool is refilled fresh), kernels whose launcher is gone,
// records that cannot be read, and runtime dirs no record names (a start cut short).
#include "adoption.hpp"

#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/userns.hpp"
#include "cellgate/kernel/spool.hpp"
#include "cellgate/kernels/registry.hpp"
#include "cellgate/launcher/status.hpp"
#include "cleanup.hpp"
#include "kernelspecs.hpp"
#include "records.hpp"
#include "registry_impl.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using kernel::Channel;

constexpr std::chrono::milliseconds kSpoolTimeout{10000};

// Ends what a record names (through its launcher, its cgroup) and removes its files.
void clean_up(const std::string& state_dir, kernel::KernelBackend& backend, const Record& record) {
  if (record.process) {
    if (auto process = backend.adopt(*record.process); process) {
      // Still running (a pooled kernel): ended as the handle goes, through its launcher.
      process.value().reset();
    }
    // A launcher that ended normally removed its cgroup; one that was killed left it, and its
    // jail may still run there.
    end_cgroup(record.process->cgroup_version, record.process->cgroup_paths);
    end_cgroup_from_status(record.process->status_file);
    remove_runtime_dir(record.process->runtime_dir);
  }
  if (record.id.empty() || record.id.find('/') != std::string::npos || record.id[0] == '.') {
    ::unlink(record.path.c_str());
    return;
  }
  const std::string home = state_dir + "/kernels/" + record.id;
  ::umount2((home + "/work").c_str(), MNT_DETACH);
  std::error_code ec;
  fs::remove_all(home, ec);
  ::unlink(record.path.c_str());
}

// What each absent session missed while no gateway ran: the launcher's spool after the session's
// last delivered msg_id, checked as live iopub is (signature, JSON, limits).
void replay_spool(ManagedKernel& k, const std::string& socket,
                  const kernel::ConnectionInfo& connection, const protocol::Limits& limits,
                  const std::map<std::string, std::string>& absent) {
  if (absent.empty() || socket.empty()) {
    return;
  }
  auto spooled = kernel::fetch_spool(socket, "", kSpoolTimeout);
  if (!spooled) {
    spdlog::warn("kernel {}: {}; what its clients missed while no gateway ran is not replayed",
                 k.id(), spooled.error().message);
    return;
  }
  auto signer = protocol::Signer::create(connection.signature_scheme, connection.key);
  if (!signer) {
    return;
  }
  std::vector<protocol::EnvelopePtr> all;
  all.reserve(spooled->messages.size());
  for (const auto& frames : spooled->messages) {
    std::vector<std::string_view> views(frames.begin(), frames.end());
    if (auto env = protocol::Envelope::from_wire(Channel::kIopub, views, *signer, limits)) {
      all.push_back(std::move(env).value());
    }
  }
  for (const auto& [session, last] : absent) {
    auto at = std::find_if(all.begin(), all.end(),
                           [&, &last = last](const auto& m) { return m->header().msg_id == last; });
    if (at != all.end()) {
      k.add_spooled(session, std::vector<protocol::EnvelopePtr>(at + 1, all.end()), nullptr);
      continue;
    }
    // Gone from the spool (or never in it): how many went, asked without the messages.
    auto head = kernel::fetch_spool(socket, last, kSpoolTimeout, /*head_only=*/true);
    spdlog::info("kernel {}: session {} last had {}, gone from the spool: {}", k.id(), session,
                 last.empty() ? "nothing" : last,
                 head ? std::to_string(head->dropped) + (head->dropped_exact ? "" : " or fewer") +
                            " message(s) lost"
                      : head.error().message);
    protocol::EnvelopePtr notice;
    if (head && head->dropped > 0) {
      notice = lost_notice(head->dropped, head->dropped_exact, all.empty() ? nullptr : all[0]);
    }
    k.add_spooled(session, all, notice);
  }
  spdlog::info("kernel {}: {} iopub message(s) from its launcher's spool for {} absent session(s)",
               k.id(), all.size(), absent.size());
}

}  // namespace

AdoptionCounts adopt_or_clean_up(const std::string& state_dir, kernel::KernelBackend& backend,
                                 const std::function<Result<void>(const Record&)>& adopt) {
  AdoptionCounts counts;
  if (state_dir.empty()) {
    return counts;
  }
  std::set<std::string> kept_runtime_dirs;
  std::size_t& adopted = counts.adopted;
  std::size_t& cleaned = counts.cleaned_up;
  for (auto& record : read_records(state_dir)) {
    if (!record.pooled && record.process) {
      auto kept = adopt(record);
      if (kept) {
        kept_runtime_dirs.insert(record.process->runtime_dir);
        ++adopted;
        continue;
      }
      if (kept.error().reason == kLeftOnDisk) {
        // A hibernated kernel this gateway cannot take (its uid is another range's): its image
        // and record stay for a gateway that can; nothing of it runs.
        spdlog::error("kernel {}: hibernated, not adopted: {}; its image stays in {}", record.id,
                      kept.error().message, state_dir);
        kept_runtime_dirs.insert(record.process->runtime_dir);
        continue;
      }
      spdlog::warn("kernel {}: not adopted: {}; cleaning up after it", record.id,
                   kept.error().message);
    }
    clean_up(state_dir, backend, record);
    ++cleaned;
  }
  // Runtime dirs no adopted kernel uses: a start the previous gateway did not finish, or a
  // kernel whose record is gone. What ran there is ended through the cgroup its launcher
  // reported.
  cleaned += end_runtime_dirs(state_dir + "/run", kept_runtime_dirs);
  if (adopted + cleaned > 0) {
    spdlog::info("state dir {}: adopted {} running kernel(s), cleaned up after {} left behind",
                 state_dir, adopted, cleaned);
  }
  return counts;
}

void KernelRegistry::Impl::adopt_kernels() {
  const AdoptionCounts counts = adopt_or_clean_up(
      options_.state_dir, backend_, [this](const Record& record) { return adopt(record); });
  stats_.adopted.add(counts.adopted);
  stats_.cleaned_up.add(counts.cleaned_up);
}

Result<void> KernelRegistry::Impl::adopt(const Record& record) {
  auto spec = kernelspec(record.kernelspec);
  if (!spec) {
    // The kernelspec was removed meanwhile: the kernel runs all the same; keep its name.
    kernel::KernelSpec named;
    named.name = record.kernelspec;
    named.display_name = record.kernelspec;
    spec = named;
  }
  if (record.hibernated) {
    return adopt_hibernated(record, *spec);
  }
  CELLGATE_ASSIGN_OR_RETURN(std::unique_ptr<kernel::KernelProcessHandle> process,
                            backend_.adopt(*record.process));
  if (auto ended = process->poll_exit()) {
    return make_error(ErrorCode::kNotFound, "kernel_ended",
                      std::string("the kernel ended while no gateway ran (") +
                          launcher::to_string(ended->reason) + ")");
  }
  auto k = make_kernel(record.id, *spec, record.uid, record.env);
  // Every session the last gateway was sending to is absent now: what comes live is kept for it,
  // and what it missed meanwhile is added from the launcher's spool below.
  const std::map<std::string, std::string> absent = k->expect_absent_sessions();
  kernel::ClientOptions co = client_options(k, *process);
  const protocol::Limits limits = co.limits;
  // kernel_info is not asked on shell: the kernel may be in the middle of a cell, and answers
  // shell requests only after it. Whether it answers heartbeats while busy follows its kind.
  co.heartbeat_while_busy = is_ipykernel(*spec);
  CELLGATE_ASSIGN_OR_RETURN(std::unique_ptr<kernel::KernelConnection> connected,
                            backend_.connect(*process, std::move(co)));
  std::shared_ptr<kernel::KernelConnection> connection = std::move(connected);
  // ipykernel answers kernel_info on control at any time; a kernel that does not is adopted on
  // its process alone (its heartbeats decide from here on, as for any kernel).
  auto info = connection->request(Channel::kControl, "kernel_info_request",
                                  nlohmann::json::object(), std::chrono::seconds(5),
                                  /*wait_for_idle=*/false);
  if (!info && process->poll_exit()) {
    return make_error(ErrorCode::kUnavailable, "kernel_ended", "the kernel ended while adopted");
  }
  if (!options_.no_jail && !jail::in_single_uid_user_namespace()) {
    // Its live processes keep allocate() off the uid; reserved too, for when they are gone.
    if (auto reserved = uids_.reserve(record.uid); !reserved) {
      spdlog::warn("kernel {}: {}", record.id, reserved.error().message);
    }
  }
  const std::string spool_socket = process->spool_socket();
  CELLGATE_TRY(k->started(ManagedKernel::Running{std::move(process), std::move(connection)}));
  replay_spool(*k, spool_socket, record.process->connection, limits, absent);
  {
    MutexLock lock(mu_);
    kernels_[k->id()] = Live{k, admission_.admit_adopted()};
  }
  spdlog::info("kernel {} adopted ({}), uid {}, pid {}{}", k->id(), k->spec().name, k->uid(),
               record.process->kernel_pid,
               info ? "" : " (it did not answer kernel_info on control within 5 s)");
  return {};
}

}  // namespace cellgate::kernels
