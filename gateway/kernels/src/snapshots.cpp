// Snapshots and fork (registry.hpp; README, "Snapshots and fork"): a running kernel's jail
// checkpointed with its work files while it runs on (KernelProcess::snapshot), kept in an
// ImageStore under <state_dir>/snapshots, and restored as new kernels, each under its own uid,
// cgroup, dirs and namespaces (the launcher rebases the image: checkpoint/rebase.hpp).
//
// A snapshot dir: CRIU's image (criu/, root/, work/, cellgate.json, made by the launcher) and
// snapshot.json, ours: {id, kernel_id, kernel_name, created, key}. `key` is the connection key
// the image's kernel holds in memory; a copy's connection file must carry it until the copy is
// rekeyed (rekey() below: an ipykernel copy takes a key of its own before anyone else talks to
// it). The dir is 0700 and root's, as the image holds the kernel's whole memory.
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cellgate/checkpoint/images.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/protocol/node_ids.hpp"
#include "cellgate/sys/file.hpp"
#include "registry_impl.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kRecord = "snapshot.json";
constexpr int kMaxForks = 16;

Error snapshots_unavailable(const std::string& why) {
  return make_error(ErrorCode::kFailedPrecondition, "checkpoints_unavailable",
                    "kernels cannot be snapshotted or forked here: " + why);
}

double pause_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

struct Stored {
  SnapshotModel model;
  std::string key;
  std::string dir;
};

Result<Stored> read_snapshot(const checkpoint::ImageStore& store, const std::string& id) {
  auto dir = store.find(id);
  if (!dir) {
    return make_error(ErrorCode::kNotFound, "no_snapshot", "no snapshot " + id);
  }
  auto text = sys::read_file(*dir + "/" + kRecord, 64 << 10, "snapshot");
  const json j = text ? json::parse(*text, nullptr, false) : json();
  // A dump that never finished, or a record made unreadable: not a snapshot to start from.
  auto incomplete = [&] {
    return make_error(ErrorCode::kNotFound, "no_snapshot", "snapshot " + id + " is incomplete");
  };
  if (!j.is_object() || !j.contains("kernel_name") || !j.contains("key")) {
    return incomplete();
  }
  Stored s;
  s.dir = *dir;
  s.model.id = id;
  try {  // json::exception on a field of the wrong type, as records.cpp's reader
    s.key = j.at("key").get<std::string>();
    s.model.kernel_name = j.at("kernel_name").get<std::string>();
    s.model.kernel_id = j.value("kernel_id", "");
    s.model.created = j.value("created", "");
    s.model.bytes = j.value("bytes", std::uint64_t{0});
  } catch (const json::exception&) {
    return incomplete();
  }
  return s;
}

}  // namespace

json SnapshotModel::to_json() const {
  return {{"id", id},
          {"kernel_id", kernel_id},
          {"kernel_name", kernel_name},
          {"created", created},
          {"bytes", bytes}};
}

Result<checkpoint::ImageStore> KernelRegistry::Impl::snapshot_store() const {
  return checkpoint::ImageStore::open(options_.state_dir + "/snapshots",
                                      options_.hibernate_disk_max);
}

Result<std::string> KernelRegistry::Impl::reserve_stamped(const checkpoint::ImageStore& store) {
  const auto stamp = protocol::node();
  return store.reserve(stamp ? stamp->prefix() : std::string());
}

Result<SnapshotModel> KernelRegistry::Impl::snapshot(const std::string& kernel_id, bool compress) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(kernel_id));
  if (!options_.checkpoints_unavailable.empty()) {
    return snapshots_unavailable(options_.checkpoints_unavailable);
  }
  CELLGATE_ASSIGN_OR_RETURN(checkpoint::ImageStore store, snapshot_store());
  CELLGATE_TRY(resume(k));  // a hibernated kernel comes back first: its image is not a snapshot's
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
  const std::string key = process->connection().key;
  // As for hibernate: CRIU cannot dump a unix stream whose other end is ours.
  connection.reset();
  const auto start = std::chrono::steady_clock::now();
  kernel::KernelProcessHandle* dumping = process.get();  // clang 14 captures no binding
  auto dumped = dump_retrying(dir, [&] { return dumping->snapshot(dir, compress); });
  const double pause_ms = pause_since(start);
  auto again = connect(k, std::move(process));
  if (!again) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    k->resume_failed("the kernel was unreachable after a snapshot: " + again.error().message);
    return std::move(again).error();
  }
  (void)k->resumed(std::move(again).value());
  if (!dumped) {
    spdlog::warn("kernel {}: {}", kernel_id, dumped.error().message);
    std::error_code ec;
    fs::remove_all(dir, ec);
    return std::move(dumped).error();
  }
  SnapshotModel model;
  model.id = *sid;
  model.kernel_id = kernel_id;
  model.kernel_name = k->spec().name;
  model.created = protocol::iso8601(std::chrono::system_clock::now());
  model.bytes = checkpoint::bytes_under(dir);
  json record = model.to_json();
  record["key"] = key;
  if (auto written = sys::atomic_write(dir + "/" + kRecord, record.dump(), 0600,
                                       sys::Durability::kFsync, "snapshot");
      !written) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    return std::move(written).error();
  }
  spdlog::info("kernel {}: snapshot {} in {:.0f} ms (the kernel paused that long), {} MiB",
               kernel_id, model.id, pause_ms, model.bytes >> 20);
  return model;
}

std::vector<SnapshotModel> KernelRegistry::Impl::snapshots() const {
  std::vector<SnapshotModel> out;
  auto store = snapshot_store();
  if (!store) {
    return out;
  }
  for (const auto& id : store->list()) {
    if (auto s = read_snapshot(*store, id)) {
      out.push_back(std::move(s->model));
    }
  }
  return out;
}

Result<void> KernelRegistry::Impl::delete_snapshot(const std::string& snapshot_id) {
  CELLGATE_ASSIGN_OR_RETURN(checkpoint::ImageStore store, snapshot_store());
  if (!store.find(snapshot_id)) {
    return make_error(ErrorCode::kNotFound, "no_snapshot", "no snapshot " + snapshot_id);
  }
  return store.remove(snapshot_id);
}

Result<KernelModel> KernelRegistry::Impl::start_from_snapshot(const std::string& snapshot_id,
                                                              const std::string& name,
                                                              const json& env) {
  const auto began = std::chrono::steady_clock::now();
  if (!options_.checkpoints_unavailable.empty()) {
    return snapshots_unavailable(options_.checkpoints_unavailable);
  }
  CELLGATE_ASSIGN_OR_RETURN(checkpoint::ImageStore store, snapshot_store());
  CELLGATE_ASSIGN_OR_RETURN(Stored s, read_snapshot(store, snapshot_id));
  if (!name.empty() && name != s.model.kernel_name) {
    return make_error(
        ErrorCode::kInvalidArgument, "snapshot_kernel",
        "snapshot " + snapshot_id + " is of a " + s.model.kernel_name + " kernel, not " + name);
  }
  if (env.is_object() && !env.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "snapshot_env",
                      "a kernel started from a snapshot keeps its source's environment; 'env' "
                      "cannot change it");
  }
  CELLGATE_ASSIGN_OR_RETURN(kernel::KernelSpec spec, kernelspec(s.model.kernel_name));
  const Copy copy{s.dir, s.key, {}};
  return start_new(std::move(spec), {}, &copy, began);
}

Result<std::vector<KernelModel>> KernelRegistry::Impl::fork(const std::string& kernel_id,
                                                            int count) {
  if (count < 1 || count > kMaxForks) {
    return make_error(ErrorCode::kInvalidArgument, "fork_count",
                      "'count' must be 1 to " + std::to_string(kMaxForks));
  }
  // Restored at once and removed: zstd would cost more than the disk it saves.
  CELLGATE_ASSIGN_OR_RETURN(SnapshotModel snap, snapshot(kernel_id, /*compress=*/false));
  std::vector<Result<KernelModel>> made(static_cast<std::size_t>(count),
                                        make_error(ErrorCode::kInternal, "fork", "not started"));
  {
    // The copies restore at once, each in its own scratch dir of the one image.
    std::vector<std::thread> starts;
    for (int i = 0; i < count; ++i) {
      starts.emplace_back([this, &made, &snap, i] {
        made[static_cast<std::size_t>(i)] = start_from_snapshot(snap.id, "", json());
      });
    }
    for (auto& t : starts) {
      t.join();
    }
  }
  (void)delete_snapshot(snap.id);
  std::vector<KernelModel> out;
  for (auto& m : made) {
    if (!m) {
      for (const auto& other : made) {  // all or none
        if (other) {
          (void)shutdown(other->id);
        }
      }
      return std::move(m).error();
    }
    out.push_back(*m);
  }
  return out;
}

// ---- a copy's own connection key ----
//
// A restored copy holds its source's key in memory. Before the copy is connected and recorded,
// one silent cell sent under the old key sets the kernel's Session key to a fresh one (its
// setter rebuilds the HMAC that every channel of ipykernel signs and checks with). The proof the
// kernel switched is on iopub, which keeps order: the cell's busy status arrives signed with the
// old key, and the next message (its idle status; a silent cell publishes nothing between) fails
// the old key's check. The gateway's own
// connection then opens with the new key; its kernel_info_request, verified by the kernel and
// answered under the new key, proves the rest. A kernel that is not ipykernel's Python keeps its
// source's key (the key guards sockets in the copy's own connection dir, which nothing but the
// copy's jail and the gateway reaches): said in the log.

// The same cell first opens IPython's history database again. SQLite keeps the inode number of
// the file it opened in the process's memory, and a copy's work dir (where history.sqlite is) is
// a new tmpfs with new inodes: the first write after the restore failed as "attempt to write a
// readonly database" (SQLITE_READONLY_DBMOVED), and IPython's saving thread printed that into
// whichever cell was running and stopped saving. The saving thread is stopped (it waits for work
// and writes nothing meanwhile), both connections are opened anew, a new thread started. Any
// failure leaves the history as it was, silently.
constexpr const char* kReopenHistory =
    "exec(\"try:\\n"
    " import atexit\\n"
    " from IPython.core.history import HistorySavingThread\\n"
    " h = __import__('IPython').get_ipython().history_manager\\n"
    " t = h.save_thread\\n"
    " if h.enabled and t is not None:\\n"
    "  t.stop()\\n"
    "  atexit.unregister(t.stop)\\n"
    "  h.init_db()\\n"
    "  h.save_thread = HistorySavingThread(h)\\n"
    "  h.save_thread.start()\\n"
    "except Exception:\\n"
    " pass\\n\", {})\n";

Result<void> KernelRegistry::Impl::rekey(const ManagedKernel& k,
                                         kernel::KernelProcessHandle& process) {
  if (k.spec().language != "python") {
    spdlog::info("kernel {}: a copy of a {} kernel keeps its source's connection key", k.id(),
                 k.spec().language.empty() ? "non-Python" : k.spec().language);
    return {};
  }
  struct Watch {
    std::mutex mu;
    std::condition_variable cv;
    bool started = false;   // the cell's busy status, under the old key
    bool switched = false;  // an iopub message after it that the old key does not verify
    bool ended = false;
    std::string error;  // the cell raised: the kernel kept its old key
  };
  auto watch = std::make_shared<Watch>();
  kernel::ClientOptions co;
  co.log_name = k.id() + " (rekey)";
  co.limits.max_message_bytes = options_.max_kernel_message_bytes;
  co.zmq_context = zmq_context_;
  co.on_wire_error = [watch](kernel::Channel channel, const Error& e) {
    std::lock_guard lock(watch->mu);
    if (channel == kernel::Channel::kIopub && watch->started && e.reason == "bad_signature") {
      watch->switched = true;
      watch->cv.notify_all();
    }
  };
  const auto timeout =
      std::chrono::milliseconds(std::llround(options_.kernel_start_timeout * 1000));
  auto fail = [&](const std::string& why) {
    return make_error(ErrorCode::kInternal, "copy_rekey",
                      "the copy could not take a connection key of its own: " + why);
  };
  const std::string key = kernel::random_hex(32);
  {
    CELLGATE_ASSIGN_OR_RETURN(std::unique_ptr<kernel::KernelConnection> old,
                              backend_.connect(process, co));
    CELLGATE_TRY(old->wait_ready(timeout));
    // The kernel's own IPython, whatever the cell's namespace holds: nothing a user defined in
    // the source can stand in for it. First, in a namespace of its own, IPython's history is
    // opened again (kReopenHistory); the key's change comes last, so nothing is published
    // between it and the idle status.
    const std::string code = std::string(kReopenHistory) +
                             "__import__('IPython').get_ipython().kernel.session.key = b'" + key +
                             "'\n";
    kernel::RequestHandlers handlers;
    handlers.on_message = [watch](kernel::Channel channel, const protocol::Message& msg) {
      std::lock_guard lock(watch->mu);
      if (channel != kernel::Channel::kIopub) {
        return;
      }
      if (msg.msg_type() == "status" && msg.content.value("execution_state", "") == "busy") {
        watch->started = true;
      } else if (msg.msg_type() == "error") {
        watch->error = msg.content.value("ename", std::string("error")) + ": " +
                       msg.content.value("evalue", std::string());
      }
      watch->cv.notify_all();
    };
    handlers.on_end = [watch](kernel::RequestEnd) {
      std::lock_guard lock(watch->mu);
      watch->ended = true;
      watch->cv.notify_all();
    };
    old->send(kernel::Channel::kShell, "execute_request",
              kernel::execute_content(code, /*allow_stdin=*/false, /*store_history=*/false,
                                      /*silent=*/true),
              std::move(handlers));
    std::unique_lock lock(watch->mu);
    watch->cv.wait_for(lock, timeout,
                       [&] { return watch->switched || !watch->error.empty() || watch->ended; });
    if (!watch->switched) {
      return fail(!watch->error.empty() ? "the kernel refused it (" + watch->error + ")"
                  : watch->ended        ? "the kernel ended"
                                 : "no answer within " + std::to_string(timeout.count()) + " ms");
    }
  }  // the old key's connection closes here
  CELLGATE_TRY(process.set_key(key));
  return {};
}

// ---- KernelRegistry's forwarders ----

Result<SnapshotModel> KernelRegistry::snapshot(const std::string& kernel_id) {
  return impl_->snapshot(kernel_id, /*compress=*/true);
}
std::vector<SnapshotModel> KernelRegistry::snapshots() const {
  return impl_->snapshots();
}
std::uint64_t KernelRegistry::image_bytes(const std::string& kernel_id) const {
  return impl_->image_bytes(kernel_id);
}
Result<void> KernelRegistry::delete_snapshot(const std::string& snapshot_id) {
  return impl_->delete_snapshot(snapshot_id);
}
Result<KernelModel> KernelRegistry::start_from_snapshot(const std::string& snapshot_id,
                                                        const std::string& name, const json& env) {
  return impl_->start_from_snapshot(snapshot_id, name, env);
}
Result<std::vector<KernelModel>> KernelRegistry::fork(const std::string& kernel_id, int count) {
  return impl_->fork(kernel_id, count);
}

}  // namespace cellgate::kernels
