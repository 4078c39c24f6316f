// The privileged broker and the gateway's BrokerBackend (broker.hpp).
#include "cellgate/kernels/broker.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/launcher/status.hpp"
#include "cleanup.hpp"
#include "kernel_jail.hpp"
#include "kernelspecs.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;

// Connection-dir files (the display formatters' module) make the largest requests.
constexpr std::size_t kMaxMessage = 4u << 20;
constexpr std::size_t kMaxEnvBytes = 1u << 20;
constexpr std::size_t kMaxInflight = 256;  // requests being handled at once
constexpr milliseconds kExitPoll{50};

Result<void> send_json(int fd, const json& j) {
  const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxMessage) {
    return make_error(ErrorCode::kInvalidArgument, "broker_message",
                      "a broker message of " + std::to_string(text.size()) + " bytes (at most " +
                          std::to_string(kMaxMessage) + ")");
  }
  ssize_t n;
  do {
    n = ::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(text.size())) {
    return errno_error(ErrorCode::kUnavailable, "broker_gone", "send(broker channel)", errno);
  }
  return {};
}

// The next message: nullopt at the end of the channel; a discarded json when it is not JSON
// or too large.
std::optional<json> recv_json(int fd, std::string& buffer) {
  buffer.resize(kMaxMessage + 1);
  ssize_t n;
  do {
    n = ::recv(fd, buffer.data(), buffer.size(), MSG_TRUNC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    return std::nullopt;
  }
  if (static_cast<std::size_t>(n) > kMaxMessage) {
    return json(json::value_t::discarded);
  }
  return json::parse(std::string_view(buffer.data(), static_cast<std::size_t>(n)), nullptr, false);
}

json error_json(const Error& e) {
  return {{"ok", false}, {"code", static_cast<int>(e.code)}, {"reason", e.reason},
          {"message", e.message}};
}

Error error_from_json(const json& j) {
  const int code = j.value("code", static_cast<int>(ErrorCode::kInternal));
  return make_error(static_cast<ErrorCode>(code), j.value("reason", "broker"),
                    j.value("message", "the broker refused"));
}

Error refused(const std::string& message) {
  return make_error(ErrorCode::kInvalidArgument, "broker_refused", message);
}

// A connection-dir file's name: one path component, with dots ("cellgate_display.py").
bool plain_file_name(const std::string& s, std::size_t max) {
  if (s.empty() || s.size() > max || s == "." || s == "..") {
    return false;
  }
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) {
      return false;
    }
  }
  return true;
}

// Fields of a request besides id and op; anything else is refused, so that no field the
// gateway adds (a "jail", a "network") is silently dropped or taken.
Result<void> only_fields(const json& req, std::initializer_list<const char*> allowed) {
  for (const auto& [key, value] : req.items()) {
    if (key == "id" || key == "op") {
      continue;
    }
    bool known = false;
    for (const char* a : allowed) {
      known = known || key == a;
    }
    if (!known) {
      return refused("unknown field '" + key + "': a request names a kernelspec, a kernel id, "
                     "a uid, the environment and connection-dir files, never the jail");
    }
  }
  return {};
}

// Signals the gateway may send its kernels (through their launchers, into the jail).
bool allowed_signal(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGKILL || sig == SIGHUP || sig == SIGQUIT ||
         sig == SIGUSR1 || sig == SIGUSR2;
}

// ---- the broker (privileged) ------------------------------------------------------------------

class Broker {
 public:
  Broker(UniqueFd channel, BrokerPolicy policy)
      : channel_(std::move(channel)),
        policy_(with_defaults(std::move(policy))),
        backend_(policy_.backend) {}

  int run() {
    clean_up_left_behind();
    backend_.start();
    spdlog::info("broker: pid {}, kernels as uids {}-{}, gateway group {}", ::getpid(),
                 policy_.first_uid, policy_.last_uid, policy_.access_gid);
    std::thread watcher([this] { watch(); });
    std::string buffer;
    while (auto message = recv_json(channel_.get(), buffer)) {
      dispatch(std::move(*message));
    }
    spdlog::info("broker: the gateway closed its channel; ending its kernels");
    {
      std::unique_lock lock(mu_);
      done_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return inflight_ == 0; });
    }
    watcher.join();
    std::map<std::uint64_t, std::shared_ptr<Entry>> entries;
    {
      std::lock_guard lock(mu_);
      entries.swap(entries_);
    }
    for (auto& [handle, entry] : entries) {
      std::lock_guard lock(entry->mu);
      entry->process.reset();
      end_work(entry->kernel_id);
    }
    return 0;
  }

 private:
  static BrokerPolicy with_defaults(BrokerPolicy p) {
    if (!p.find_kernelspec) {
      p.find_kernelspec = [](const std::string& name) { return find_kernelspec(name); };
    }
    return p;
  }

  struct Entry {
    std::mutex mu;  // the process is one owner's: requests and the watcher take turns
    std::unique_ptr<kernel::KernelProcessHandle> process;
    std::string kernel_id;
    uid_t uid = 0;
    std::atomic<bool> reported{false};
  };

  void dispatch(json request) {
    const std::uint64_t id =
        request.is_object() && request.contains("id") && request["id"].is_number_unsigned()
            ? request["id"].get<std::uint64_t>()
            : 0;
    if (request.is_discarded() || !request.is_object() || id == 0 ||
        !request.contains("op") || !request["op"].is_string()) {
      spdlog::warn("broker: refused a malformed request from the gateway");
      reply(id, refused("a request is a JSON object with a numeric id and an op"));
      return;
    }
    {
      std::lock_guard lock(mu_);
      if (inflight_ >= kMaxInflight) {
        reply(id, make_error(ErrorCode::kResourceExhausted, "broker_busy",
                             "the broker is handling too many requests"));
        return;
      }
      ++inflight_;
    }
    // Launches and stops take up to seconds: each request on a thread of its own.
    std::thread([this, id, request = std::move(request)] {
      const std::string op = request["op"].get<std::string>();
      Result<json> r = handle(op, request);
      if (!r) {
        spdlog::warn("broker: refused {} from the gateway: {}", op, r.error().describe());
        reply(id, r.error());
      } else {
        json out = std::move(r).value();
        out["id"] = id;
        out["ok"] = true;
        send(out);
      }
      std::lock_guard lock(mu_);
      --inflight_;
      cv_.notify_all();
    }).detach();
  }

  Result<json> handle(const std::string& op, const json& req) {
    try {
      if (op == "launch") {
        return launch(req);
      }
      if (op == "signal") {
        CELLGATE_TRY(only_fields(req, {"handle", "signal"}));
        const int sig = req.at("signal").get<int>();
        if (!allowed_signal(sig)) {
          return refused("signal " + std::to_string(sig) + " is not one a kernel is sent");
        }
        CELLGATE_ASSIGN_OR_RETURN(auto entry, find(req.at("handle").get<std::uint64_t>()));
        std::lock_guard lock(entry->mu);
        if (!entry->process) {
          return make_error(ErrorCode::kNotFound, "no_such_kernel", "the kernel was stopped");
        }
        spdlog::info("broker: signal {} to kernel {}", sig, entry->kernel_id);
        CELLGATE_TRY(entry->process->signal(sig));
        return json::object();
      }
      if (op == "stop" || op == "detach") {
        CELLGATE_TRY(only_fields(req, {"handle"}));
        const auto handle = req.at("handle").get<std::uint64_t>();
        CELLGATE_ASSIGN_OR_RETURN(auto entry, find(handle));
        {
          std::lock_guard lock(mu_);
          entries_.erase(handle);
        }
        std::lock_guard lock(entry->mu);
        if (op == "detach" && entry->process) {
          entry->process->detach();
        }
        entry->process.reset();  // kills, reaps and removes the runtime dir (unless detached)
        spdlog::info("broker: {} kernel {}", op == "stop" ? "stopped" : "let go of",
                     entry->kernel_id);
        return json::object();
      }
      if (op == "log_tail") {
        CELLGATE_TRY(only_fields(req, {"handle", "max_bytes"}));
        const auto max = std::min<std::size_t>(req.value("max_bytes", 2000u), 64u << 10);
        CELLGATE_ASSIGN_OR_RETURN(auto entry, find(req.at("handle").get<std::uint64_t>()));
        std::lock_guard lock(entry->mu);
        return json{{"text", entry->process ? entry->process->log_tail(max) : std::string()}};
      }
      if (op == "release_work") {
        CELLGATE_TRY(only_fields(req, {"kernel_id"}));
        const auto kernel_id = req.at("kernel_id").get<std::string>();
        if (!jail::is_plain_name(kernel_id)) {
          return refused("a kernel id is a plain name");
        }
        {
          std::lock_guard lock(mu_);
          for (const auto& [h, e] : entries_) {
            if (e->kernel_id == kernel_id) {
              return refused("kernel " + kernel_id + " still runs");
            }
          }
        }
        end_work(kernel_id);
        return json::object();
      }
      if (op == "wait_fast") {
        CELLGATE_TRY(only_fields(req, {"timeout_ms"}));
        const auto ms = std::clamp<long long>(req.at("timeout_ms").get<long long>(), 0, 60000);
        return json{{"fast", backend_.wait_fast(milliseconds(ms))}};
      }
    } catch (const json::exception& e) {
      return refused(std::string("a field is missing or has the wrong type: ") + e.what());
    }
    return refused("unknown op '" + op + "'");
  }

  Result<json> launch(const json& req) {
    CELLGATE_TRY(only_fields(req, {"kernel_id", "kernelspec", "uid", "env", "conn_files"}));
    const auto kernel_id = req.at("kernel_id").get<std::string>();
    // It names the kernel's cgroup ("k-<id>") and work dir: the jail's rule for such names.
    if (!jail::is_plain_name(kernel_id)) {
      return refused("a kernel id is a plain name of letters, digits, '-', '_' and '@'");
    }
    const auto uid = req.at("uid").get<uid_t>();
    if (uid == 0 || uid < policy_.first_uid || uid > policy_.last_uid) {
      return refused("uid " + std::to_string(uid) + " is outside the kernels' range " +
                     std::to_string(policy_.first_uid) + "-" + std::to_string(policy_.last_uid));
    }
    std::map<std::string, std::string> env;
    std::size_t env_bytes = 0;
    for (const auto& [k, v] : req.at("env").items()) {
      env_bytes += k.size() + v.get_ref<const std::string&>().size();
      if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
        return refused("an environment variable needs a name without '=' or NUL");
      }
      env[k] = v.get<std::string>();
    }
    if (env_bytes > kMaxEnvBytes) {
      return refused("the kernel's environment is larger than 1 MiB");
    }
    std::map<std::string, std::string> conn_files;
    if (auto it = req.find("conn_files"); it != req.end()) {
      for (const auto& [name, content] : it->items()) {
        if (!plain_file_name(name, 100) || name == "connection.json" || name == "kernel.json" ||
            name == "host-connection.json") {
          return refused("connection-dir file '" + name + "' needs another plain name");
        }
        conn_files[name] = content.get<std::string>();
      }
    }
    CELLGATE_ASSIGN_OR_RETURN(kernel::KernelSpec spec,
                              policy_.find_kernelspec(req.at("kernelspec").get<std::string>()));

    auto entry = std::make_shared<Entry>();
    entry->kernel_id = kernel_id;
    entry->uid = uid;
    std::uint64_t handle = 0;
    {
      std::lock_guard lock(mu_);
      for (const auto& [h, e] : entries_) {
        if (e->uid == uid || e->kernel_id == kernel_id) {
          return refused(e->uid == uid ? "uid " + std::to_string(uid) + " is another kernel's"
                                       : "kernel " + kernel_id + " already runs");
        }
      }
      handle = next_handle_++;
      entries_[handle] = entry;  // holds the uid and the id while it starts
    }
    auto started = start(kernel_id, uid, std::move(spec), std::move(env), std::move(conn_files));
    std::lock_guard lock(entry->mu);
    if (!started) {
      std::lock_guard map_lock(mu_);
      entries_.erase(handle);
      spdlog::warn("broker: kernel {} did not start: {}", kernel_id, started.error().describe());
      return std::move(started).error();
    }
    entry->process = std::move(started).value();
    const auto& p = *entry->process;
    spdlog::info("broker: started kernel {} ({}) as uid {}, pid {}", kernel_id,
                 p.connection().kernel_name, uid, p.pid());
    json out = {{"handle", handle},
                {"pid", p.pid()},
                {"jailed", p.jailed()},
                {"connection", p.connection().to_json()},
                {"connection_file", p.connection_file()}};
    if (auto facts = p.adoption_facts()) {
      out["facts"] = facts->to_json();
    }
    return out;
  }

  Result<std::unique_ptr<kernel::KernelProcessHandle>> start(
      const std::string& kernel_id, uid_t uid, kernel::KernelSpec spec,
      std::map<std::string, std::string> env, std::map<std::string, std::string> conn_files) {
    // The work dir: in a directory only root writes, so that nothing the gateway does can point
    // the launcher's tmpfs mount elsewhere.
    const std::string work_dir = work_path(kernel_id);
    if (::mkdir(work_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return errno_error(ErrorCode::kInternal, "work_dir", "mkdir('" + work_dir + "')", errno);
    }
    struct stat st {};
    if (::lstat(work_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return make_error(ErrorCode::kInternal, "work_dir", work_dir + " is not a directory");
    }
    kernel::LaunchRequest req;
    req.spec = std::move(spec);
    req.kernel_id = kernel_id;
    req.runtime_parent = policy_.state_dir + "/run";
    req.work_dir = work_dir;
    req.env = std::move(env);
    req.conn_files = std::move(conn_files);
    req.jail = kernel_jail(policy_.jail, kernel_id, uid, work_dir, policy_.work_dir_aliases);
    req.jail->access_gid = policy_.access_gid;  // the kernel's gid then (the launcher sees to it)
    return backend_.launch(std::move(req));
  }

  std::string work_path(const std::string& kernel_id) const {
    return policy_.state_dir + "/work/" + kernel_id;
  }

  void end_work(const std::string& kernel_id) {
    const std::string dir = work_path(kernel_id);
    ::umount2(dir.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  // What a previous broker on this state dir left: it ended with its gateway, so nothing here
  // is anyone's.
  void clean_up_left_behind() {
    const std::size_t cleaned = end_runtime_dirs(policy_.state_dir + "/run");
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(policy_.state_dir + "/work", ec)) {
      end_work(entry.path().filename().string());
    }
    if (cleaned > 0) {
      spdlog::info("broker: cleaned up after {} kernel(s) a previous gateway left", cleaned);
    }
  }

  Result<std::shared_ptr<Entry>> find(std::uint64_t handle) {
    std::lock_guard lock(mu_);
    auto it = entries_.find(handle);
    if (it == entries_.end()) {
      return make_error(ErrorCode::kNotFound, "no_such_kernel",
                        "handle " + std::to_string(handle) + " is no kernel of this gateway");
    }
    return it->second;
  }

  // Reports each kernel's end once, and keeps the zygote going.
  void watch() {
    auto next_tick = std::chrono::steady_clock::now();
    std::unique_lock lock(mu_);
    while (!done_) {
      std::vector<std::pair<std::uint64_t, std::shared_ptr<Entry>>> live;
      for (const auto& [h, e] : entries_) {
        if (!e->reported) {
          live.emplace_back(h, e);
        }
      }
      lock.unlock();
      for (auto& [handle, entry] : live) {
        std::unique_lock entry_lock(entry->mu, std::try_to_lock);
        if (!entry_lock || !entry->process || entry->reported) {
          continue;
        }
        if (auto ended = entry->process->poll_exit()) {
          entry->reported = true;
          send({{"event", "exited"}, {"handle", handle}, {"status", ended->to_line()}});
        }
      }
      if (std::chrono::steady_clock::now() >= next_tick) {
        backend_.tick();
        next_tick = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      }
      lock.lock();
      cv_.wait_for(lock, kExitPoll, [this] { return done_; });
    }
  }

  void reply(std::uint64_t id, const Error& e) {
    json out = error_json(e);
    out["id"] = id;
    send(out);
  }

  void send(const json& j) {
    std::lock_guard lock(send_mu_);
    (void)send_json(channel_.get(), j);  // a gateway that is gone reads nothing
  }

  UniqueFd channel_;
  const BrokerPolicy policy_;
  kernel::ProcessBackend backend_;
  std::mutex send_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, std::shared_ptr<Entry>> entries_;
  std::uint64_t next_handle_ = 1;
  std::size_t inflight_ = 0;
  bool done_ = false;
};

}  // namespace

Result<std::pair<UniqueFd, UniqueFd>> broker_channel() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return errno_error(ErrorCode::kInternal, "broker", "socketpair(SOCK_SEQPACKET)", errno);
  }
  return std::make_pair(UniqueFd(fds[0]), UniqueFd(fds[1]));
}

int serve_broker(UniqueFd channel, BrokerPolicy policy) {
  // Ctrl-C in a terminal reaches the whole process group: the broker ends when its gateway
  // does (the channel closes), after the gateway has stopped its kernels.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  Broker broker(std::move(channel), std::move(policy));
  return broker.run();
}

// ---- the gateway's side -----------------------------------------------------------------------

struct BrokerBackend::Shared {
  UniqueFd fd;
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, std::optional<json>> replies;  // pending requests
  std::map<std::uint64_t, launcher::StatusEvent> exits;  // by handle
  bool closed = false;
  std::thread reader;

  void read_loop() {
    std::string buffer;
    while (auto message = recv_json(fd.get(), buffer)) {
      const json& m = *message;
      if (!m.is_object()) {
        continue;
      }
      std::lock_guard lock(mu);
      if (m.value("event", "") == "exited") {
        auto ev = launcher::StatusEvent::parse_line(m.value("status", ""));
        if (ev) {
          exits[m.value("handle", std::uint64_t{0})] = std::move(ev).value();
        }
      } else if (auto it = replies.find(m.value("id", std::uint64_t{0})); it != replies.end()) {
        it->second = m;
      }
      cv.notify_all();
    }
    std::lock_guard lock(mu);
    if (!closed) {
      spdlog::error("the privileged broker ended: no kernel can start, and its kernels are gone");
    }
    closed = true;
    cv.notify_all();
  }

  Result<json> call(json request, milliseconds timeout) {
    std::uint64_t id;
    {
      std::lock_guard lock(mu);
      if (closed) {
        return gone();
      }
      id = next_id++;
      replies[id] = std::nullopt;
    }
    request["id"] = id;
    auto sent = send_json(fd.get(), request);
    std::unique_lock lock(mu);
    if (!sent) {
      replies.erase(id);
      return std::move(sent).error();
    }
    const bool answered =
        cv.wait_for(lock, timeout, [&] { return closed || replies[id].has_value(); });
    std::optional<json> reply = std::move(replies[id]);
    replies.erase(id);
    if (!reply) {
      return answered ? gone()
                      : make_error(ErrorCode::kDeadlineExceeded, "broker_timeout",
                                   "the broker did not answer " + request.value("op", "") +
                                       " within " + std::to_string(timeout.count()) + " ms");
    }
    if (!reply->value("ok", false)) {
      return error_from_json(*reply);
    }
    return std::move(*reply);
  }

  static Error gone() {
    return make_error(ErrorCode::kUnavailable, "broker_gone",
                      "the privileged broker that starts kernels has ended; restart cellgate");
  }
};

namespace {

class BrokerProcess : public kernel::KernelProcessHandle {
 public:
  BrokerProcess(std::shared_ptr<BrokerBackend::Shared> shared, std::uint64_t handle, pid_t pid,
                bool jailed, kernel::ConnectionInfo connection, std::string connection_file,
                std::optional<kernel::AdoptionFacts> facts)
      : shared_(std::move(shared)),
        handle_(handle),
        pid_(pid),
        jailed_(jailed),
        connection_(std::move(connection)),
        connection_file_(std::move(connection_file)),
        facts_(std::move(facts)) {}

  ~BrokerProcess() override {
    if (!detached_) {
      auto stopped = shared_->call({{"op", "stop"}, {"handle", handle_}}, milliseconds(30000));
      if (!stopped && stopped.error().reason != "broker_gone") {
        spdlog::warn("kernel pid {}: the broker did not stop it: {}", pid_,
                     stopped.error().describe());
      }
    }
    std::lock_guard lock(shared_->mu);
    shared_->exits.erase(handle_);
  }

  pid_t pid() const override { return pid_; }
  bool jailed() const override { return jailed_; }
  const kernel::ConnectionInfo& connection() const override { return connection_; }
  const std::string& connection_file() const override { return connection_file_; }

  std::string log_tail(std::size_t max_bytes) const override {
    auto r = shared_->call({{"op", "log_tail"}, {"handle", handle_}, {"max_bytes", max_bytes}},
                           milliseconds(5000));
    return r ? r->value("text", "") : "(the broker did not give the log: " + r.error().message + ")";
  }

  // The cgroup's files are readable by anyone: no round trip to the broker.
  Result<jail::CgroupStats> cgroup_stats() const override {
    if (!facts_ || facts_->cgroup_paths.empty()) {
      return make_error(ErrorCode::kNotFound, "no_cgroup", "the kernel has no cgroup");
    }
    return jail::read_cgroup_stats(cgroup_version(facts_->cgroup_version), facts_->cgroup_paths);
  }

  Result<void> signal(int sig) override {
    CELLGATE_TRY(shared_->call({{"op", "signal"}, {"handle", handle_}, {"signal", sig}},
                               milliseconds(5000)));
    return {};
  }

  std::optional<launcher::StatusEvent> poll_exit() override {
    std::lock_guard lock(shared_->mu);
    return exit_locked();
  }

  std::optional<launcher::StatusEvent> wait_exit(milliseconds timeout) override {
    std::unique_lock lock(shared_->mu);
    shared_->cv.wait_for(lock, timeout, [&] { return exit_locked().has_value(); });
    return exit_locked();
  }

  std::optional<kernel::AdoptionFacts> adoption_facts() const override { return facts_; }

  void detach() override {
    if (shared_->call({{"op", "detach"}, {"handle", handle_}}, milliseconds(5000))) {
      detached_ = true;
    }
  }

 private:
  std::optional<launcher::StatusEvent> exit_locked() const {
    if (auto it = shared_->exits.find(handle_); it != shared_->exits.end()) {
      return it->second;
    }
    if (shared_->closed) {  // the broker's end took its kernels with it
      launcher::StatusEvent ev;
      ev.kind = launcher::StatusEvent::Kind::kExited;
      ev.reason = launcher::ExitReason::kSignaled;
      ev.signal = SIGKILL;
      ev.pid = pid_;
      ev.message = "the privileged broker ended";
      return ev;
    }
    return std::nullopt;
  }

  std::shared_ptr<BrokerBackend::Shared> shared_;
  const std::uint64_t handle_;
  const pid_t pid_;
  const bool jailed_;
  const kernel::ConnectionInfo connection_;
  const std::string connection_file_;
  const std::optional<kernel::AdoptionFacts> facts_;
  bool detached_ = false;
};

}  // namespace

BrokerBackend::BrokerBackend(UniqueFd channel) : shared_(std::make_shared<Shared>()) {
  shared_->fd = std::move(channel);
  shared_->reader = std::thread([s = shared_.get()] { s->read_loop(); });
}

BrokerBackend::~BrokerBackend() {
  {
    std::lock_guard lock(shared_->mu);
    shared_->closed = true;  // our own doing: not logged as the broker's end
  }
  ::shutdown(shared_->fd.get(), SHUT_RDWR);
  shared_->reader.join();
}

bool BrokerBackend::wait_fast(milliseconds timeout) {
  auto r = shared_->call({{"op", "wait_fast"}, {"timeout_ms", timeout.count()}},
                         timeout + milliseconds(5000));
  return r && r->value("fast", false);
}

Result<std::unique_ptr<kernel::KernelProcessHandle>> BrokerBackend::launch(
    kernel::LaunchRequest request) {
  if (!request.jail || !request.jail->uid) {
    return make_error(ErrorCode::kFailedPrecondition, "broker",
                      "the broker starts jailed kernels only, each with a uid of the range");
  }
  json files = json::object();
  for (auto& [name, content] : request.conn_files) {
    files[name] = std::move(content);
  }
  const auto timeout = request.start_timeout + milliseconds(30000);
  CELLGATE_ASSIGN_OR_RETURN(json r, shared_->call({{"op", "launch"},
                                                   {"kernel_id", request.kernel_id},
                                                   {"kernelspec", request.spec.name},
                                                   {"uid", *request.jail->uid},
                                                   {"env", request.env},
                                                   {"conn_files", std::move(files)}},
                                                  timeout));
  try {
    CELLGATE_ASSIGN_OR_RETURN(auto connection,
                              kernel::ConnectionInfo::from_json(r.at("connection")));
    std::optional<kernel::AdoptionFacts> facts;
    if (r.contains("facts")) {
      CELLGATE_ASSIGN_OR_RETURN(facts, kernel::AdoptionFacts::from_json(r["facts"]));
    }
    return std::unique_ptr<kernel::KernelProcessHandle>(std::make_unique<BrokerProcess>(
        shared_, r.at("handle").get<std::uint64_t>(), r.at("pid").get<pid_t>(),
        r.at("jailed").get<bool>(), std::move(connection),
        r.at("connection_file").get<std::string>(), std::move(facts)));
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kInternal, "broker", std::string("a bad launch reply: ") + e.what());
  }
}

Result<std::unique_ptr<kernel::KernelProcessHandle>> BrokerBackend::adopt(
    const kernel::AdoptionFacts& facts) {
  (void)facts;
  return make_error(ErrorCode::kNotFound, "not_adopted",
                    "with privilege separation a kernel ends with its gateway (the broker ended "
                    "it); it is not adopted");
}

void BrokerBackend::end_work_dir(const std::string& kernel_id, const std::string& work_dir) {
  (void)work_dir;
  auto r = shared_->call({{"op", "release_work"}, {"kernel_id", kernel_id}}, milliseconds(10000));
  if (!r && r.error().reason != "broker_gone") {
    spdlog::warn("kernel {}: the broker did not remove its work dir: {}", kernel_id,
                 r.error().describe());
  }
}

}  // namespace cellgate::kernels
