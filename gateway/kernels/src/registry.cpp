#include "cellgate/kernels/registry.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using kernel::Channel;

// jupyter_server does not let these requests' status messages change execution_state.
const std::set<std::string> kUntracked = {"comm_info_request", "kernel_info_request",
                                          "debug_request", "shutdown_request",
                                          "interrupt_request"};

constexpr uid_t kGatewayUidBase = 2000000;  // above the launcher's kUidBase + pid range

using protocol::iso8601;

std::string default_state_dir() {
  if (const char* d = std::getenv("CELLGATE_STATE_DIR"); d != nullptr && *d != '\0') {
    return d;
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : "/root") + "/.local/state/cellgate";
}

Result<void> make_private_dir(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) {
    return make_error(ErrorCode::kInternal, "state_dir",
                      "cannot create " + path + ": " + ec.message());
  }
  if (::chmod(path.c_str(), 0700) != 0) {
    return errno_error(ErrorCode::kInternal, "state_dir", "chmod('" + path + "', 0700)", errno);
  }
  return {};
}

// Atomic, owner-only write: temp file, fsync, rename.
Result<void> write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) {
    return errno_error(ErrorCode::kInternal, "state", "open('" + tmp + "')", errno);
  }
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::fsync(fd.get()) != 0) {
    return errno_error(ErrorCode::kInternal, "state", "write('" + tmp + "')", errno);
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return errno_error(ErrorCode::kInternal, "state", "rename('" + tmp + "')", errno);
  }
  return {};
}

// Field 22 of /proc/<pid>/stat: with the pid it identifies the process across pid reuse.
std::string process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto close = text.rfind(')');
  if (close == std::string::npos) {
    return "";
  }
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

// Client env: only KERNEL_* and allowlisted names, string values without control characters.
// jupyter_server 1.23 sends its whole environment here: everything else is dropped unlogged.
Result<std::map<std::string, std::string>> filter_env(const json& env,
                                                      const std::set<std::string>& allow) {
  std::map<std::string, std::string> out;
  if (env.is_null()) {
    return out;
  }
  if (!env.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "bad_env", "'env' must be an object");
  }
  for (const auto& [key, value] : env.items()) {
    if (!key.starts_with("KERNEL_") && allow.count(key) == 0) {
      continue;
    }
    if (!value.is_string()) {
      return make_error(ErrorCode::kInvalidArgument, "bad_env",
                        "env value of " + key + " must be a string");
    }
    const auto& v = value.get_ref<const std::string&>();
    if (v.size() > 4096 || v.find_first_of(std::string("\0\n\r", 3)) != std::string::npos) {
      return make_error(ErrorCode::kInvalidArgument, "bad_env",
                        "env value of " + key + " is too long or has control characters");
    }
    out[key] = v;
  }
  return out;
}

// The built-in kernelspec, offered when no python3 kernelspec is installed: Debian's ipykernel.
kernel::KernelSpec builtin_python3() {
  kernel::KernelSpec spec;
  spec.name = "python3";
  spec.display_name = "Python 3";
  spec.language = "python";
  spec.argv = {"/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"};
  return spec;
}

}  // namespace

json KernelModel::to_json() const {
  json j = {{"id", id},
            {"name", name},
            {"last_activity", last_activity},
            {"execution_state", execution_state},
            {"connections", connections}};
  if (!reason.empty()) {
    j["reason"] = reason;
  }
  return j;
}

// ---- ManagedKernel ---------------------------------------------------------------------------

ManagedKernel::ManagedKernel(std::string id, kernel::KernelSpec spec, std::string home)
    : id_(std::move(id)),
      spec_(std::move(spec)),
      home_(std::move(home)),
      last_activity_(std::chrono::system_clock::now()),
      last_activity_steady_(Clock::now()) {}

ManagedKernel::~ManagedKernel() { stop_process(); }

void ManagedKernel::stop_process() {
  std::shared_ptr<kernel::KernelClient> client;
  std::unique_ptr<kernel::KernelProcess> process;
  {
    std::lock_guard lock(mu_);
    client = std::move(client_);
    process = std::move(process_);
  }
  // Outside the lock: the client's I/O thread calls back into us, so it stops first (joining
  // its thread); then the process goes, which kills the kernel and its cgroup.
  client.reset();
  process.reset();
}

KernelModel ManagedKernel::model() const {
  std::lock_guard lock(mu_);
  KernelModel m;
  m.id = id_;
  m.name = spec_.name;
  m.last_activity = iso8601(last_activity_);
  m.execution_state = execution_state_;
  m.reason = reason_;
  for (const auto& a : attached_) {
    if (!a.listener.expired()) {
      ++m.connections;
    }
  }
  return m;
}

bool ManagedKernel::attach(const std::shared_ptr<ChannelListener>& listener,
                           const std::string& session_id) {
  std::shared_ptr<ChannelListener> replaced;
  {
    std::lock_guard lock(mu_);
    if (gone_) {
      return false;
    }
    if (!session_id.empty()) {
      // jupyter_server: a second connection with the same session id replaces the stale one.
      for (auto& a : attached_) {
        if (a.session_id == session_id) {
          replaced = a.listener.lock();
          a.listener.reset();
        }
      }
      by_session_[session_id] = listener;
    }
    std::erase_if(attached_, [](const Attached& a) { return a.listener.expired(); });
    attached_.push_back({listener, session_id});
    last_activity_ = std::chrono::system_clock::now();
    last_activity_steady_ = Clock::now();
  }
  if (replaced) {
    replaced->kernel_gone("replaced by a new connection with the same session_id");
  }
  return true;
}

void ManagedKernel::detach(const ChannelListener* listener) {
  std::lock_guard lock(mu_);
  std::erase_if(attached_, [&](const Attached& a) {
    auto l = a.listener.lock();
    return !l || l.get() == listener;
  });
  std::erase_if(by_session_, [&](const auto& entry) {
    auto l = entry.second.lock();
    return !l || l.get() == listener;
  });
}

Result<void> ManagedKernel::post(Channel channel, protocol::Message msg,
                                 const std::shared_ptr<ChannelListener>& sender) {
  std::shared_ptr<kernel::KernelClient> client;
  {
    std::lock_guard lock(mu_);
    if (gone_ || !client_) {
      return make_error(ErrorCode::kUnavailable, "kernel_unavailable",
                        "kernel " + id_ + " is " + (gone_ ? "gone" : execution_state_));
    }
    const std::string session = msg.header.value("session", "");
    if (!session.empty() && sender) {
      by_session_[session] = sender;
    }
    last_activity_ = std::chrono::system_clock::now();
    last_activity_steady_ = Clock::now();
    client = client_;
  }
  client->post(channel, std::move(msg));
  return {};
}

uid_t ManagedKernel::uid() const {
  std::lock_guard lock(mu_);
  return uid_;
}

Result<jail::CgroupStats> ManagedKernel::cgroup_stats() const {
  std::lock_guard lock(mu_);
  if (!process_) {
    return make_error(ErrorCode::kUnavailable, "kernel_not_running", "the kernel is not running");
  }
  return process_->cgroup_stats();
}

std::shared_ptr<kernel::KernelClient> ManagedKernel::client() const {
  std::lock_guard lock(mu_);
  return client_;
}

void ManagedKernel::touch() {
  last_activity_ = std::chrono::system_clock::now();
  last_activity_steady_ = Clock::now();
}

std::vector<std::shared_ptr<ChannelListener>> ManagedKernel::listeners_snapshot() {
  std::vector<std::shared_ptr<ChannelListener>> out;
  for (const auto& a : attached_) {
    if (auto l = a.listener.lock()) {
      out.push_back(std::move(l));
    }
  }
  return out;
}

void ManagedKernel::on_iopub(const protocol::Message& msg) {
  auto shared = std::make_shared<const protocol::Message>(msg);
  std::vector<std::shared_ptr<ChannelListener>> targets;
  {
    std::lock_guard lock(mu_);
    touch();
    if (msg.msg_type() == "status") {
      const std::string parent_type = msg.parent_header.value("msg_type", "");
      const std::string state = msg.content.value("execution_state", "");
      if (kUntracked.count(parent_type) == 0 && (state == "busy" || state == "idle")) {
        execution_state_ = state;
      } else if (execution_state_ == "starting" && state == "idle") {
        execution_state_ = "idle";
      }
    }
    targets = listeners_snapshot();
  }
  for (auto& l : targets) {
    l->deliver(Channel::kIopub, shared);
  }
}

void ManagedKernel::on_unrouted(Channel channel, const protocol::Message& msg) {
  std::shared_ptr<ChannelListener> target;
  {
    std::lock_guard lock(mu_);
    auto it = by_session_.find(msg.parent_header.value("session", ""));
    if (it != by_session_.end()) {
      target = it->second.lock();
    }
  }
  if (target) {
    target->deliver(channel, std::make_shared<const protocol::Message>(msg));
  }
}

void ManagedKernel::publish_status(const std::string& state, const std::string& reason) {
  static const protocol::Session gateway_session("cellgate");
  json content = {{"execution_state", state}};
  if (!reason.empty()) {
    content["reason"] = reason;  // cellgate's addition; clients read only execution_state
  }
  protocol::Message msg = gateway_session.make("status", std::move(content));
  auto shared = std::make_shared<const protocol::Message>(std::move(msg));
  std::vector<std::shared_ptr<ChannelListener>> targets;
  {
    std::lock_guard lock(mu_);
    targets = listeners_snapshot();
  }
  for (auto& l : targets) {
    l->deliver(Channel::kIopub, shared);
  }
}

// ---- KernelRegistry ---------------------------------------------------------------------------

KernelRegistry::KernelRegistry(RegistryOptions options)
    : options_(std::move(options)),
      state_dir_(options_.state_dir.empty() ? default_state_dir() : options_.state_dir) {
  for (const char* sub : {"", "/kernels", "/run"}) {
    if (auto r = make_private_dir(state_dir_ + sub); !r) {
      spdlog::error("{}", r.error().message);
    }
  }
  if (!kernelspec(default_kernel_)) {
    auto specs = kernelspecs();
    if (!specs.empty()) {
      default_kernel_ = specs.front().name;
    }
  }
  if (options_.pool_size > 0) {
    std::vector<std::string> wanted = options_.pool_kernels;
    if (wanted.empty()) {
      wanted.push_back(default_kernel_);
    }
    for (const auto& name : wanted) {
      if (std::find(pool_names_.begin(), pool_names_.end(), name) != pool_names_.end()) {
        continue;
      }
      if (auto spec = kernelspec(name); !spec) {
        spdlog::warn("kernel pool: not pooling '{}': {}", name, spec.error().describe());
        continue;
      }
      pool_names_.push_back(name);
    }
  }
}

void KernelRegistry::start() {
  if (options_.zygote && !options_.no_jail && !zygote_) {
    kernel::ZygoteOptions zo;
    zo.socket_path = state_dir_ + "/run/zygote.sock";
    zo.log_file = state_dir_ + "/zygote.log";
    zo.preload = options_.zygote_preload;
    zygote_ = std::make_unique<kernel::Zygote>(std::move(zo));
  }
  if (!monitor_.joinable()) {
    monitor_ = std::thread([this] { monitor_loop(); });
  }
  if (!pool_names_.empty() && !pool_thread_.joinable()) {
    pool_thread_ = std::thread([this] { pool_loop(); });
  }
}

KernelRegistry::~KernelRegistry() {
  {
    std::lock_guard lock(monitor_mu_);
    stopping_ = true;
  }
  monitor_cv_.notify_all();
  if (monitor_.joinable()) {
    monitor_.join();
  }
  shutdown_all();
}

// ---- The warm pool ----------------------------------------------------------------------------

bool KernelRegistry::is_pooled(const std::string& name) const {
  return std::find(pool_names_.begin(), pool_names_.end(), name) != pool_names_.end();
}

std::size_t KernelRegistry::pool_total_locked() const {
  std::size_t n = 0;
  for (const auto& [name, ready] : pool_) {
    n += ready.size();
  }
  for (const auto& [name, starting] : pool_starting_) {
    n += starting;
  }
  return n;
}

std::size_t KernelRegistry::pool_ready(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = pool_.find(name.empty() ? default_kernel_ : name);
  return it == pool_.end() ? 0 : it->second.size();
}

std::vector<pid_t> KernelRegistry::pool_pids(const std::string& name) const {
  std::vector<std::shared_ptr<ManagedKernel>> ready;
  {
    std::lock_guard lock(mu_);
    if (auto it = pool_.find(name.empty() ? default_kernel_ : name); it != pool_.end()) {
      ready = it->second;
    }
  }
  std::vector<pid_t> out;
  for (const auto& k : ready) {
    std::lock_guard lock(k->mu_);
    if (k->process_) {
      out.push_back(k->process_->pid());
    }
  }
  return out;
}

std::string KernelRegistry::death_reason_locked(ManagedKernel& k) {
  if (!k.process_) {
    return "";
  }
  if (auto ended = k.process_->poll_exit()) {
    std::string reason = launcher::to_string(ended->reason);
    if (ended->reason == launcher::ExitReason::kOk) {
      reason = "exited with code " + std::to_string(ended->exit_code);
    }
    if (ended->signal != 0) {
      reason += " (signal " + std::to_string(ended->signal) + ")";
    }
    if (!ended->message.empty()) {
      reason += ": " + ended->message;
    }
    return reason;
  }
  if (k.client_ && !k.client_->is_alive()) {
    return "the kernel stopped answering heartbeats";
  }
  return "";
}

std::shared_ptr<ManagedKernel> KernelRegistry::claim_pooled(const std::string& name) {
  for (;;) {
    std::shared_ptr<ManagedKernel> k;
    {
      std::lock_guard lock(mu_);
      auto it = pool_.find(name);
      if (it == pool_.end() || it->second.empty()) {
        return nullptr;
      }
      k = it->second.front();
      it->second.erase(it->second.begin());
      ++pending_;  // still counted towards max_kernels while it moves
    }
    std::string dead;
    {
      std::lock_guard lock(k->mu_);
      dead = death_reason_locked(*k);
      k->touch();
    }
    Result<void> recorded = dead.empty() ? write_record(*k) : Result<void>();
    const bool ok = dead.empty() && recorded.ok();
    {
      std::lock_guard lock(mu_);
      --pending_;
      if (ok) {
        kernels_[k->id_] = k;
      }
    }
    pool_cv_.notify_all();  // refill
    if (ok) {
      spdlog::info("kernel {} started ({}), uid {}, from the pool", k->id_, name, k->uid_);
      return k;
    }
    spdlog::warn("kernel pool: dropping pooled kernel {} ({}): {}", k->id_, name,
                 dead.empty() ? recorded.error().describe() : "it died: " + dead);
    discard(k);
  }
}

std::vector<std::shared_ptr<ManagedKernel>> KernelRegistry::evict_pooled_locked() {
  std::vector<std::shared_ptr<ManagedKernel>> out;
  std::size_t total = kernels_.size() + pending_ + pool_total_locked();
  while (total > options_.max_kernels) {
    auto fullest = pool_.end();
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if (!it->second.empty() &&
          (fullest == pool_.end() || it->second.size() > fullest->second.size())) {
        fullest = it;
      }
    }
    if (fullest == pool_.end()) {
      break;  // only pool starts in flight: refill() drops them when they finish
    }
    out.push_back(fullest->second.front());
    fullest->second.erase(fullest->second.begin());
    --total;
  }
  return out;
}

void KernelRegistry::discard(const std::shared_ptr<ManagedKernel>& k) {
  {
    std::lock_guard lock(k->mu_);
    k->gone_ = true;
  }
  k->stop_process();
  ::umount2((k->home_ + "/work").c_str(), MNT_DETACH);
  std::error_code ec;
  fs::remove_all(k->home_, ec);
  std::lock_guard lock(mu_);
  uids_in_use_.erase(k->uid_);
}

bool KernelRegistry::refill(const std::string& name) {
  auto spec = kernelspec(name);
  std::shared_ptr<ManagedKernel> k;
  if (spec) {
    std::lock_guard lock(mu_);
    k = new_kernel_locked(std::move(spec).value());
  }
  Result<void> launched = k ? start_fresh(k) : Result<void>(std::move(spec).error());
  if (launched) {
    // An ipykernel's first cell costs ~10 ms more than later ones (IPython sets up its input
    // transformers and display machinery lazily): pay it here. Silent and without history, so
    // the execution count and In/Out are still a fresh kernel's.
    if (auto client = k->client()) {
      (void)client->request(Channel::kShell, "execute_request",
                            kernel::execute_content("pass", false, false, true),
                            std::chrono::seconds(10));
    }
  }
  bool kept = false;
  std::size_t ready = 0;
  {
    std::lock_guard lock(mu_);
    --pool_starting_[name];
    // A client start may have taken the room meanwhile (clients are never refused for the pool).
    if (launched && !pool_stopping_ &&
        kernels_.size() + pending_ + pool_total_locked() < options_.max_kernels) {
      pool_[name].push_back(k);
      kept = true;
      ready = pool_[name].size();
    }
  }
  if (kept) {
    // At info like every other kernel start (tests/bench/gateway_bench.py waits for this line).
    spdlog::info("kernel pool: kernel {} ready ({} ready, {})", k->id_, ready, name);
  } else if (k) {
    discard(k);
  }
  if (!launched) {
    spdlog::warn("kernel pool: cannot start a '{}' kernel: {}", name, launched.error().describe());
  }
  return launched.ok();
}

void KernelRegistry::reap_dead_pooled() {
  std::vector<std::shared_ptr<ManagedKernel>> ready;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, kernels] : pool_) {
      ready.insert(ready.end(), kernels.begin(), kernels.end());
    }
  }
  for (const auto& k : ready) {
    std::string reason;
    {
      std::lock_guard lock(k->mu_);
      reason = death_reason_locked(*k);
    }
    if (reason.empty()) {
      continue;
    }
    bool mine = false;  // still pooled, not claimed meanwhile
    {
      std::lock_guard lock(mu_);
      auto& kernels = pool_[k->spec_.name];
      if (auto it = std::find(kernels.begin(), kernels.end(), k); it != kernels.end()) {
        kernels.erase(it);
        mine = true;
      }
    }
    if (mine) {
      spdlog::warn("kernel pool: pooled kernel {} ({}) died: {}; replacing it", k->id_,
                   k->spec_.name, reason);
      discard(k);
    }
  }
}

void KernelRegistry::pool_loop() {
  constexpr auto kFirstBackoff = std::chrono::seconds(1);
  constexpr auto kMaxBackoff = std::chrono::seconds(60);
  std::map<std::string, Clock::time_point> retry_at;
  std::map<std::string, Clock::duration> backoff;
  // Pool kernels forked from the zygote share its pages; cold ones would each hold their own.
  // So the first fill waits a while for the zygote's preload.
  if (zygote_) {
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    while (!zygote_->wait_ready(std::chrono::milliseconds(200))) {
      std::lock_guard lock(mu_);
      if (pool_stopping_) {
        return;
      }
      if (zygote_->failed() || Clock::now() >= give_up) {
        spdlog::warn("kernel pool: no zygote ready; filling the pool cold");
        break;
      }
    }
  }
  for (;;) {
    reap_dead_pooled();
    std::string name;
    {
      std::unique_lock lock(mu_);
      if (pool_stopping_) {
        return;
      }
      const auto now = Clock::now();
      if (kernels_.size() + pending_ + pool_total_locked() < options_.max_kernels) {
        for (const auto& n : pool_names_) {
          if (now >= retry_at[n] &&
              pool_[n].size() + pool_starting_[n] < static_cast<std::size_t>(options_.pool_size)) {
            name = n;
            ++pool_starting_[n];
            break;
          }
        }
      }
      if (name.empty()) {
        pool_cv_.wait_for(lock, std::chrono::milliseconds(250));
        continue;
      }
    }
    // One start at a time: a refill never competes with more than one client start for CPU.
    if (refill(name)) {
      backoff.erase(name);
      retry_at.erase(name);
    } else {
      auto& b = backoff[name];
      b = b == Clock::duration::zero() ? Clock::duration(kFirstBackoff)
                                       : std::min<Clock::duration>(b * 2, kMaxBackoff);
      retry_at[name] = Clock::now() + b;
      spdlog::warn("kernel pool: next '{}' start in {} s", name,
                   std::chrono::duration_cast<std::chrono::seconds>(b).count());
    }
  }
}

void KernelRegistry::stop_pool() {
  {
    std::lock_guard lock(mu_);
    pool_stopping_ = true;
  }
  pool_cv_.notify_all();
  if (pool_thread_.joinable() && pool_thread_.get_id() != std::this_thread::get_id()) {
    pool_thread_.join();  // waits for a start in flight
  }
  std::vector<std::shared_ptr<ManagedKernel>> ready;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, kernels] : pool_) {
      ready.insert(ready.end(), kernels.begin(), kernels.end());
    }
    pool_.clear();
  }
  for (const auto& k : ready) {
    discard(k);
  }
}

std::vector<kernel::KernelSpec> KernelRegistry::kernelspecs() const {
  std::vector<kernel::KernelSpec> out;
  std::set<std::string> seen;
  for (const auto& dir : kernel::kernelspec_dirs()) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (seen.count(name) != 0 || !fs::is_regular_file(entry.path() / "kernel.json", ec)) {
        continue;
      }
      if (auto spec = kernel::KernelSpec::load(entry.path().string(), name)) {
        seen.insert(name);
        out.push_back(std::move(spec).value());
      }
    }
  }
  if (seen.count("python3") == 0) {
    out.push_back(builtin_python3());
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

Result<kernel::KernelSpec> KernelRegistry::kernelspec(const std::string& name) const {
  auto found = kernel::find_kernelspec(name);
  if (!found && name == "python3" && found.error().code == ErrorCode::kNotFound) {
    return builtin_python3();
  }
  return found;
}

uid_t KernelRegistry::allocate_uid() {
  uid_t uid = kGatewayUidBase;
  while (uids_in_use_.count(uid) != 0) {
    ++uid;
  }
  uids_in_use_.insert(uid);
  return uid;
}

std::shared_ptr<ManagedKernel> KernelRegistry::new_kernel_locked(kernel::KernelSpec spec) {
  const std::string id = protocol::new_uuid();
  auto k = std::make_shared<ManagedKernel>(id, std::move(spec), state_dir_ + "/kernels/" + id);
  k->uid_ = allocate_uid();
  return k;
}

Result<void> KernelRegistry::start_fresh(const std::shared_ptr<ManagedKernel>& k) {
  CELLGATE_TRY(make_private_dir(k->home_ + "/work"));
  return start_process(k);
}

Result<KernelModel> KernelRegistry::start(const std::string& name, const json& env) {
  CELLGATE_ASSIGN_OR_RETURN(auto client_env, filter_env(env, options_.env_allowlist));
  const std::string spec_name = name.empty() ? default_kernel_ : name;
  if (is_pooled(spec_name)) {
    // A pooled kernel started with no client env: it can only stand in for a start without one.
    if (client_env.empty()) {
      if (auto k = claim_pooled(spec_name)) {
        spdlog::debug("kernel pool: hit ({}): kernel {}", spec_name, k->id_);
        return k->model();
      }
    }
    spdlog::debug("kernel pool: miss ({}): {}", spec_name,
                  client_env.empty() ? "none ready" : "the client sets env");
  }
  CELLGATE_ASSIGN_OR_RETURN(kernel::KernelSpec spec, kernelspec(spec_name));
  std::shared_ptr<ManagedKernel> k;
  std::vector<std::shared_ptr<ManagedKernel>> evicted;
  {
    std::lock_guard lock(mu_);
    // Pooled kernels count towards max_kernels, but never cost a client its kernel: ready ones
    // make room below.
    if (kernels_.size() + pending_ >= options_.max_kernels) {
      return make_error(ErrorCode::kResourceExhausted, "max_kernels",
                        "Resource Limit: at most " + std::to_string(options_.max_kernels) +
                            " kernels may run at once (--max-kernels)");
    }
    ++pending_;
    k = new_kernel_locked(std::move(spec));
    evicted = evict_pooled_locked();
  }
  for (const auto& e : evicted) {
    spdlog::debug("kernel pool: ending pooled kernel {} to make room (--max-kernels)", e->id_);
    discard(e);
  }
  k->env_ = std::move(client_env);
  auto launched = [&]() -> Result<void> {
    CELLGATE_TRY(start_fresh(k));
    return write_record(*k);
  }();
  {
    std::lock_guard lock(mu_);
    --pending_;
    if (launched) {
      kernels_[k->id_] = k;
    }
  }
  if (!launched) {
    discard(k);
    return std::move(launched).error();
  }
  spdlog::info("kernel {} started ({}), uid {}", k->id_, k->spec_.name, k->uid_);
  return k->model();
}

Result<void> KernelRegistry::launch(const std::shared_ptr<ManagedKernel>& k) {
  CELLGATE_TRY(start_process(k));
  return write_record(*k);
}

Result<void> KernelRegistry::start_process(const std::shared_ptr<ManagedKernel>& k) {
  kernel::LaunchRequest req;
  req.spec = k->spec_;
  req.runtime_parent = state_dir_ + "/run";
  req.work_dir = k->home_ + "/work";
  if (zygote_) {
    req.zygote_socket = zygote_->ready_socket();
  }
  req.env = kernel::default_kernel_env(req.work_dir, !options_.no_jail);
  for (const auto& [key, value] : k->env_) {
    req.env[key] = value;
  }
  if (!options_.no_jail) {
    jail::JailSpec spec = options_.jail;
    spec.uid = k->uid_;
    spec.gid = static_cast<gid_t>(k->uid_);
    spec.name = "k-" + k->id_;
    req.jail = std::move(spec);
  }
  CELLGATE_ASSIGN_OR_RETURN(auto process, kernel::KernelProcess::start(std::move(req)));

  std::weak_ptr<ManagedKernel> weak = k;
  kernel::ClientOptions co;
  co.on_iopub = [weak](Channel, const protocol::Message& msg) {
    if (auto self = weak.lock()) {
      self->on_iopub(msg);
    }
  };
  co.on_unrouted = [weak](Channel ch, const protocol::Message& msg) {
    if (auto self = weak.lock()) {
      self->on_unrouted(ch, msg);
    }
  };
  co.on_dead = [this](const std::string&) {
    monitor_cv_.notify_all();
    pool_cv_.notify_all();
  };
  co.on_wire_error = [id = k->id_](Channel ch, const Error& e) {
    spdlog::warn("kernel {}: dropped a message on {}: {}", id, kernel::to_string(ch),
                 e.describe());
  };
  co.heartbeat_interval = std::chrono::milliseconds(500);
  co.heartbeat_misses = 6;
  CELLGATE_ASSIGN_OR_RETURN(std::unique_ptr<kernel::KernelClient> client_unique,
                            kernel::KernelClient::connect(process->connection(), std::move(co)));
  std::shared_ptr<kernel::KernelClient> client = std::move(client_unique);
  auto ready = client->wait_ready(std::chrono::milliseconds(
      static_cast<long long>(options_.kernel_start_timeout * 1000)));
  if (!ready) {
    std::string why = ready.error().message;
    if (auto ended = process->poll_exit()) {
      why = std::string("the kernel exited while starting (") +
            launcher::to_string(ended->reason) + (ended->message.empty() ? "" : ": " + ended->message) +
            "); its log ends with: " + process->log_tail(800);
    }
    return make_error(ErrorCode::kInternal, "kernel_start_failed", why);
  }
  {
    std::lock_guard lock(k->mu_);
    k->process_ = std::move(process);
    k->client_ = std::move(client);
    k->execution_state_ = "idle";
    k->reason_.clear();
    k->touch();
  }
  return {};
}

Result<void> KernelRegistry::write_record(const ManagedKernel& k) {
  json record;
  {
    std::lock_guard lock(k.mu_);
    if (!k.process_) {
      return {};
    }
    record = {{"id", k.id_},
              {"kernelspec", k.spec_.name},
              {"connection", k.process_->connection().to_json()},
              {"connection_file", k.process_->connection_file()},
              {"pid", k.process_->pid()},
              {"pid_start_time", process_start_time(k.process_->pid())},
              {"jailed", k.process_->jailed()},
              {"uid", k.uid_},
              {"cgroup", "k-" + k.id_},
              {"work_dir", k.home_ + "/work"},
              {"limits", launcher::spec_to_json(options_.jail)},
              {"started_at", iso8601(std::chrono::system_clock::now())}};
  }
  return write_atomically(state_dir_ + "/kernels/" + k.id_ + ".json", record.dump(1));
}

Result<std::shared_ptr<ManagedKernel>> KernelRegistry::find(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = kernels_.find(id);
  if (it == kernels_.end()) {
    return make_error(ErrorCode::kNotFound, "no_such_kernel", "Kernel does not exist: " + id);
  }
  return it->second;
}

std::vector<KernelModel> KernelRegistry::list() const {
  std::vector<std::shared_ptr<ManagedKernel>> snapshot;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, k] : kernels_) {
      snapshot.push_back(k);
    }
  }
  std::vector<KernelModel> out;
  for (const auto& k : snapshot) {
    out.push_back(k->model());
  }
  return out;
}

Result<void> KernelRegistry::interrupt(const std::string& id) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  if (k->spec_.interrupt_mode == "message") {
    auto client = k->client();
    if (!client) {
      return make_error(ErrorCode::kUnavailable, "kernel_unavailable", "the kernel is restarting");
    }
    auto r = client->request(Channel::kControl, "interrupt_request", json::object(),
                             std::chrono::seconds(5), false);
    if (!r) {
      return std::move(r).error();
    }
    return {};
  }
  std::lock_guard lock(k->mu_);
  if (!k->process_) {
    return make_error(ErrorCode::kUnavailable, "kernel_unavailable", "the kernel is restarting");
  }
  return k->process_->signal(SIGINT);
}

Result<KernelModel> KernelRegistry::restart(const std::string& id) {
  CELLGATE_ASSIGN_OR_RETURN(auto k, find(id));
  {
    std::lock_guard lock(k->mu_);
    if (k->restarting_) {
      return make_error(ErrorCode::kFailedPrecondition, "restarting",
                        "the kernel is already restarting");
    }
    k->restarting_ = true;
    k->execution_state_ = "restarting";
  }
  k->stop_process();
  auto launched = launch(k);
  {
    std::lock_guard lock(k->mu_);
    k->restarting_ = false;
    if (!launched) {
      k->execution_state_ = "dead";
      k->reason_ = launched.error().message;
      return std::move(launched).error();
    }
    k->restarts_ = 0;
  }
  return k->model();
}

Result<void> KernelRegistry::shutdown(const std::string& id) {
  std::shared_ptr<ManagedKernel> k;
  {
    std::lock_guard lock(mu_);
    auto it = kernels_.find(id);
    if (it == kernels_.end()) {
      return make_error(ErrorCode::kNotFound, "no_such_kernel", "Kernel does not exist: " + id);
    }
    k = it->second;
    kernels_.erase(it);
  }
  std::shared_ptr<kernel::KernelClient> client;
  std::unique_ptr<kernel::KernelProcess> process;
  std::vector<std::shared_ptr<ChannelListener>> listeners;
  {
    std::lock_guard lock(k->mu_);
    k->gone_ = true;
    client = std::move(k->client_);
    process = std::move(k->process_);
    listeners = k->listeners_snapshot();
    k->attached_.clear();
    k->by_session_.clear();
  }
  if (client && client->is_alive()) {
    // A polite shutdown first, so the kernel can clean up; the cgroup is killed either way.
    (void)client->request(Channel::kControl, "shutdown_request", json{{"restart", false}},
                          std::chrono::seconds(2), false);
    if (process) {
      process->wait_exit(std::chrono::seconds(1));
    }
  }
  client.reset();
  process.reset();
  for (auto& l : listeners) {
    l->kernel_gone("the kernel was shut down");
  }
  ::umount2((k->home_ + "/work").c_str(), MNT_DETACH);
  std::error_code ec;
  fs::remove_all(k->home_, ec);
  fs::remove(state_dir_ + "/kernels/" + id + ".json", ec);
  {
    std::lock_guard lock(mu_);
    uids_in_use_.erase(k->uid_);
  }
  spdlog::info("kernel {} shut down", id);
  return {};
}

void KernelRegistry::shutdown_all() {
  stop_pool();
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, k] : kernels_) {
      ids.push_back(id);
    }
  }
  for (const auto& id : ids) {
    (void)shutdown(id);
  }
}

void KernelRegistry::handle_death(const std::shared_ptr<ManagedKernel>& k,
                                 const std::string& reason) {
  int restarts = 0;
  {
    std::lock_guard lock(k->mu_);
    if (k->gone_ || k->restarting_ || k->execution_state_ == "dead") {
      return;
    }
    restarts = ++k->restarts_;
    k->reason_ = reason;
    k->restarting_ = true;
    k->execution_state_ = restarts <= options_.restart_limit ? "restarting" : "dead";
  }
  spdlog::warn("kernel {} died: {}", k->id_, reason);
  if (restarts > options_.restart_limit) {
    {
      std::lock_guard lock(k->mu_);
      k->restarting_ = false;
    }
    k->publish_status("dead", reason);
    return;
  }
  k->publish_status("restarting", reason);
  k->stop_process();
  auto launched = launch(k);
  {
    std::lock_guard lock(k->mu_);
    k->restarting_ = false;
    if (!launched) {
      k->execution_state_ = "dead";
      k->reason_ = reason + "; the restart failed: " + launched.error().message;
    }
  }
  if (!launched) {
    spdlog::error("kernel {}: restart failed: {}", k->id_, launched.error().message);
    k->publish_status("dead", launched.error().message);
  } else {
    spdlog::info("kernel {} restarted after: {}", k->id_, reason);
  }
}

void KernelRegistry::monitor_loop() {
  auto next_cull = Clock::now();
  std::unique_lock lock(monitor_mu_);
  while (!stopping_) {
    monitor_cv_.wait_for(lock, std::chrono::milliseconds(250));
    if (stopping_) {
      break;
    }
    lock.unlock();
    if (zygote_) {
      zygote_->tick();
    }
    std::vector<std::shared_ptr<ManagedKernel>> snapshot;
    {
      std::lock_guard klock(mu_);
      for (const auto& [id, k] : kernels_) {
        snapshot.push_back(k);
      }
    }
    for (const auto& k : snapshot) {
      std::string reason;
      {
        std::lock_guard klock(k->mu_);
        if (k->gone_ || k->restarting_ || !k->process_) {
          continue;
        }
        reason = death_reason_locked(*k);
      }
      if (!reason.empty()) {
        handle_death(k, reason);
      }
    }
    if (options_.cull_idle_timeout > 0 && Clock::now() >= next_cull) {
      next_cull = Clock::now() + std::chrono::milliseconds(
                                     static_cast<long long>(options_.cull_interval * 1000));
      cull();
    }
    lock.lock();
  }
}

void KernelRegistry::cull() {
  const auto now = Clock::now();
  const auto idle_limit =
      std::chrono::milliseconds(static_cast<long long>(options_.cull_idle_timeout * 1000));
  std::vector<std::string> victims;
  for (const auto& model : list()) {
    auto k = find(model.id);
    if (!k) {
      continue;
    }
    std::lock_guard lock(k.value()->mu_);
    const bool idle_long = now - k.value()->last_activity_steady_ > idle_limit;
    const bool busy_ok = options_.cull_busy || model.execution_state != "busy";
    const bool conn_ok = options_.cull_connected || model.connections == 0;
    if ((idle_long && busy_ok && conn_ok) || model.execution_state == "dead") {
      victims.push_back(model.id);
    }
  }
  for (const auto& id : victims) {
    spdlog::info("culling kernel {} (idle)", id);
    (void)shutdown(id);
  }
}

}  // namespace cellgate::kernels
