#include "cellgate/kernels/managed_kernel.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <set>

#include "delivery_record.hpp"

namespace cellgate::kernels {
namespace {

using kernel::Channel;
using nlohmann::json;

// jupyter_server does not let these requests' status messages change execution_state.
const std::set<std::string, std::less<>> kUntracked = {"comm_info_request", "kernel_info_request",
                                                       "debug_request", "shutdown_request",
                                                       "interrupt_request"};

bool running_state(KernelState s) {
  return s == KernelState::kIdle || s == KernelState::kBusy;
}

Error unavailable(const std::string& what) {
  return make_error(ErrorCode::kUnavailable, "kernel_unavailable", what);
}

}  // namespace

const char* to_string(KernelState state) {
  switch (state) {
    case KernelState::kStarting:
      return "starting";
    case KernelState::kIdle:
      return "idle";
    case KernelState::kBusy:
      return "busy";
    case KernelState::kRestarting:
      return "restarting";
    case KernelState::kDead:
      return "dead";
    case KernelState::kGone:
      return "gone";
    case KernelState::kHibernated:
      return "hibernated";
  }
  return "?";
}

const char* execution_state(KernelState state) {
  if (state == KernelState::kHibernated) {
    return "idle";  // it answers as soon as it is touched; the model says `hibernated`
  }
  return state == KernelState::kGone ? "dead" : to_string(state);
}

json KernelModel::to_json() const {
  json j = {{"id", id},
            {"name", name},
            {"last_activity", last_activity},
            {"execution_state", execution_state},
            {"connections", connections}};
  if (!reason.empty()) {
    j["reason"] = reason;
  }
  if (hibernated) {
    j["hibernated"] = true;
  }
  return j;
}

ProcessFacts ProcessFacts::of(const kernel::KernelProcessHandle& process) {
  return ProcessFacts{process.pid(), process.jailed(), process.connection(),
                      process.connection_file(), process.adoption_facts()};
}

ManagedKernel::ManagedKernel(std::string id, kernel::KernelSpec spec, std::string home, uid_t uid,
                             std::map<std::string, std::string> env, Now now, std::string work_dir,
                             bool shared_files)
    : id_(std::move(id)),
      spec_(std::move(spec)),
      home_(std::move(home)),
      work_dir_(work_dir.empty() ? home_ + "/work" : std::move(work_dir)),
      shared_files_(shared_files),
      uid_(uid),
      env_(std::move(env)),
      now_(std::move(now)),
      delivery_(std::make_unique<DeliveryRecord>("")),
      last_activity_wall_(std::chrono::system_clock::now()),
      last_activity_(now_()) {}

ManagedKernel::~ManagedKernel() {
  Running running;
  {
    MutexLock lock(mu_);
    running = std::move(running_);
  }
  stop(std::move(running));
}

void ManagedKernel::stop(Running running) {
  // Outside the lock: the connection's I/O thread calls back into us, so it stops first (its
  // thread joined); then the process goes, which kills the kernel and its cgroup.
  running.connection.reset();
  running.process.reset();
}

// ---- reading ----------------------------------------------------------------------------------

KernelState ManagedKernel::state() const {
  MutexLock lock(mu_);
  return state_;
}

std::string ManagedKernel::reason() const {
  MutexLock lock(mu_);
  return reason_;
}

int ManagedKernel::restarts() const {
  MutexLock lock(mu_);
  return restarts_;
}

KernelModel ManagedKernel::model() const {
  MutexLock lock(mu_);
  KernelModel m;
  m.id = id_;
  m.name = spec_.name;
  m.last_activity = protocol::iso8601(last_activity_wall_);
  m.execution_state = execution_state(state_);
  m.reason = reason_;
  m.hibernated = state_ == KernelState::kHibernated;
  for (const auto& a : attached_) {
    if (!a.listener.expired()) {
      ++m.connections;
    }
  }
  return m;
}

util::Clock::time_point ManagedKernel::last_activity() const {
  MutexLock lock(mu_);
  return last_activity_;
}

void ManagedKernel::touch() {
  MutexLock lock(mu_);
  touch_locked();
}

void ManagedKernel::touch_locked() {
  last_activity_wall_ = std::chrono::system_clock::now();
  last_activity_ = now_();
}

std::shared_ptr<kernel::KernelConnection> ManagedKernel::connection() const {
  MutexLock lock(mu_);
  return running_.connection;
}

Result<jail::CgroupStats> ManagedKernel::cgroup_stats() const {
  MutexLock lock(mu_);
  if (!running_.process) {
    return make_error(ErrorCode::kUnavailable, "kernel_not_running", "the kernel is not running");
  }
  return running_.process->cgroup_stats();
}

Result<void> ManagedKernel::throttle_cpu(bool throttled) {
  MutexLock lock(mu_);
  if (!running_.process) {
    return make_error(ErrorCode::kUnavailable, "kernel_not_running", "the kernel is not running");
  }
  return running_.process->throttle_cpu(throttled);
}

std::optional<ProcessFacts> ManagedKernel::process_facts() const {
  MutexLock lock(mu_);
  if (!running_.process) {
    return std::nullopt;
  }
  return ProcessFacts::of(*running_.process);
}

Result<kernel::JailTarget> ManagedKernel::jail_target() const {
  MutexLock lock(mu_);
  if (!running_state(state_) || !running_.process) {
    return make_error(ErrorCode::kUnavailable, "kernel_not_running", "the kernel is not running");
  }
  return running_.process->jail_target();
}

std::string ManagedKernel::death_reason() const {
  MutexLock lock(mu_);
  if (!running_state(state_) || !running_.process) {
    return "";
  }
  if (auto ended = running_.process->poll_exit()) {
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
  if (running_.connection && !running_.connection->is_alive()) {
    // The connection's reason says how long and what its process did meanwhile.
    const std::string why = running_.connection->death_reason();
    return "the kernel stopped answering heartbeats" + (why.empty() ? "" : ": " + why);
  }
  return "";
}

Result<void> ManagedKernel::interrupt() {
  if (spec_.interrupt_mode == "message") {
    auto conn = connection();
    if (!conn) {
      return unavailable("the kernel is restarting");
    }
    auto r = conn->request(Channel::kControl, "interrupt_request", json::object(),
                           std::chrono::seconds(5), false);
    if (!r) {
      return std::move(r).error();
    }
    return {};
  }
  MutexLock lock(mu_);
  if (!running_.process) {
    return unavailable("the kernel is restarting");
  }
  return running_.process->signal(SIGINT);
}

// ---- listeners --------------------------------------------------------------------------------

std::vector<std::shared_ptr<ChannelListener>> ManagedKernel::listeners_locked() const {
  std::vector<std::shared_ptr<ChannelListener>> out;
  for (const auto& a : attached_) {
    if (auto l = a.listener.lock()) {
      out.push_back(std::move(l));
    }
  }
  return out;
}

bool ManagedKernel::attach(const std::shared_ptr<ChannelListener>& listener,
                           const std::string& session_id) {
  std::vector<std::shared_ptr<ChannelListener>> replaced;
  {
    MutexLock lock(mu_);
    if (state_ == KernelState::kGone) {
      return false;
    }
    if (!session_id.empty()) {
      // jupyter_server: a second connection with the same session id replaces the stale one.
      for (auto& a : attached_) {
        if (a.session_id == session_id) {
          if (auto old = a.listener.lock()) {
            replaced.push_back(std::move(old));
          }
          a.listener.reset();
        }
      }
      by_session_[session_id] = listener;
    }
    std::erase_if(attached_, [](const Attached& a) { return a.listener.expired(); });
    attached_.push_back({listener, session_id});
    touch_locked();
    // A client back with its session id gets what it missed first: delivered under the lock,
    // so nothing published meanwhile can overtake it (deliver() only queues).
    auto back = std::find_if(offline_.begin(), offline_.end(),
                             [&](const Offline& o) { return o.session_id == session_id; });
    if (!session_id.empty() && back != offline_.end()) {
      if (back->dropped > 0) {  // at the gap: before what was kept
        listener->deliver(lost_notice(back->dropped, /*exact=*/true,
                                      back->missed.empty() ? nullptr : back->missed.front()));
      }
      for (const auto& msg : back->missed) {
        listener->deliver(msg);
      }
      if (back->dropped > 0) {
        spdlog::warn(
            "kernel {}: session {} came back; {} messages it missed were over the {} "
            "MiB kept for absent clients and are lost",
            id_, session_id, back->dropped, kOfflineBudgetBytes >> 20);
      }
      offline_bytes_ -= back->bytes;
      offline_.erase(back);
    }
  }
  for (auto& old : replaced) {
    old->kernel_gone("replaced by a new connection with the same session_id");
  }
  return true;
}

void ManagedKernel::detach(const ChannelListener* listener) {
  MutexLock lock(mu_);
  Offline left;
  for (const auto& a : attached_) {
    auto l = a.listener.lock();
    if (l.get() == listener && !a.session_id.empty()) {
      left.session_id = a.session_id;
    }
  }
  std::erase_if(attached_, [&](const Attached& a) {
    auto l = a.listener.lock();
    return !l || l.get() == listener;
  });
  std::erase_if(by_session_, [&](const auto& entry) {
    auto l = entry.second.lock();
    const bool its = !l || l.get() == listener;
    if (its && l) {
      left.reply_sessions.push_back(entry.first);
    }
    return its;
  });
  const bool present = std::any_of(attached_.begin(), attached_.end(), [&](const Attached& a) {
    return a.session_id == left.session_id;  // replaced by a newer connection: nothing missed
  });
  if (left.session_id.empty() || present || state_ == KernelState::kGone) {
    return;
  }
  auto same = std::find_if(offline_.begin(), offline_.end(),
                           [&](const Offline& o) { return o.session_id == left.session_id; });
  if (same != offline_.end()) {
    same->reply_sessions = std::move(left.reply_sessions);
    return;
  }
  if (offline_.size() >= kMaxOfflineSessions) {  // the longest gone makes room
    offline_bytes_ -= offline_.front().bytes;
    offline_.erase(offline_.begin());
  }
  offline_.push_back(std::move(left));
}

void ManagedKernel::keep_for_offline_locked(const protocol::EnvelopePtr& msg,
                                            const std::string& reply_session) {
  for (auto& o : offline_) {
    const bool its = reply_session.empty() ||
                     std::find(o.reply_sessions.begin(), o.reply_sessions.end(), reply_session) !=
                         o.reply_sessions.end();
    if (its) {
      o.missed.push_back(msg);
      o.bytes += msg->size();
      offline_bytes_ += msg->size();
    }
  }
  trim_offline_locked();
}

void ManagedKernel::trim_offline_locked() {
  while (offline_bytes_ > kOfflineBudgetBytes) {
    auto largest =
        std::max_element(offline_.begin(), offline_.end(),
                         [](const Offline& a, const Offline& b) { return a.bytes < b.bytes; });
    if (largest == offline_.end() || largest->missed.empty()) {
      break;
    }
    const std::size_t size = largest->missed.front()->size();
    largest->missed.pop_front();
    largest->bytes -= size;
    offline_bytes_ -= size;
    ++largest->dropped;
  }
}

Result<bool> ManagedKernel::post(Channel channel, protocol::EnvelopePtr msg,
                                 const std::shared_ptr<ChannelListener>& sender) {
  std::shared_ptr<kernel::KernelConnection> conn;
  {
    MutexLock lock(mu_);
    const bool queue = state_ == KernelState::kHibernated;
    if (!queue && (state_ == KernelState::kGone || !running_.connection)) {
      return unavailable("kernel " + id_ + " is " + to_string(state_));
    }
    if (queue && queued_.size() >= kMaxQueuedWhileHibernated) {
      return unavailable("kernel " + id_ + " is resuming and has " +
                         std::to_string(queued_.size()) + " messages waiting already");
    }
    if (const std::string& session = msg->header().session; !session.empty() && sender) {
      by_session_[session] = sender;
    }
    touch_locked();
    if (queue) {
      queued_.push_back({channel, std::move(msg)});
      return true;
    }
    conn = running_.connection;
  }
  conn->post(channel, std::move(msg));
  return false;
}

void ManagedKernel::on_iopub(const protocol::EnvelopePtr& msg) {
  // Only status messages are parsed, and outside the lock.
  std::string status;
  if (msg->header().msg_type == "status" && kUntracked.count(msg->parent().msg_type) == 0) {
    status = msg->message().content.value("execution_state", "");
  }
  std::vector<std::shared_ptr<ChannelListener>> targets;
  {
    MutexLock lock(mu_);
    touch_locked();
    if (running_state(state_)) {
      if (status == "busy") {
        state_ = KernelState::kBusy;
      } else if (status == "idle") {
        state_ = KernelState::kIdle;
      }
    }
    targets = listeners_locked();
    keep_for_offline_locked(msg, "");
  }
  for (auto& l : targets) {
    l->deliver(msg);
  }
  if (msg->header().msg_type == "shutdown_reply") {
    {
      MutexLock lock(mu_);
      shutdown_published_ = true;
    }
    shutdown_published_cv_.notify_all();
  }
}

bool ManagedKernel::wait_shutdown_published(std::chrono::milliseconds timeout) {
  UniqueLock lock(mu_);
  return shutdown_published_cv_.wait_for(
      lock, timeout, [this]() CELLGATE_REQUIRES(mu_) { return shutdown_published_; });
}

void ManagedKernel::on_unrouted(const protocol::EnvelopePtr& msg) {
  std::shared_ptr<ChannelListener> target;
  {
    MutexLock lock(mu_);
    if (auto it = by_session_.find(msg->parent().session); it != by_session_.end()) {
      target = it->second.lock();
    }
    if (!target && !msg->parent().session.empty()) {
      keep_for_offline_locked(msg, msg->parent().session);
    }
  }
  if (target) {
    target->deliver(msg);
  }
}

void ManagedKernel::publish_status(const std::string& state, const std::string& reason) {
  static const protocol::Session gateway_session("cellgate");
  json content = {{"execution_state", state}};
  if (!reason.empty()) {
    content["reason"] = reason;  // cellgate's addition; clients read only execution_state
  }
  auto msg = protocol::Envelope::from_message(Channel::kIopub,
                                              gateway_session.make("status", std::move(content)));
  std::vector<std::shared_ptr<ChannelListener>> targets;
  {
    MutexLock lock(mu_);
    targets = listeners_locked();
    keep_for_offline_locked(msg, "");
  }
  for (auto& l : targets) {
    l->deliver(msg);
  }
}

// ---- transitions ------------------------------------------------------------------------------

Result<void> ManagedKernel::started(Running running, bool client_restart) {
  Running refused;  // stopped outside the lock
  {
    MutexLock lock(mu_);
    if (state_ == KernelState::kStarting || state_ == KernelState::kRestarting) {
      running_ = std::move(running);
      shutdown_published_ = false;  // a restart's shutdown_reply is not this process's
      state_ = KernelState::kIdle;
      reason_.clear();
      if (client_restart) {
        restarts_ = 0;
      }
      touch_locked();
      return {};
    }
    refused = std::move(running);
  }
  const KernelState now = state();
  stop(std::move(refused));
  return make_error(ErrorCode::kFailedPrecondition, "kernel_" + std::string(to_string(now)),
                    "kernel " + id_ + " is " + to_string(now));
}

Result<void> ManagedKernel::begin_restart() {
  MutexLock lock(mu_);
  switch (state_) {
    case KernelState::kIdle:
    case KernelState::kBusy:
    case KernelState::kDead:
    case KernelState::kHibernated:  // its image is the registry's to remove
      state_ = KernelState::kRestarting;
      queued_.clear();
      return {};
    case KernelState::kStarting:
    case KernelState::kRestarting:
      return make_error(ErrorCode::kFailedPrecondition, "restarting",
                        "the kernel is already restarting");
    case KernelState::kGone:
      return make_error(ErrorCode::kNotFound, "no_such_kernel", "Kernel does not exist: " + id_);
  }
  return {};
}

ManagedKernel::AfterDeath ManagedKernel::died(const std::string& reason, int restart_limit) {
  MutexLock lock(mu_);
  if (!running_state(state_)) {
    return AfterDeath::kIgnored;
  }
  reason_ = reason;
  if (++restarts_ <= restart_limit) {
    state_ = KernelState::kRestarting;
    return AfterDeath::kRestart;
  }
  state_ = KernelState::kDead;
  return AfterDeath::kDead;
}

void ManagedKernel::restart_failed(const std::string& reason) {
  MutexLock lock(mu_);
  if (state_ == KernelState::kStarting || state_ == KernelState::kRestarting) {
    state_ = KernelState::kDead;
    reason_ = reason;
  }
}

void ManagedKernel::stop_process() {
  Running running;
  {
    MutexLock lock(mu_);
    if (state_ != KernelState::kRestarting) {
      return;
    }
    running = std::move(running_);
  }
  stop(std::move(running));
}

ManagedKernel::Ended ManagedKernel::end() {
  MutexLock lock(mu_);
  if (state_ == KernelState::kGone) {
    return {};
  }
  state_ = KernelState::kGone;
  Ended ended{std::move(running_), listeners_locked()};
  attached_.clear();
  by_session_.clear();
  offline_.clear();
  offline_bytes_ = 0;
  return ended;
}

// ---- hibernation ------------------------------------------------------------------------------

Result<ManagedKernel::Running> ManagedKernel::begin_hibernate() {
  MutexLock lock(mu_);
  if (state_ == KernelState::kGone) {
    return make_error(ErrorCode::kNotFound, "no_such_kernel", "Kernel does not exist: " + id_);
  }
  if (state_ == KernelState::kHibernated) {
    return make_error(ErrorCode::kFailedPrecondition, "hibernated",
                      "kernel " + id_ + " is hibernated already");
  }
  if (state_ != KernelState::kIdle || !running_.process || !running_.connection) {
    // An open input_request is a cell still running: busy.
    return make_error(ErrorCode::kFailedPrecondition, "kernel_busy",
                      "kernel " + id_ + " is " + to_string(state_) +
                          ": only an idle kernel (no cell running, no input_request open) can "
                          "hibernate");
  }
  state_ = KernelState::kHibernated;
  resume_claimed_ = false;
  return std::move(running_);
}

void ManagedKernel::hibernated(std::unique_ptr<kernel::KernelProcessHandle> process) {
  {
    MutexLock lock(mu_);
    if (state_ == KernelState::kHibernated) {
      running_.process = std::move(process);
      return;
    }
  }
  process.reset();  // gone meanwhile: its runtime dir goes with it
}

Result<void> ManagedKernel::adopted_hibernated(
    std::unique_ptr<kernel::KernelProcessHandle> process) {
  {
    MutexLock lock(mu_);
    if (state_ == KernelState::kStarting) {
      running_.process = std::move(process);
      state_ = KernelState::kHibernated;
      resume_claimed_ = false;
      return {};
    }
  }
  process.reset();
  return make_error(ErrorCode::kFailedPrecondition, "kernel_" + std::string(to_string(state())),
                    "kernel " + id_ + " is " + to_string(state()));
}

std::unique_ptr<kernel::KernelProcessHandle> ManagedKernel::take_hibernated() {
  MutexLock lock(mu_);
  if (state_ != KernelState::kHibernated) {
    return nullptr;
  }
  return std::move(running_.process);
}

Result<void> ManagedKernel::resumed(Running running) {
  {
    MutexLock lock(mu_);
    if (state_ == KernelState::kHibernated) {
      running_ = std::move(running);
      state_ = KernelState::kIdle;
      reason_.clear();
      touch_locked();
      // Under the lock, so that a message posted now cannot overtake the queued ones; post()
      // only queues for the connection's I/O thread.
      for (auto& q : queued_) {
        running_.connection->post(q.channel, std::move(q.msg));
      }
      queued_.clear();
      return {};
    }
  }
  const KernelState now = state();
  stop(std::move(running));
  return make_error(ErrorCode::kFailedPrecondition, "kernel_" + std::string(to_string(now)),
                    "kernel " + id_ + " is " + to_string(now));
}

bool ManagedKernel::claim_resume() {
  MutexLock lock(mu_);
  if (state_ != KernelState::kHibernated || resume_claimed_) {
    return false;
  }
  resume_claimed_ = true;
  return true;
}

void ManagedKernel::resume_failed(const std::string& reason) {
  MutexLock lock(mu_);
  if (state_ == KernelState::kHibernated) {
    state_ = KernelState::kDead;
    reason_ = reason;
    queued_.clear();
  }
}

protocol::EnvelopePtr lost_notice(std::uint64_t count, bool exact,
                                  const protocol::EnvelopePtr& next) {
  static const protocol::Session gateway_session("cellgate");
  const std::string n = std::to_string(count);
  json content = {
      {"name", "stderr"},
      {"text", "[cellgate] " + std::string(exact ? "" : "up to ") + n +
                   " output message(s) before this point were lost: over what the gateway and "
                   "the kernel's launcher keep for an absent client (8 MiB each)\n"}};
  protocol::Message msg = gateway_session.make("stream", std::move(content));
  msg.metadata = {{"cellgate", {{"lost_messages", count}, {"lost_exact", exact}}}};
  if (next) {
    // In the output of the cell whose messages follow it.
    msg.parent_header = json::parse(next->frames().parent_header, nullptr, false);
    if (!msg.parent_header.is_object()) {
      msg.parent_header = json::object();
    }
  }
  return protocol::Envelope::from_message(Channel::kIopub, std::move(msg));
}

void ManagedKernel::record_deliveries_in(std::string path) {
  delivery_ = std::make_unique<DeliveryRecord>(std::move(path));
}

void ManagedKernel::delivered(const std::string& session_id, const protocol::Envelope& msg) {
  // Only what the launcher's spool also has (a kernel's iopub) marks a place in it.
  if (msg.channel() == Channel::kIopub && msg.from_kernel() && !session_id.empty()) {
    delivery_->delivered(session_id, msg.header().msg_id);
  }
}

std::map<std::string, std::string> ManagedKernel::expect_absent_sessions() {
  auto record = delivery_->read();
  std::vector<std::pair<std::string, DeliveryRecord::Last>> recent(record.begin(), record.end());
  std::sort(recent.begin(), recent.end(),
            [](const auto& a, const auto& b) { return a.second.generation > b.second.generation; });
  if (recent.size() > kMaxOfflineSessions) {
    recent.resize(kMaxOfflineSessions);
  }
  std::map<std::string, std::string> out;
  MutexLock lock(mu_);
  for (const auto& entry : recent) {
    const std::string& session = entry.first;
    const bool known = std::any_of(offline_.begin(), offline_.end(),
                                   [&](const Offline& o) { return o.session_id == session; });
    if (!known && offline_.size() < kMaxOfflineSessions) {
      Offline o;
      o.session_id = session;
      offline_.push_back(std::move(o));
    }
    out[session] = entry.second.msg_id;
  }
  return out;
}

void ManagedKernel::add_spooled(const std::string& session_id,
                                const std::vector<protocol::EnvelopePtr>& spooled,
                                const protocol::EnvelopePtr& notice) {
  MutexLock lock(mu_);
  auto o = std::find_if(offline_.begin(), offline_.end(),
                        [&](const Offline& x) { return x.session_id == session_id; });
  if (o == offline_.end()) {
    return;
  }
  // The spool was read after this gateway subscribed: its tail may be what came live already.
  std::size_t cut = spooled.size();
  auto first_live = std::find_if(o->missed.begin(), o->missed.end(),
                                 [](const protocol::EnvelopePtr& m) { return m->from_kernel(); });
  if (first_live != o->missed.end()) {
    for (std::size_t i = 0; i < spooled.size(); ++i) {
      if (spooled[i]->header().msg_id == (*first_live)->header().msg_id) {
        cut = i;
        break;
      }
    }
  }
  std::deque<protocol::EnvelopePtr> merged;
  if (notice) {
    merged.push_back(notice);
  }
  merged.insert(merged.end(), spooled.begin(), spooled.begin() + static_cast<std::ptrdiff_t>(cut));
  std::size_t added = 0;
  for (const auto& m : merged) {
    added += m->size();
  }
  merged.insert(merged.end(), o->missed.begin(), o->missed.end());
  o->missed = std::move(merged);
  o->bytes += added;
  offline_bytes_ += added;
  trim_offline_locked();
}

}  // namespace cellgate::kernels
