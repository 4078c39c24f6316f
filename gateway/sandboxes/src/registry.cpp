// SandboxRegistry's lifecycle: create, kill, pause, connect, timeouts and their timers, records.
// Snapshots, fork and metrics are in snapshots.cpp.
#include "cellgate/sandboxes/registry.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <thread>

#include "cellgate/api/e2b.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/util/fs.hpp"

namespace cellgate::sandboxes {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::size_t kMaxRecordBytes = 1u << 20;

Error not_found(const std::string& id) {
  return make_error(ErrorCode::kNotFound, "no_sandbox",
                    "sandbox " + id.substr(0, 64) + " not found");
}

std::string lower(std::string s) {
  for (auto& ch : s) {
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  return s;
}

SystemTime now() {
  return std::chrono::system_clock::now();
}

}  // namespace

template <typename T>
Result<T> SandboxRegistry::when_idle(const std::function<Result<T>()>& checkpoint) const {
  const auto deadline = std::chrono::steady_clock::now() + options_.idle_wait;
  for (;;) {
    auto done = checkpoint();
    if (done || done.error().reason != "kernel_busy" ||
        std::chrono::steady_clock::now() >= deadline) {
      return done;
    }
    // The cell's reply came before its kernel said idle: a moment later it is.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}
template Result<kernels::KernelModel> SandboxRegistry::when_idle(
    const std::function<Result<kernels::KernelModel>()>&) const;
template Result<kernels::SnapshotModel> SandboxRegistry::when_idle(
    const std::function<Result<kernels::SnapshotModel>()>&) const;
template Result<std::vector<kernels::KernelModel>> SandboxRegistry::when_idle(
    const std::function<Result<std::vector<kernels::KernelModel>>()>&) const;

SandboxRegistry::SandboxRegistry(kernels::KernelRegistry& kernels, execute::Executor& executor,
                                 util::Loop& loop, util::Offload offload, SandboxOptions options)
    : kernels_(kernels),
      executor_(executor),
      strand_(loop.strand()),
      offload_(std::move(offload)),
      options_(std::move(options)),
      events_(std::make_unique<EventLog>(EventLogOptions{
          .file = options_.state_dir.empty() ? ""
                                             : options_.state_dir + "/sandboxes/events.ndjson"})) {}

SandboxRegistry::~SandboxRegistry() {
  MutexLock lock(mu_);
  stopping_ = true;
  for (auto& [id, entry] : entries_) {
    if (entry.timer) {
      entry.timer->cancel();
    }
  }
  if (sampler_) {
    sampler_->cancel();
  }
}

void SandboxRegistry::on_ended(std::function<void(const std::string&)> fn) {
  on_ended_ = std::move(fn);
}

std::string SandboxRegistry::records_dir() const {
  return options_.state_dir.empty() ? "" : options_.state_dir + "/sandboxes";
}

void SandboxRegistry::start() {
  const std::string dir = records_dir();
  if (!dir.empty()) {
    if (auto made = make_private_dirs(dir, "sandboxes"); !made) {
      spdlog::warn("sandboxes: {}; sandboxes are kept in memory only", made.error().message);
    } else {
      std::error_code ec;
      MutexLock lock(mu_);
      for (const auto& file : fs::directory_iterator(dir, ec)) {
        const std::string path = file.path().string();
        const std::string name = file.path().filename().string();
        if (name == "snapshots.json") {
          auto text = sys::read_file(path, kMaxRecordBytes, "sandboxes");
          json list = text ? json::parse(*text, nullptr, false) : json();
          std::set<std::string> live;
          for (const auto& snap : kernels_.snapshots()) {
            live.insert(snap.id);
          }
          if (list.is_array()) {
            for (const auto& r : list) {
              if (!r.is_object() || !r.contains("id") || !r["id"].is_string() ||
                  live.count(r["id"].get<std::string>()) == 0) {
                continue;
              }
              SnapshotRecord s;
              s.id = r["id"].get<std::string>();
              s.tenant = r.value("tenant", "");
              s.sandbox_id = r.value("sandbox_id", "");
              s.names = r.value("names", std::vector<std::string>{});
              s.seq = ++seq_;
              snapshots_[s.id] = s;
            }
          }
          continue;
        }
        if (!name.ends_with(".json")) {
          continue;
        }
        auto text = sys::read_file(path, kMaxRecordBytes, "sandboxes");
        json record = text ? json::parse(*text, nullptr, false) : json();
        auto s =
            record.is_object() ? Sandbox::from_record(record) : Result<Sandbox>(not_found(name));
        std::shared_ptr<kernels::ManagedKernel> kernel;
        if (s) {
          if (auto k = kernels_.find(s->kernel_id)) {
            kernel = *k;
          }
        }
        if (!s || !kernel || name != s->id + ".json") {
          spdlog::info("sandboxes: {} names no kernel of this gateway; removed", name);
          fs::remove(path, ec);
          continue;
        }
        s->state = kernel->model().hibernated ? State::kPaused : State::kRunning;
        seq_ = std::max(seq_, s->seq);
        Entry& entry = entries_[s->id];
        entry.sandbox = *s;
        note_owner(*s);
        arm_locked(entry);
        spdlog::info("sandboxes: {} kept (kernel {}, {})", s->id, s->kernel_id,
                     to_string(s->state));
      }
    }
  }
  schedule_sampler();
}

std::optional<SandboxTarget> SandboxRegistry::find(std::string_view sandbox_id) const {
  MutexLock lock(mu_);
  auto it = entries_.find(std::string(sandbox_id));
  if (it == entries_.end()) {
    return std::nullopt;
  }
  const Sandbox& s = it->second.sandbox;
  auto kernel = kernels_.find(s.kernel_id);
  if (!kernel) {
    return std::nullopt;
  }
  return SandboxTarget{s.id, s.kernel_id, s.envd_access_token, s.tenant,
                       !(*kernel)->model().hibernated};
}

std::vector<SandboxTarget> SandboxRegistry::list() const {
  std::vector<std::string> ids;
  {
    MutexLock lock(mu_);
    for (const auto& [id, entry] : entries_) {
      ids.push_back(id);
    }
  }
  std::vector<SandboxTarget> out;
  for (const auto& id : ids) {
    if (auto t = find(id)) {
      out.push_back(std::move(*t));
    }
  }
  return out;
}

Result<Sandbox> SandboxRegistry::visible_locked(const Caller& caller, const std::string& id) const {
  auto it = entries_.find(id);
  if (it == entries_.end() || !caller.can_see(it->second.sandbox.tenant)) {
    return not_found(id);
  }
  Sandbox s = it->second.sandbox;
  auto kernel = kernels_.find(s.kernel_id);
  if (!kernel) {
    return not_found(id);  // its kernel ended elsewhere; the sampler drops the record
  }
  s.state = (*kernel)->model().hibernated ? State::kPaused : State::kRunning;
  return s;
}

Result<Sandbox> SandboxRegistry::get(const Caller& caller, const std::string& id) const {
  MutexLock lock(mu_);
  return visible_locked(caller, id);
}

std::vector<Sandbox> SandboxRegistry::visible(const Caller& caller) const {
  MutexLock lock(mu_);
  std::vector<Sandbox> out;
  for (const auto& [id, entry] : entries_) {
    if (auto s = visible_locked(caller, id)) {
      out.push_back(std::move(*s));
    }
  }
  return out;
}

Result<void> SandboxRegistry::within_budget(const Caller& caller, std::uint64_t disk_bytes) const {
  if (caller.sees_all) {
    return ok_result();
  }
  if (options_.cpu_budget != nullptr) {
    if (auto why = options_.cpu_budget->refusal(caller.tenant, std::chrono::system_clock::now())) {
      return make_error(ErrorCode::kResourceExhausted, "tenant_cpu_budget", *why);
    }
  }
  if (options_.disk_limit != nullptr && disk_bytes > 0) {
    CELLGATE_TRY(options_.disk_limit->room(caller.tenant, disk_bytes));
  }
  return ok_result();
}

std::uint64_t SandboxRegistry::work_dir_bytes() const {
  return static_cast<std::uint64_t>(std::max(0, options_.shape.disk_mb)) << 20;
}

Result<void> SandboxRegistry::admit(const Caller& caller) const {
  CELLGATE_TRY(within_budget(caller, work_dir_bytes()));
  if (options_.max_per_tenant == 0 || caller.sees_all) {
    return ok_result();
  }
  MutexLock lock(mu_);
  const auto mine = std::count_if(entries_.begin(), entries_.end(), [&](const auto& e) {
    return e.second.sandbox.tenant == caller.tenant;
  });
  if (static_cast<std::size_t>(mine) >= options_.max_per_tenant) {
    return make_error(ErrorCode::kResourceExhausted, "tenant_limit",
                      "you have reached the maximum number of concurrent sandboxes (" +
                          std::to_string(options_.max_per_tenant) + "); kill one first");
  }
  return ok_result();
}

std::string SandboxRegistry::resolve_template(const Caller& caller, const std::string& template_id,
                                              std::string& snapshot_id) const {
  {
    MutexLock lock(mu_);
    for (const auto& [id, snap] : snapshots_) {
      if (!caller.can_see(snap.tenant)) {
        continue;
      }
      if (id == template_id ||
          std::find(snap.names.begin(), snap.names.end(), template_id) != snap.names.end()) {
        snapshot_id = id;
        return "";
      }
    }
  }
  if (template_id == kBaseTemplate || template_id == kCodeInterpreterTemplate) {
    return kernels_.default_kernel_name();
  }
  if (kernels_.kernelspec(template_id)) {
    return template_id;
  }
  return "";
}

Result<Sandbox> SandboxRegistry::create(const Caller& caller, const CreateRequest& request) {
  CELLGATE_TRY(admit(caller));
  if (request.auto_pause && !kernels_.options().checkpoints_unavailable.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "checkpoints_unavailable",
                      "onTimeout 'pause' needs checkpoints, which this gateway cannot take: " +
                          kernels_.options().checkpoints_unavailable);
  }
  std::string snapshot_id;
  const std::string spec = resolve_template(caller, request.template_id, snapshot_id);
  if (spec.empty() && snapshot_id.empty()) {
    return make_error(ErrorCode::kNotFound, "no_template",
                      "template '" + request.template_id.substr(0, 128) +
                          "' not found: use 'base', a kernelspec name or a snapshot id");
  }
  if (!snapshot_id.empty()) {
    CELLGATE_ASSIGN_OR_RETURN(auto model,
                              kernels_.start_from_snapshot(snapshot_id, "", json::object()));
    return adopt_kernel(caller, model.id, request.template_id, model.name, request, false);
  }
  CELLGATE_ASSIGN_OR_RETURN(auto model, kernels_.start(spec, json::object()));
  return adopt_kernel(caller, model.id, request.template_id, spec, request, true);
}

Result<Sandbox> SandboxRegistry::adopt_kernel(const Caller& caller, const std::string& kernel_id,
                                              const std::string& template_id,
                                              const std::string& alias,
                                              const CreateRequest& request, bool set_up) {
  auto kernel = kernels_.find(kernel_id);
  const std::string language = kernel ? lower((*kernel)->spec().language) : "";
  std::string setup;
  if (set_up) {
    if (auto code = api::e2b::context_setup_code(language, std::string(api::e2b::kDefaultCwd))) {
      setup = *code + "\n";
    }
  }
  if (!request.env_vars.empty()) {
    if (language != api::e2b::kLanguage) {
      (void)kernels_.shutdown(kernel_id);
      return make_error(ErrorCode::kInvalidArgument, "bad_envVars",
                        "envVars are supported in python sandboxes only, not " + language);
    }
    setup += api::e2b::env_code(request.env_vars);
  }
  if (!setup.empty()) {
    if (auto ran = executor_.run_silently_and_wait(kernel_id, setup, options_.setup_timeout);
        !ran) {
      (void)kernels_.shutdown(kernel_id);
      return make_error(ErrorCode::kInternal, "setup_failed",
                        "the sandbox's kernel could not be set up: " + ran.error().message);
    }
  }
  Sandbox s;
  s.id = kernel::random_hex(10);
  s.template_id = template_id;
  s.alias = alias == template_id ? "" : alias;
  s.tenant = caller.sees_all ? "" : caller.tenant;
  s.kernel_id = kernel_id;
  if (request.secure) {
    s.envd_access_token = kernel::random_hex(16);
    s.traffic_access_token = kernel::random_hex(16);
  }
  s.metadata = request.metadata;
  s.env_vars = request.env_vars;
  s.started_at = now();
  s.end_at = s.started_at + std::chrono::seconds(request.timeout_seconds);
  s.on_timeout = request.auto_pause ? OnTimeout::kPause : OnTimeout::kKill;
  s.auto_resume = request.auto_resume;
  MutexLock lock(mu_);
  s.seq = ++seq_;
  Entry& entry = entries_[s.id];
  entry.sandbox = s;
  note_owner(s);
  save_locked(s);
  arm_locked(entry);
  spdlog::info("sandbox {} created (kernel {}, template {}, tenant {})", s.id, kernel_id,
               template_id, s.tenant.empty() ? "-" : s.tenant);
  emit("created", s);
  return s;
}

void SandboxRegistry::note_owner(const Sandbox& s) const {
  if (options_.owners != nullptr && !s.tenant.empty()) {
    options_.owners->set(s.kernel_id, s.tenant,
                         [this](const std::string& id) { return bool(kernels_.find(id)); });
  }
}

void SandboxRegistry::emit(std::string_view label, const Sandbox& s) const {
  nlohmann::json event = Webhooks::event(label, s);
  if (options_.webhooks != nullptr) {
    options_.webhooks->send(event);
  }
  events_->add(s.tenant, std::move(event));
}

void SandboxRegistry::arm_locked(Entry& entry) {
  if (entry.timer) {
    entry.timer->cancel();
    entry.timer.reset();
  }
  if (stopping_ || entry.sandbox.state == State::kPaused) {
    return;  // a paused sandbox's time stands still, as on E2B
  }
  const auto left = entry.sandbox.end_at - now();
  const auto when =
      util::Clock::now() + std::chrono::duration_cast<util::Clock::duration>(
                               std::max<std::chrono::system_clock::duration>(left, {}));
  entry.timer =
      strand_->at(when, [this, id = entry.sandbox.id] { offload_([this, id] { expire(id); }); });
}

Error SandboxRegistry::checkpoint_refused(Error e, const std::string& id, std::string_view doing) {
  e.message = "sandbox " + id + " cannot be " + std::string(doing) + ": " + e.message;
  if (e.reason != "checkpoints_unavailable" && e.code == ErrorCode::kFailedPrecondition) {
    e.code = ErrorCode::kInvalidArgument;  // 409 would tell the SDK "paused already"
  }
  return e;
}

void SandboxRegistry::mark_paused(const std::string& id) {
  MutexLock lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    it->second.sandbox.state = State::kPaused;
    save_locked(it->second.sandbox);
    arm_locked(it->second);
    emit("paused", it->second.sandbox);
  }
}

void SandboxRegistry::expire(const std::string& id) {
  OnTimeout action = OnTimeout::kKill;
  std::string kernel_id;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || stopping_) {
      return;
    }
    Entry& entry = it->second;
    if (entry.sandbox.end_at > now() + std::chrono::milliseconds(50)) {
      arm_locked(entry);  // extended meanwhile
      return;
    }
    action = entry.sandbox.on_timeout;
    kernel_id = entry.sandbox.kernel_id;
  }
  if (action == OnTimeout::kPause) {
    auto paused = when_idle<kernels::KernelModel>([&] { return kernels_.hibernate(kernel_id); });
    if (paused || paused.error().reason == "hibernated") {
      mark_paused(id);
      spdlog::info("sandbox {}: its timeout passed; paused", id);
      return;
    }
    spdlog::warn("sandbox {}: its timeout passed and it cannot pause ({}); killed instead", id,
                 paused.error().message);
  } else {
    spdlog::info("sandbox {}: its timeout passed; killed", id);
  }
  end(id, true);
}

void SandboxRegistry::end(const std::string& id, bool kill_kernel) {
  std::string kernel_id;
  Sandbox ended;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      return;
    }
    if (it->second.timer) {
      it->second.timer->cancel();
    }
    ended = it->second.sandbox;
    kernel_id = it->second.sandbox.kernel_id;
    entries_.erase(it);
    if (const std::string dir = records_dir(); !dir.empty()) {
      std::error_code ec;
      fs::remove(dir + "/" + id + ".json", ec);
    }
  }
  if (kill_kernel) {
    if (auto down = kernels_.shutdown(kernel_id);
        !down && down.error().code != ErrorCode::kNotFound) {
      spdlog::warn("sandbox {}: its kernel {}: {}", id, kernel_id, down.error().message);
    }
  }
  emit("killed", ended);
  if (on_ended_) {
    on_ended_(id);
  }
}

Result<void> SandboxRegistry::kill(const Caller& caller, const std::string& id) {
  {
    MutexLock lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || !caller.can_see(it->second.sandbox.tenant)) {
      return not_found(id);
    }
  }
  end(id, true);
  spdlog::info("sandbox {} killed", id);
  return ok_result();
}

Result<bool> SandboxRegistry::pause(const Caller& caller, const std::string& id) {
  std::string kernel_id;
  {
    MutexLock lock(mu_);
    CELLGATE_ASSIGN_OR_RETURN(auto s, visible_locked(caller, id));
    if (s.state == State::kPaused) {
      return false;
    }
    kernel_id = s.kernel_id;
  }
  auto paused = when_idle<kernels::KernelModel>([&] { return kernels_.hibernate(kernel_id); });
  if (!paused) {
    if (paused.error().reason == "hibernated") {
      return false;
    }
    return checkpoint_refused(paused.error(), id, "paused");
  }
  mark_paused(id);
  spdlog::info("sandbox {} paused", id);
  return true;
}

Result<SandboxRegistry::Connected> SandboxRegistry::connect(const Caller& caller,
                                                            const std::string& id,
                                                            int timeout_seconds) {
  Connected out;
  {
    MutexLock lock(mu_);
    CELLGATE_ASSIGN_OR_RETURN(out.sandbox, visible_locked(caller, id));
  }
  if (out.sandbox.state == State::kPaused) {
    CELLGATE_TRY(within_budget(caller));
    CELLGATE_TRY(kernels_.resume(out.sandbox.kernel_id));
    out.resumed = true;
    spdlog::info("sandbox {} resumed", id);
  }
  MutexLock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    return not_found(id);
  }
  Sandbox& s = it->second.sandbox;
  s.state = State::kRunning;
  s.end_at = std::max(s.end_at, now() + std::chrono::seconds(timeout_seconds));
  save_locked(s);
  arm_locked(it->second);
  out.sandbox = s;
  if (out.resumed) {
    emit("resumed", s);
  }
  return out;
}

Result<void> SandboxRegistry::set_timeout(const Caller& caller, const std::string& id,
                                          int timeout_seconds) {
  MutexLock lock(mu_);
  CELLGATE_ASSIGN_OR_RETURN(auto visible, visible_locked(caller, id));
  Entry& entry = entries_.at(id);
  entry.sandbox.state = visible.state;
  entry.sandbox.end_at = now() + std::chrono::seconds(timeout_seconds);
  save_locked(entry.sandbox);
  arm_locked(entry);
  return ok_result();
}

void SandboxRegistry::save_locked(const Sandbox& s) const {
  const std::string dir = records_dir();
  if (dir.empty()) {
    return;
  }
  if (auto made = make_private_dirs(dir, "sandboxes"); !made) {
    spdlog::warn("sandbox {}: {}", s.id, made.error().message);
    return;
  }
  if (auto saved = atomic_write(dir + "/" + s.id + ".json", s.to_record().dump()); !saved) {
    spdlog::warn("sandbox {}: its record: {}", s.id, saved.error().message);
  }
}

void SandboxRegistry::save_snapshots_locked() const {
  const std::string dir = records_dir();
  if (dir.empty()) {
    return;
  }
  json list = json::array();
  for (const auto& [id, s] : snapshots_) {
    list.push_back(
        {{"id", s.id}, {"tenant", s.tenant}, {"sandbox_id", s.sandbox_id}, {"names", s.names}});
  }
  if (auto made = make_private_dirs(dir, "sandboxes"); !made) {
    return;
  }
  if (auto saved = atomic_write(dir + "/snapshots.json", list.dump()); !saved) {
    spdlog::warn("sandboxes: the snapshots' owners: {}", saved.error().message);
  }
}

Result<json> SandboxRegistry::template_alias(const Caller& caller, const std::string& alias) const {
  std::string snapshot_id;
  const std::string spec = resolve_template(caller, alias, snapshot_id);
  if (spec.empty() && snapshot_id.empty()) {
    return make_error(ErrorCode::kNotFound, "no_template",
                      "template alias '" + alias.substr(0, 128) + "' not found");
  }
  return json{{"templateID", snapshot_id.empty() ? alias : snapshot_id},
              {"public", snapshot_id.empty()}};
}

}  // namespace cellgate::sandboxes
