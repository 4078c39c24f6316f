// The gateway's side of the broker (broker.hpp): a KernelBackend whose requests go over the
// channel, a reader thread that matches replies to callers and keeps the kernels' exit reports.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cellgate/broker/broker.hpp"
#include "cellgate/broker/request.hpp"
#include "cellgate/jail/cgroup.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/launcher/status.hpp"
#include "cellgate/sys/seqpacket.hpp"
#include "cleanup.hpp"

namespace cellgate::broker {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

Result<void> send_json(int fd, const json& j) {
  const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  auto sent = sys::send_packet(fd, text, {}, sys::ChannelLimits{kMaxMessage, 0});
  if (!sent) {
    Error e = std::move(sent).error();
    if (e.reason == "message_too_large") {
      e.reason = "broker_message";
    } else {
      e.code = ErrorCode::kUnavailable;
      e.reason = "broker_gone";
    }
    return e;
  }
  return {};
}

}  // namespace

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
    const sys::ChannelLimits limits{kMaxMessage, 0};
    for (;;) {
      auto received = sys::receive_packet(fd.get(), limits);
      if (!received) {
        if (received.error().code == ErrorCode::kInvalidArgument) {
          continue;  // too large or with descriptors: not the broker's, dropped
        }
        break;
      }
      if (!*received) {
        break;
      }
      const json m = json::parse((*received)->data, nullptr, /*allow_exceptions=*/false);
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
      return error_from_reply(*reply);
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
                std::optional<kernel::AdoptionFacts> facts, bool from_zygote)
      : shared_(std::move(shared)),
        handle_(handle),
        pid_(pid),
        jailed_(jailed),
        connection_(std::move(connection)),
        connection_file_(std::move(connection_file)),
        facts_(std::move(facts)),
        from_zygote_(from_zygote) {}

  ~BrokerProcess() override {
    // Building the request (nlohmann) may throw std::bad_alloc; a destructor must not.
    try {
      if (!detached_) {
        auto stopped = shared_->call({{"op", "stop"}, {"handle", handle_}}, milliseconds(30000));
        if (!stopped && stopped.error().reason != "broker_gone") {
          spdlog::warn("kernel pid {}: the broker did not stop it: {}", pid_,
                       stopped.error().describe());
        }
      }
      std::lock_guard lock(shared_->mu);
      shared_->exits.erase(handle_);
    } catch (const std::exception& e) {
      spdlog::error("kernel pid {}: stopping it through the broker failed: {}", pid_, e.what());
    }
  }

  pid_t pid() const override { return pid_; }
  bool jailed() const override { return jailed_; }
  bool from_zygote() const override { return from_zygote_; }
  const kernel::ConnectionInfo& connection() const override { return connection_; }
  const std::string& connection_file() const override { return connection_file_; }

  std::string log_tail(std::size_t max_bytes) const override {
    auto r = shared_->call({{"op", "log_tail"}, {"handle", handle_}, {"max_bytes", max_bytes}},
                           milliseconds(5000));
    return r ? r->value("text", "")
             : "(the broker did not give the log: " + r.error().message + ")";
  }

  // The cgroup's files are readable by anyone: no round trip to the broker.
  Result<jail::CgroupStats> cgroup_stats() const override {
    if (!facts_ || facts_->cgroup_paths.empty()) {
      return make_error(ErrorCode::kNotFound, "no_cgroup", "the kernel has no cgroup");
    }
    return jail::read_cgroup_stats(kernels::cgroup_version(facts_->cgroup_version),
                                   facts_->cgroup_paths);
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
  const bool from_zygote_;
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
        r.at("connection_file").get<std::string>(), std::move(facts), r.value("zygote", false)));
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kInternal, "broker",
                      std::string("a bad launch reply: ") + e.what());
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

}  // namespace cellgate::broker
