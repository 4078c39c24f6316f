// Moving a kernel to another node (registry.hpp, "moving a kernel"; docs/scale-out.md): the
// sending node checkpoints the kernel as a snapshot would (its work files in the image), packs
// the image into one tar archive and hands it to a courier (the API's, which signs it and
// uploads it to a peer); the receiving node unpacks it into its own snapshot store and restores
// it as a snapshot's copy (rebased onto its own uid and cgroup, rekeyed), under the kernel's own
// id. The kernel ends on the sending node only once the receiving one answers it runs there; until
// then its clients' messages wait, and a failed move leaves it running where it was.
//
// Archives are made and read with GNU tar (--numeric-owner: uids are the same numbers on every
// node, names may not be). The archive and the unpacked image are root's, 0600 and 0700, as a
// snapshot's image is: they hold the kernel's whole memory.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <filesystem>

#include "cellgate/checkpoint/criu.hpp"
#include "cellgate/checkpoint/images.hpp"
#include "cellgate/protocol/node_ids.hpp"
#include "cellgate/sys/text.hpp"
#include "cellgate/util/log_fields.hpp"
#include "records.hpp"
#include "registry_impl.hpp"
#include "spdlog/spdlog.h"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTar = "/bin/tar";

Error moves_unavailable(const std::string& why) {
  return make_error(ErrorCode::kFailedPrecondition, "checkpoints_unavailable",
                    "kernels cannot move from or to this node: " + why);
}

Result<void> run_tar(const std::vector<std::string>& args, const std::string& what) {
  std::string out;
  CELLGATE_ASSIGN_OR_RETURN(int status, checkpoint::run_program(kTar, args, {}, &out));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return make_error(ErrorCode::kInternal, "move_archive",
                      what + ": tar failed: " + std::string(sys::trim(out)));
  }
  return {};
}

// A kernel id as this gateway mints them (protocol/node_ids.hpp): 36 characters, lowercase hex
// and dashes at 8, 13, 18 and 23. Nothing else names a kernel's home dir.
bool kernel_id_shaped(const std::string& id) {
  if (id.size() != 36) {
    return false;
  }
  for (std::size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<void> KernelRegistry::Impl::move_out(const std::string& id, const MoveSender& send) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  if (!options_.checkpoints_unavailable.empty()) {
    return moves_unavailable(options_.checkpoints_unavailable);
  }
  CELLGATE_ASSIGN_OR_RETURN(checkpoint::ImageStore store, snapshot_store());
  CELLGATE_TRY(resume(k));  // a hibernated kernel comes back first, as for a snapshot
  MutexLock life(k->lifecycle());
  auto running = begin_checkpoint(*k);
  if (!running) {
    return std::move(running).error();
  }
  auto& [process, connection] = *running;
  auto sid = reserve_stamped(store);
  if (!sid) {
    (void)k->resumed(std::move(*running));
    return std::move(sid).error();
  }
  const std::string dir = store.dir_of(*sid);
  const std::string archive = dir + ".tar";
  MovedKernel moved{id, k->spec().name, process->connection().key, k->env(), archive};
  connection.reset();  // CRIU cannot dump a unix stream whose other end is ours
  const auto start = std::chrono::steady_clock::now();
  kernel::KernelProcessHandle* dumping = process.get();  // clang 14 captures no binding
  Result<std::string> sent = [&]() -> Result<std::string> {
    CELLGATE_TRY(dump_retrying(dir, [&] { return dumping->snapshot(dir, /*compress=*/true); }));
    CELLGATE_TRY(
        run_tar({"--create", "--file", archive, "--numeric-owner", "--directory", dir, "."},
                "packing the kernel's image"));
    ::chmod(archive.c_str(), 0600);
    return send(moved);
  }();
  std::error_code ec;
  fs::remove(archive, ec);
  (void)store.remove(*sid);
  if (!sent) {
    // The jail ran on through the dump: connect again and carry on as before.
    spdlog::warn("kernel {} did not move: {}", id, sent.error().message);
    auto again = connect(k, std::move(process));
    if (!again) {
      k->resume_failed("a failed move left it unreachable: " + again.error().message);
      return std::move(again).error();
    }
    (void)k->resumed(std::move(again).value());
    return std::move(sent).error();
  }
  // It runs on the other node now: this copy ends, as a shutdown ends a kernel (the lifecycle
  // lock is ours already).
  Admission::Ticket place;
  {
    MutexLock lock(mu_);
    if (auto it = kernels_.find(id); it != kernels_.end()) {
      place = std::move(it->second.place);
      kernels_.erase(it);
    }
  }
  protocol::note_moved(id, *sent);
  ManagedKernel::Ended ended = k->end();
  process.reset();  // ends the jail and its cgroup
  for (auto& l : ended.listeners) {
    l->kernel_gone("the kernel moved to " + *sent + "; connect again (through the router)");
  }
  release(*k);
  remove_record(options_.state_dir, id);
  util::log_kernel_action("move", id, k->spec().name, true,
                          fmt::format("kernel {} moved to {} in {:.0f} ms", id, *sent,
                                      std::chrono::duration<double, std::milli>(
                                          std::chrono::steady_clock::now() - start)
                                          .count()));
  return {};
}

Result<KernelModel> KernelRegistry::Impl::move_in(const MovedKernel& moved) {
  const auto began = std::chrono::steady_clock::now();
  struct RemoveArchive {
    const std::string& path;
    ~RemoveArchive() {
      std::error_code ec;
      fs::remove(path, ec);
    }
  } remove_archive{moved.archive};
  if (!options_.checkpoints_unavailable.empty()) {
    return moves_unavailable(options_.checkpoints_unavailable);
  }
  if (!kernel_id_shaped(moved.id)) {
    return make_error(ErrorCode::kInvalidArgument, "bad_kernel_id",
                      "a moved kernel's id must be a kernel id (36 characters of lowercase hex "
                      "and dashes)");
  }
  CELLGATE_TRY(refuse_if_draining());
  CELLGATE_ASSIGN_OR_RETURN(kernel::KernelSpec spec, kernelspec(moved.kernel_name));
  {
    MutexLock lock(mu_);
    if (kernels_.count(moved.id) != 0 || !arriving_.insert(moved.id).second) {
      return make_error(ErrorCode::kFailedPrecondition, "kernel_exists",
                        "a kernel " + moved.id + " runs (or is arriving) here already");
    }
  }
  struct Arrived {
    Impl& impl;
    const std::string& id;
    ~Arrived() {
      MutexLock lock(impl.mu_);
      impl.arriving_.erase(id);
    }
  } arrived{*this, moved.id};
  CELLGATE_ASSIGN_OR_RETURN(checkpoint::ImageStore store, snapshot_store());
  CELLGATE_ASSIGN_OR_RETURN(std::string sid, reserve_stamped(store));
  const auto stamp = protocol::node();
  const std::string dir = store.dir_of(sid);
  auto model = [&]() -> Result<KernelModel> {
    if (::mkdir(dir.c_str(), 0700) != 0) {
      return errno_error(ErrorCode::kInternal, "move_archive", "mkdir('" + dir + "')", errno);
    }
    // As root, tar keeps the owners and modes it packed (the work files are the kernel's uid
    // there, rebased to this node's at restore); members named with ".." or a leading "/" are
    // refused or made relative by GNU tar itself.
    CELLGATE_TRY(run_tar({"--extract", "--file", moved.archive, "--numeric-owner", "--same-owner",
                          "--same-permissions", "--directory", dir},
                         "unpacking a moved kernel's image"));
    std::error_code ec;
    if (!fs::is_regular_file(dir + "/cellgate.json", ec) || !fs::is_directory(dir + "/criu", ec)) {
      return make_error(ErrorCode::kInvalidArgument, "move_archive",
                        "the archive is not a kernel's image (no cellgate.json and criu/)");
    }
    // A cgroup name of this node's: the first node's "k-<id>" may be on this same host and
    // runs until the kernel is up here.
    const Copy copy{dir, moved.key,
                    "k-" + moved.id + "-" + (stamp ? stamp->prefix().substr(0, 4) : "moved")};
    return start_new(std::move(spec), moved.env, &copy, began, moved.id);
  }();
  (void)store.remove(sid);
  if (model) {
    spdlog::info("kernel {} ({}) moved here", moved.id, moved.kernel_name);
  }
  return model;
}

// ---- KernelRegistry's forwarders ----

Result<void> KernelRegistry::move_out(const std::string& id, const MoveSender& send) {
  return impl_->move_out(id, send);
}
Result<KernelModel> KernelRegistry::move_in(const MovedKernel& moved) {
  return impl_->move_in(moved);
}

}  // namespace cellgate::kernels
