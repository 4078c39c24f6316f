// The registry proper: start, find, list, interrupt, restart, shut down; and KernelRegistry's
// forwarding to its parts (registry_impl.hpp).
#include "cellgate/kernels/registry.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>

#include "cellgate/jail/userns.hpp"
#include "cellgate/kernel/client.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/kernel/progress.hpp"
#include "cellgate/kernels/display_formatters.hpp"
#include "cellgate/protocol/node_ids.hpp"
#include "cellgate/util/fs.hpp"
#include "cellgate/util/log_fields.hpp"
#include "env.hpp"
#include "kernel_jail.hpp"
#include "kernelspecs.hpp"
#include "records.hpp"
#include "registry_impl.hpp"
#include "seeding.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using kernel::Channel;
using nlohmann::json;

Error no_such_kernel(const std::string& id) {
  return protocol::unknown_id(
      id, make_error(ErrorCode::kNotFound, "no_such_kernel", "Kernel does not exist: " + id));
}

UidRangeOptions uid_options(const RegistryOptions& o) {
  UidRangeOptions u = o.uids;
  if (const auto range = jail::kernel_uid_range(); range.count > 0) {
    // Rootless with a subordinate range (jail/userns.hpp): the namespace's uids 1..count are
    // all this gateway's (its /run, where the lease dir is, is its own).
    u.base = range.first;
    u.range_size = range.count;
    u.ranges = 1;
  }
  if (!o.state_dir.empty()) {
    if (u.fallback_lease_dir.empty()) {
      u.fallback_lease_dir = o.state_dir + "/uid-ranges";
    }
    u = owned_by_state_dir(std::move(u), o.state_dir);
  }
  return u;
}

// The built-in python3 unless kernelspecs say otherwise: the first one found then.
std::string choose_default_kernel(const std::string& wanted) {
  if (!wanted.empty()) {
    return wanted;
  }
  std::string name = "python3";
  if (!find_kernelspec(name)) {
    auto specs = list_kernelspecs();
    if (!specs.empty()) {
      name = specs.front().name;
    }
  }
  return name;
}

// The pooled kernelspecs (those that exist, each once) and the pool's size bounds.
WarmPoolOptions pool_options(const RegistryOptions& o, const std::string& default_kernel) {
  WarmPoolOptions p;
  if (o.pool_size <= 0) {
    return p;
  }
  std::vector<std::string> wanted = o.pool_kernels;
  if (wanted.empty()) {
    wanted.push_back(default_kernel);
  }
  for (const auto& name : wanted) {
    if (std::find(p.names.begin(), p.names.end(), name) != p.names.end()) {
      continue;
    }
    if (auto spec = find_kernelspec(name); !spec) {
      spdlog::warn("kernel pool: not pooling '{}': {}", name, spec.error().describe());
      continue;
    }
    p.names.push_back(name);
  }
  p.floor = static_cast<std::size_t>(o.pool_size);
  p.max = std::max(p.floor, static_cast<std::size_t>(std::max(0, o.pool_max)));
  p.parallel = o.pool_parallel > 0 ? static_cast<std::size_t>(o.pool_parallel)
                                   : std::max(1u, std::thread::hardware_concurrency());
  return p;
}

}  // namespace

KernelRegistry::Impl::Impl(RegistryOptions options, kernel::KernelBackend& backend, Now now,
                           util::Loop* loop)
    : options_(std::move(options)),
      default_kernel_(choose_default_kernel(options_.force_kernel.empty() ? options_.default_kernel
                                                                          : options_.force_kernel)),
      backend_(backend),
      now_(loop != nullptr ? Now([loop] { return loop->now(); }) : std::move(now)),
      uids_(uid_options(options_)),
      admission_(options_.max_kernels),
      pool_(
          pool_options(options_, default_kernel_), admission_, backend_,
          [this](const std::string& name) { return launch_pooled(name); },
          [this](const std::shared_ptr<ManagedKernel>& k) { discard(k); }, now_),
      monitor_loop_(loop) {
  if (options_.state_dir.empty()) {
    spdlog::error("kernel registry: no state dir configured; kernels cannot start");
  } else {
    // With a broker, run/ is the broker's (made before the split, not ours to make).
    std::vector<std::string> subs = {"/kernels"};
    if (!options_.privilege_separated) {
      subs.emplace_back("/run");
    }
    for (const auto& sub : subs) {
      if (auto r = make_private_dirs(options_.state_dir + sub, "state_dir"); !r) {
        spdlog::error("{}", r.error().message);
      }
    }
  }
}

Result<void> KernelRegistry::Impl::claim_state_dir() {
  MutexLock lock(mu_);
  if (state_lock_) {
    return {};
  }
  if (options_.state_dir.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "no_state_dir",
                      "the gateway has no state dir configured");
  }
  const std::string path = options_.state_dir + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) {
    return errno_error(ErrorCode::kInternal, "state_dir", "open('" + path + "')", errno);
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    [[maybe_unused]] ssize_t n = ::pread(fd.get(), holder, sizeof holder - 1, 0);
    return make_error(ErrorCode::kFailedPrecondition, "state_dir_in_use",
                      "the state dir " + options_.state_dir + " is in use by another cellgate " +
                          "(pid " + std::string(holder[0] != 0 ? holder : "?") +
                          "); give each gateway its own --state-dir");
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd.get(), 0) == 0) {
    [[maybe_unused]] ssize_t n = ::pwrite(fd.get(), pid.data(), pid.size(), 0);
  }
  state_lock_ = std::move(fd);
  return {};
}

void KernelRegistry::Impl::start() {
  const auto claimed = claim_state_dir();
  if (!claimed) {
    spdlog::error("{}; not adopting or cleaning up any kernel of it", claimed.error().message);
  }
  // The uid range now, so a gateway that cannot have one says so at startup; kernel starts
  // fail closed (allocate() answers the same error) until one is free. The range our kernels
  // already run as, if free: adopted and hibernated kernels come back only as their own uid.
  if (!options_.no_jail) {
    const std::set<uid_t> wanted =
        claimed ? recorded_kernel_uids(options_.state_dir) : std::set<uid_t>{};
    if (auto leased = uids_.lease(wanted); !leased) {
      spdlog::error("{}; no kernel can start", leased.error().message);
    }
  }
  backend_.start();
  if (claimed) {
    adopt_kernels();
  }
  start_monitor();
  pool_.start();
}

KernelRegistry::Impl::~Impl() {
  stop_monitor();
  shutdown_all();
}

// ---- kernelspecs ------------------------------------------------------------------------------

std::vector<kernel::KernelSpec> KernelRegistry::Impl::kernelspecs() const {
  return list_kernelspecs();
}

Result<kernel::KernelSpec> KernelRegistry::Impl::kernelspec(const std::string& name) const {
  return find_kernelspec(name);
}

// ---- starting ---------------------------------------------------------------------------------

Result<std::shared_ptr<ManagedKernel>> KernelRegistry::Impl::new_kernel(
    kernel::KernelSpec spec, std::map<std::string, std::string> env, const std::string& id) {
  // Unjailed kernels run as the gateway itself: no uid of a range to draw.
  uid_t uid = ::geteuid();
  if (!options_.no_jail && !jail::in_single_uid_user_namespace()) {
    CELLGATE_ASSIGN_OR_RETURN(uid, uids_.allocate());
  }  // rootless (jail/userns.hpp): every kernel runs as the namespace's one uid, 0
  return make_kernel(id.empty() ? protocol::new_node_id() : id, std::move(spec), uid,
                     std::move(env));
}

std::shared_ptr<ManagedKernel> KernelRegistry::Impl::make_kernel(
    const std::string& id, kernel::KernelSpec spec, uid_t uid,
    std::map<std::string, std::string> env) {
  const bool broker = options_.privilege_separated;
  auto k = std::make_shared<ManagedKernel>(
      id, std::move(spec), options_.state_dir + "/kernels/" + id, uid, std::move(env), now_,
      broker ? options_.state_dir + "/work/" + id : std::string(), /*shared_files=*/broker);
  if (!options_.state_dir.empty()) {
    k->record_deliveries_in(k->home() + "/delivered");
  }
  return k;
}

kernel::ClientOptions KernelRegistry::Impl::client_options(
    const std::shared_ptr<ManagedKernel>& k, const kernel::KernelProcessHandle& process) {
  // The callbacks hold the kernel weakly; they run on the connection's I/O thread, which the
  // kernel stops (joins) before it goes.
  std::weak_ptr<ManagedKernel> weak = k;
  kernel::ClientOptions co;
  // A ping every 500 ms (every quarter of a shorter timeout); heartbeat_timeout's worth of them
  // unanswered while the probe sees no CPU used means a hung kernel.
  using std::chrono::milliseconds;
  const auto timeout =
      milliseconds(std::max<long long>(100, std::llround(options_.heartbeat_timeout * 1000)));
  co.heartbeat_interval = std::min(milliseconds(500), timeout / 4);
  co.heartbeat_misses = static_cast<int>((timeout.count() + co.heartbeat_interval.count() - 1) /
                                         co.heartbeat_interval.count());
  co.progress = kernel::progress_probe(process);
  co.log_name = k->id();
  co.limits.max_message_bytes = options_.max_kernel_message_bytes;
  co.zmq_context = zmq_context_;
  co.on_iopub = [weak](const protocol::EnvelopePtr& msg) {
    if (auto self = weak.lock()) {
      self->on_iopub(msg);
    }
  };
  co.on_unrouted = [weak](const protocol::EnvelopePtr& msg) {
    if (auto self = weak.lock()) {
      self->on_unrouted(msg);
    }
  };
  co.on_dead = [this](const std::string&) {
    wake_monitor();
    pool_.wake();
  };
  // A kernel chooses how many bad messages it sends: the first few are logged, then one in 1000.
  co.on_wire_error = [id = k->id(), count = std::make_shared<std::atomic<std::uint64_t>>(0)](
                         Channel ch, const Error& e) {
    const std::uint64_t n = ++*count;
    if (n <= 5 || n % 1000 == 0) {
      spdlog::warn("kernel {}: dropped a message on {}: {} ({} so far)", id, kernel::to_string(ch),
                   e.describe(), n);
    }
  };
  return co;
}

Result<ManagedKernel::Running> KernelRegistry::Impl::launch(const std::shared_ptr<ManagedKernel>& k,
                                                            const Copy* copy) {
  if (options_.state_dir.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "no_state_dir",
                      "the gateway has no state dir configured");
  }
  kernel::LaunchRequest req;
  req.spec = k->spec();
  req.kernel_id = k->id();
  req.runtime_parent = options_.state_dir + "/run";
  req.work_dir = k->work_dir();
  // The launcher's report (the jail built, the kernel forked) within the same bound as the
  // kernel's first answer: a slow host (a guest under emulation, a loaded CI machine) can take
  // longer than the launcher's own 10 s default for the jail alone.
  req.start_timeout = std::chrono::milliseconds(std::llround(options_.kernel_start_timeout * 1000));
  req.env = kernel::default_kernel_env(req.work_dir, !options_.no_jail);
  for (const auto& [name, value] : options_.kernel_env) {
    req.env[name] = value;
  }
  for (const auto& [key, value] : k->env()) {
    req.env[key] = value;
  }
  if (!options_.no_jail) {
    CELLGATE_ASSIGN_OR_RETURN(const bool loopback,
                              kernel_loopback(k->spec(), options_.allow_debugger));
    req.jail = kernel_jail(options_.jail, k->id(), k->uid(), k->work_dir(),
                           options_.work_dir_aliases, loopback);
  }
  if (options_.display_formatters) {
    add_display_formatters(req);
  }
  if (copy != nullptr) {
    req.restore_image = copy->image_dir;
    req.key = copy->key;
    if (req.jail && !copy->cgroup_name.empty()) {
      req.jail->name = copy->cgroup_name;
    }
  }
  CELLGATE_ASSIGN_OR_RETURN(std::unique_ptr<kernel::KernelProcessHandle> process,
                            backend_.launch(std::move(req)));
  if (copy != nullptr) {
    CELLGATE_TRY(rekey(*k, *process));
  }
  CELLGATE_ASSIGN_OR_RETURN(auto running, connect(k, std::move(process)));
  if (copy == nullptr && seeds(options_.seed, k->spec())) {
    CELLGATE_TRY(
        seed_kernel(options_.seed, *running.connection, k->id(),
                    std::chrono::milliseconds(std::llround(options_.kernel_start_timeout * 1000))));
  }
  return running;
}

Result<ManagedKernel::Running> KernelRegistry::Impl::connect(
    const std::shared_ptr<ManagedKernel>& k, std::unique_ptr<kernel::KernelProcessHandle> process) {
  CELLGATE_ASSIGN_OR_RETURN(std::unique_ptr<kernel::KernelConnection> connected,
                            backend_.connect(*process, client_options(k, *process)));
  std::shared_ptr<kernel::KernelConnection> connection = std::move(connected);
  // Asked in slices, so that a kernel that exits while starting (a broken kernelspec, an R
  // without IRkernel) is reported once its launcher says so rather than after the whole timeout.
  using std::chrono::milliseconds;
  const milliseconds timeout(static_cast<long long>(options_.kernel_start_timeout * 1000));
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  constexpr milliseconds kSlice(1000);
  auto ready = connection->wait_ready(std::min(timeout, kSlice));
  while (!ready && ready.error().code == ErrorCode::kDeadlineExceeded && !process->poll_exit()) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(give_up - std::chrono::steady_clock::now());
    if (left <= milliseconds(0)) {
      break;
    }
    ready = connection->wait_ready(std::min(left, kSlice));
  }
  if (!ready) {
    std::string why = ready.error().code == ErrorCode::kDeadlineExceeded
                          ? "not ready within " + std::to_string(timeout.count()) +
                                " ms; last: " + ready.error().message
                          : ready.error().message;
    if (auto ended = process->poll_exit()) {
      why = std::string("the kernel exited while starting (") + launcher::to_string(ended->reason) +
            (ended->message.empty() ? "" : ": " + ended->message) +
            "); its log ends with: " + process->log_tail(800);
    }
    connection.reset();  // its I/O thread first, then the process
    return make_error(ErrorCode::kInternal, "kernel_start_failed", why);
  }
  return ManagedKernel::Running{std::move(process), std::move(connection)};
}

Result<void> KernelRegistry::Impl::make_home(const ManagedKernel& k) const {
  // A broker makes the work dir (in a directory this gateway cannot write).
  return make_private_dirs(options_.privilege_separated ? k.home() : k.work_dir(), "state_dir");
}

Result<void> KernelRegistry::Impl::start_fresh(const std::shared_ptr<ManagedKernel>& k) {
  CELLGATE_TRY(make_home(*k));
  CELLGATE_ASSIGN_OR_RETURN(auto running, launch(k));
  // Recorded as pooled: a gateway that restarts ends it rather than leaving it behind.
  CELLGATE_TRY(write_record(options_.state_dir, *k, ProcessFacts::of(*running.process),
                            options_.jail, /*pooled=*/true));
  return k->started(std::move(running));
}

Result<std::shared_ptr<ManagedKernel>> KernelRegistry::Impl::launch_pooled(
    const std::string& name) {
  CELLGATE_ASSIGN_OR_RETURN(kernel::KernelSpec spec, kernelspec(name));
  CELLGATE_ASSIGN_OR_RETURN(auto k, new_kernel(std::move(spec), {}));
  if (auto started = start_fresh(k); !started) {
    discard(k);
    return std::move(started).error();
  }
  if (is_ipykernel(k->spec())) {
    // An ipykernel's first cell costs ~10 ms more than later ones (IPython sets up its input
    // transformers and display machinery lazily): pay it here. Silent and without history, so
    // the execution count and In/Out are still a fresh kernel's. Not for other kernels: `pass`
    // is Python (in R it is an error, and IRkernel then aborts what is queued behind it).
    if (auto conn = k->connection()) {
      (void)conn->request(Channel::kShell, "execute_request",
                          kernel::execute_content("pass", false, false, true),
                          std::chrono::seconds(10));
    }
  }
  return k;
}

std::shared_ptr<ManagedKernel> KernelRegistry::Impl::claim_pooled(const std::string& name) {
  while (auto taken = pool_.take(name)) {
    const std::shared_ptr<ManagedKernel>& k = taken->kernel;
    const std::string dead = k->death_reason();
    k->touch();
    auto facts = k->process_facts();
    Result<void> recorded =
        !dead.empty() ? Result<void>()
        : facts       ? write_record(options_.state_dir, *k, *facts, options_.jail)
                      : Result<void>(make_error(ErrorCode::kUnavailable, "kernel_unavailable",
                                                "the pooled kernel has no process"));
    if (dead.empty() && recorded.ok()) {
      taken->ticket.make_live();
      {
        MutexLock lock(mu_);
        kernels_[k->id()] = Live{k, std::move(taken->ticket)};
      }
      util::log_kernel_action(
          "start", k->id(), name, true,
          fmt::format("kernel {} started ({}), uid {}, from the pool", k->id(), name, k->uid()));
      return k;
    }
    spdlog::warn("kernel pool: dropping pooled kernel {} ({}): {}", k->id(), name,
                 dead.empty() ? recorded.error().describe() : "it died: " + dead);
    taken->ticket.reset();
    discard(k);
  }
  return nullptr;
}

Result<KernelModel> KernelRegistry::Impl::start(const std::string& name, const json& env) {
  CELLGATE_TRY(refuse_if_draining());
  const auto began = std::chrono::steady_clock::now();
  auto took = [&began] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  };
  CELLGATE_ASSIGN_OR_RETURN(auto client_env, filter_env(env, options_.env_allowlist));
  const std::string spec_name = !options_.force_kernel.empty() ? options_.force_kernel
                                : name.empty()                 ? default_kernel_
                                                               : name;
  if (pool_.pools(spec_name)) {
    // A pooled kernel started with no client env: it can only stand in for a start without one.
    if (client_env.empty()) {
      if (auto k = claim_pooled(spec_name)) {
        stats_.starts.add();
        stats_.pool_claims.add();
        stats_.start_seconds.observe({spec_name, "pool"}, took());
        spdlog::debug("kernel pool: hit ({}): kernel {}", spec_name, k->id());
        return k->model();
      }
    }
    spdlog::debug("kernel pool: miss ({}): {}", spec_name,
                  client_env.empty() ? "none ready" : "the client sets env");
  }
  CELLGATE_ASSIGN_OR_RETURN(kernel::KernelSpec spec, kernelspec(spec_name));
  return start_new(std::move(spec), std::move(client_env), nullptr, began);
}

Result<KernelModel> KernelRegistry::Impl::start_new(kernel::KernelSpec spec,
                                                    std::map<std::string, std::string> env,
                                                    const Copy* copy,
                                                    std::chrono::steady_clock::time_point began,
                                                    const std::string& id) {
  CELLGATE_TRY(refuse_if_draining());
  // Pooled kernels count towards max_kernels, but never cost a client its kernel: ready ones
  // make room below.
  CELLGATE_ASSIGN_OR_RETURN(Admission::Ticket place, admission_.admit_client());
  CELLGATE_ASSIGN_OR_RETURN(auto k, new_kernel(std::move(spec), std::move(env), id));
  pool_.evict_excess();
  const char* source = copy != nullptr ? "snapshot" : "cold";
  auto launched = [&]() -> Result<void> {
    CELLGATE_TRY(make_home(*k));
    CELLGATE_ASSIGN_OR_RETURN(auto running, launch(k, copy));
    if (copy == nullptr) {
      source = running.process->from_zygote() ? "zygote" : "cold";
    }
    CELLGATE_TRY(
        write_record(options_.state_dir, *k, ProcessFacts::of(*running.process), options_.jail));
    return k->started(std::move(running));
  }();
  if (launched) {
    place.make_live();
    MutexLock lock(mu_);
    kernels_[k->id()] = Live{k, std::move(place)};
  } else {
    place.reset();
  }
  pool_.wake();  // one client start fewer: the pool may start one more at once
  if (!launched) {
    stats_.start_failures.add();
    discard(k);
    return std::move(launched).error();
  }
  stats_.starts.add();
  stats_.start_seconds.observe(
      {k->spec().name, source},
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  util::log_kernel_action("start", k->id(), k->spec().name, true,
                          fmt::format("kernel {} started ({}{}), uid {}", k->id(), k->spec().name,
                                      copy ? ", from a snapshot" : "", k->uid()));
  return k->model();
}

// ---- the pool's figures ----------------------------------------------------------------------

std::size_t KernelRegistry::Impl::pool_ready(const std::string& name) const {
  return pool_.ready(name.empty() ? default_kernel_ : name);
}

std::size_t KernelRegistry::Impl::pool_target(const std::string& name) const {
  return pool_.target(name.empty() ? default_kernel_ : name);
}

std::vector<pid_t> KernelRegistry::Impl::pool_pids(const std::string& name) const {
  std::vector<pid_t> out;
  for (const auto& k : pool_.ready_kernels(name.empty() ? default_kernel_ : name)) {
    if (auto facts = k->process_facts()) {
      out.push_back(facts->pid);
    }
  }
  return out;
}

// ---- finding ----------------------------------------------------------------------------------

Result<std::shared_ptr<ManagedKernel>> KernelRegistry::Impl::find(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = kernels_.find(id);
  if (it == kernels_.end()) {
    return no_such_kernel(id);
  }
  return it->second.kernel;
}

std::vector<std::shared_ptr<ManagedKernel>> KernelRegistry::Impl::snapshot() const {
  std::vector<std::shared_ptr<ManagedKernel>> out;
  MutexLock lock(mu_);
  out.reserve(kernels_.size());
  for (const auto& [id, live] : kernels_) {
    out.push_back(live.kernel);
  }
  return out;
}

std::vector<KernelModel> KernelRegistry::Impl::list() const {
  std::vector<KernelModel> out;
  for (const auto& k : snapshot()) {
    out.push_back(k->model());
  }
  return out;
}

// ---- interrupt, restart -----------------------------------------------------------------------

Result<void> KernelRegistry::Impl::interrupt(const std::string& id) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  CELLGATE_TRY(resume(k));
  return k->interrupt();
}

Result<KernelModel> KernelRegistry::Impl::restart(const std::string& id) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  {
    MutexLock life(k->lifecycle());  // not while it hibernates or resumes
    CELLGATE_TRY(k->begin_restart());
    k->stop_process();
    // A hibernated kernel starts afresh, as a restart of a running one would: its image goes.
    std::error_code ec;
    fs::remove_all(image_dir(*k), ec);
  }
  auto launched = [&]() -> Result<void> {
    CELLGATE_ASSIGN_OR_RETURN(auto running, launch(k));
    CELLGATE_TRY(
        write_record(options_.state_dir, *k, ProcessFacts::of(*running.process), options_.jail));
    return k->started(std::move(running), /*client_restart=*/true);
  }();
  if (!launched) {
    k->restart_failed(launched.error().message);
    return std::move(launched).error();
  }
  return k->model();
}

// ---- shutting down ----------------------------------------------------------------------------

void KernelRegistry::Impl::release(const ManagedKernel& k) {
  // The launcher mounted a size-capped tmpfs on the work dir, which outlived each process.
  backend_.end_work_dir(k.id(), k.work_dir());
  std::error_code ec;
  fs::remove_all(k.home(), ec);
  if (!options_.no_jail) {
    uids_.release(k.uid());
  }
}

void KernelRegistry::Impl::discard(const std::shared_ptr<ManagedKernel>& k) {
  k->end();  // the process and connection stop as the result goes
  release(*k);
  remove_record(options_.state_dir, k->id());  // a pooled kernel's
}

Result<void> KernelRegistry::Impl::shutdown(const std::string& id) {
  std::shared_ptr<ManagedKernel> k;
  Admission::Ticket place;  // given back once the kernel is gone
  {
    MutexLock lock(mu_);
    auto it = kernels_.find(id);
    if (it == kernels_.end()) {
      return no_such_kernel(id);
    }
    k = it->second.kernel;
  }
  MutexLock life(k->lifecycle());  // a hibernation under way ends first
  {
    MutexLock lock(mu_);
    auto it = kernels_.find(id);
    if (it == kernels_.end()) {
      return no_such_kernel(id);  // shut down meanwhile
    }
    place = std::move(it->second.place);
    kernels_.erase(it);
  }
  // A polite shutdown first, so the kernel can clean up (its cgroup is killed either way), while
  // its clients still listen: ipykernel answers on control, then publishes a shutdown_reply on
  // iopub as it exits, which jupyter_server's clients see before their kernel goes.
  bool asked = false;
  if (auto polite = k->connection(); polite && polite->is_alive()) {
    asked = true;
    auto reply = polite->request(Channel::kControl, "shutdown_request", json{{"restart", false}},
                                 std::chrono::seconds(2), false);
    if (reply) {
      (void)k->wait_shutdown_published(std::chrono::seconds(1));
    }
  }
  ManagedKernel::Ended ended = k->end();
  auto& [process, connection] = ended.running;
  if (asked && process) {
    process->wait_exit(std::chrono::seconds(1));
  }
  connection.reset();
  process.reset();
  for (auto& l : ended.listeners) {
    l->kernel_gone("the kernel was shut down");
  }
  release(*k);
  remove_record(options_.state_dir, id);
  util::log_kernel_action("shutdown", id, k->spec().name, true,
                          fmt::format("kernel {} shut down", id));
  return {};
}

void KernelRegistry::Impl::hand_over() {
  pool_.stop();
  std::map<std::string, Live> kernels;
  {
    MutexLock lock(mu_);
    kernels.swap(kernels_);
  }
  for (const auto& [id, live] : kernels) {
    const auto& k = live.kernel;
    ManagedKernel::Ended ended = k->end();
    ended.running.connection.reset();  // its I/O thread ends; the kernel's sockets stay
    if (ended.running.process) {
      ended.running.process->detach();
    }
    for (auto& l : ended.listeners) {
      l->kernel_gone("the gateway is restarting; the kernel keeps running: reconnect");
    }
    spdlog::info("kernel {} left running for the next gateway on {}", id, options_.state_dir);
  }
}

std::vector<std::string> KernelRegistry::Impl::kernel_ids() const {
  std::vector<std::string> ids;
  MutexLock lock(mu_);
  for (const auto& [id, k] : kernels_) {
    ids.push_back(id);
  }
  return ids;
}

void KernelRegistry::Impl::shutdown_all() {
  pool_.stop();
  for (const auto& id : kernel_ids()) {
    (void)shutdown(id);
  }
}

// ---- KernelRegistry: the contract, forwarded to its parts ------------------------------------

KernelRegistry::KernelRegistry(RegistryOptions options, kernel::KernelBackend& backend, Now now)
    : impl_(std::make_unique<Impl>(std::move(options), backend, std::move(now), nullptr)) {}
KernelRegistry::KernelRegistry(RegistryOptions options, kernel::KernelBackend& backend,
                               util::Loop& loop)
    : impl_(std::make_unique<Impl>(std::move(options), backend, Now(), &loop)) {}
KernelRegistry::~KernelRegistry() = default;
Result<void> KernelRegistry::claim_state_dir() {
  return impl_->claim_state_dir();
}
void KernelRegistry::start() {
  impl_->start();
}
namespace {

// A client's interrupt, restart or shutdown of kernel `id` (`name`, its kernelspec), as
// jupyter_server's kernel_actions event: "kernel ID interrupted", or why it was not.
template <typename T>
void log_action(std::string_view action, const std::string& id, const std::string& name,
                const Result<T>& done, std::string_view past) {
  if (done.ok()) {
    util::log_kernel_action(action, id, name, true, fmt::format("kernel {} {}", id, past));
  } else {
    util::log_kernel_action(
        action, id, name, false,
        fmt::format("kernel {}: {} failed: {}", id, action, done.error().message));
  }
}

}  // namespace

// The public calls log what a client asked for as jupyter_server's kernel_actions events
// (util::log_kernel_action): starts and shutdowns where they succeed, inside, and their failures
// here; interrupts and restarts here.
std::string KernelRegistry::spec_name_of(const std::string& id) const {
  auto k = impl_->find(id);
  return k ? k.value()->spec().name : std::string();
}
Result<KernelModel> KernelRegistry::start(const std::string& name, const json& env) {
  auto started = impl_->start(name, env);
  if (!started) {
    util::log_kernel_action("start", "", name, false,
                            fmt::format("a kernel ({}) did not start: {}",
                                        name.empty() ? "default" : name, started.error().message));
  }
  return started;
}
Result<std::shared_ptr<ManagedKernel>> KernelRegistry::find(const std::string& id) const {
  return impl_->find(id);
}
std::vector<KernelModel> KernelRegistry::list() const {
  return impl_->list();
}
void KernelRegistry::set_draining(bool on) {
  impl_->set_draining(on);
}
bool KernelRegistry::draining() const {
  return impl_->draining();
}
int KernelRegistry::room_percent() const {
  return impl_->room_percent();
}
void KernelRegistry::Impl::set_draining(bool on) {
  if (draining_.exchange(on) != on) {
    spdlog::info("this node {} draining: {}", on ? "is" : "stopped",
                 on ? "no kernel starts here, the running ones run on" : "kernels start again");
  }
}
int KernelRegistry::Impl::room_percent() const {
  const auto counts = admission_.counts();
  const std::size_t max = admission_.max_kernels();
  const std::size_t used = counts.live + counts.pending;
  if (max == 0 || used >= max) {
    return 0;
  }
  return static_cast<int>(std::max<std::size_t>(1, (max - used) * 100 / max));
}
Result<void> KernelRegistry::interrupt(const std::string& id) {
  auto done = impl_->interrupt(id);
  log_action("interrupt", id, spec_name_of(id), done, "interrupted");
  return done;
}
Result<KernelModel> KernelRegistry::restart(const std::string& id) {
  auto done = impl_->restart(id);
  log_action("restart", id, spec_name_of(id), done, "restarted");
  return done;
}
Result<KernelModel> KernelRegistry::hibernate(const std::string& id) {
  return impl_->hibernate(id);
}
Result<void> KernelRegistry::resume(const std::string& id) {
  return impl_->resume(id);
}
Result<void> KernelRegistry::shutdown(const std::string& id) {
  auto done = impl_->shutdown(id);
  if (!done) {
    log_action("shutdown", id, spec_name_of(id), done, "shut down");
  }
  return done;
}
void KernelRegistry::shutdown_all() {
  impl_->shutdown_all();
}
void KernelRegistry::hand_over() {
  impl_->hand_over();
}
void KernelRegistry::hibernate_and_stop() {
  impl_->hibernate_and_stop();
}
void KernelRegistry::monitor_once() {
  impl_->monitor_once();
}
const RegistryStats& KernelRegistry::stats() const {
  return impl_->stats_;
}
std::size_t KernelRegistry::pool_ready_total() const {
  return impl_->pool_ready_total();
}
std::size_t KernelRegistry::pool_ready(const std::string& name) const {
  return impl_->pool_ready(name);
}
std::vector<pid_t> KernelRegistry::pool_pids(const std::string& name) const {
  return impl_->pool_pids(name);
}
std::size_t KernelRegistry::pool_target(const std::string& name) const {
  return impl_->pool_target(name);
}
std::vector<kernel::KernelSpec> KernelRegistry::kernelspecs() const {
  return impl_->kernelspecs();
}
Result<kernel::KernelSpec> KernelRegistry::kernelspec(const std::string& name) const {
  return impl_->kernelspec(name);
}
const std::string& KernelRegistry::default_kernel_name() const {
  return impl_->default_kernel_;
}
const RegistryOptions& KernelRegistry::options() const {
  return impl_->options_;
}
const std::string& KernelRegistry::state_dir() const {
  return impl_->options_.state_dir;
}

}  // namespace cellgate::kernels
