// The privileged broker (broker.hpp): one thread running an event loop over the gateway's channel
// and its kernels' launcher pidfds; launches, stops and wait_fast (which block for up to
// seconds) run on a small bounded pool and hand their outcome back to the loop.
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cellgate/broker/broker.hpp"
#include "cellgate/broker/request.hpp"
#include "cellgate/kernel/process.hpp"
#include "cellgate/sys/error_text.hpp"
#include "cellgate/sys/process.hpp"
#include "cellgate/sys/seqpacket.hpp"
#include "cleanup.hpp"
#include "kernel_jail.hpp"
#include "kernelspecs.hpp"

namespace cellgate::broker {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;

constexpr std::size_t kWorkers = 4;      // launches and stops at once
constexpr std::size_t kMaxQueued = 256;  // blocking requests waiting for a worker
constexpr milliseconds kTick{1000};      // the backend's tick (keeps the zygote going)
constexpr milliseconds kRecheck{50};     // a launcher that ended but has not reported yet

// A fixed set of threads running jobs from a bounded queue; the queue's bound is the broker's
// answer to a gateway that asks faster than kernels start.
class WorkerPool {
 public:
  explicit WorkerPool(std::size_t threads) {
    for (std::size_t i = 0; i < threads; ++i) {
      threads_.emplace_back([this] { run(); });
    }
  }
  ~WorkerPool() { join(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  bool post(std::function<void()> job) {
    std::lock_guard lock(mu_);
    if (queue_.size() >= kMaxQueued || stopping_) {
      return false;
    }
    queue_.push_back(std::move(job));
    cv_.notify_one();
    return true;
  }

  // Runs what is queued, then ends the threads.
  void join() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    for (auto& t : threads_) {
      if (t.joinable()) {
        t.join();
      }
    }
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) {
          return;
        }
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

class Broker {
 public:
  Broker(UniqueFd channel, BrokerPolicy policy)
      : channel_(std::move(channel), sys::ChannelLimits{kMaxMessage, 0}),
        policy_(with_defaults(std::move(policy))),
        backend_(policy_.backend),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  int run() {
    if (!wake_) {
      spdlog::error("broker: eventfd(): {}", sys::error_text(errno));
      return 1;
    }
    clean_up_left_behind();
    backend_.start();
    spdlog::info("broker: pid {}, kernels as uids {}-{}, gateway group {}", ::getpid(),
                 policy_.first_uid, policy_.last_uid, policy_.access_gid);
    auto next_tick = std::chrono::steady_clock::now() + kTick;
    while (!channel_closed_) {
      wait_for_events(next_tick);
      run_completions();
      receive_requests();
      report_exits();
      if (std::chrono::steady_clock::now() >= next_tick) {
        backend_.tick();
        next_tick = std::chrono::steady_clock::now() + kTick;
      }
    }
    spdlog::info("broker: the gateway closed its channel; ending its kernels");
    pool_.join();  // what was asked runs to its end (a launch finishes, then is ended below)
    run_completions();
    for (auto& [handle, entry] : entries_) {
      entry.process.reset();
      end_work(entry.kernel_id);
    }
    entries_.clear();
    return 0;
  }

 private:
  struct Entry {
    std::unique_ptr<kernel::KernelProcessHandle> process;  // null while it starts
    std::string kernel_id;
    uid_t uid = 0;
    std::optional<sys::PidFd> launcher;  // readable once the launcher has ended
    bool reported = false;
    bool launcher_ended = false;  // its pidfd fired; its report is read on the next rounds
  };

  static BrokerPolicy with_defaults(BrokerPolicy p) {
    if (!p.find_kernelspec) {
      p.find_kernelspec = [](const std::string& name) { return kernels::find_kernelspec(name); };
    }
    return p;
  }

  // ---- the loop --------------------------------------------------------------------------------

  void wait_for_events(std::chrono::steady_clock::time_point next_tick) {
    std::vector<pollfd> fds = {{channel_.fd(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    bool recheck = false;
    for (const auto& [handle, e] : entries_) {
      if (e.reported || !e.process) {
        continue;
      }
      if (e.launcher && !e.launcher_ended) {
        fds.push_back({e.launcher->get(), POLLIN, 0});
      } else {
        recheck = true;  // no pidfd, or it fired before the exit could be read
      }
    }
    auto timeout = std::chrono::ceil<milliseconds>(next_tick - std::chrono::steady_clock::now());
    if (recheck) {
      timeout = std::min(timeout, kRecheck);
    }
    const int n =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(0, timeout.count())));
    if (n <= 0) {
      return;
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents != 0) {
        for (auto& [handle, e] : entries_) {
          if (e.launcher && e.launcher->get() == fds[i].fd) {
            e.launcher_ended = true;
          }
        }
      }
    }
  }

  void receive_requests() {
    for (;;) {
      auto message = channel_.receive(/*nonblocking=*/true);
      if (!message) {
        if (message.error().reason == "would_block") {
          return;
        }
        if (message.error().code == ErrorCode::kInvalidArgument) {  // too large, or fds sent
          spdlog::warn("broker: refused a message from the gateway: {}", message.error().message);
          send(encode_error(0, refused(message.error().message)));
          continue;
        }
        spdlog::warn("broker: the channel failed: {}", message.error().describe());
        channel_closed_ = true;
        return;
      }
      if (!*message) {
        channel_closed_ = true;
        return;
      }
      std::uint64_t id = 0;
      auto request = parse_request((*message)->data, &id);
      if (!request) {
        spdlog::warn("broker: refused a request from the gateway: {}", request.error().message);
        send(encode_error(id, request.error()));
        continue;
      }
      dispatch(std::move(request).value());
    }
  }

  void dispatch(Request request) {
    const std::uint64_t id = request.id;
    const Op op = request.op();
    Result<json> answer = std::visit(
        [this, id](auto&& body) { return handle(id, std::forward<decltype(body)>(body)); },
        std::move(request.body));
    if (!answer) {
      spdlog::warn("broker: refused {} from the gateway: {}", to_string(op),
                   answer.error().describe());
      send(encode_error(id, answer.error()));
    } else if (!answer->is_null()) {  // null: a worker answers
      send(encode_ok(id, std::move(answer).value()));
    }
  }

  // Each kernel's end, once.
  void report_exits() {
    for (auto& [handle, e] : entries_) {
      if (e.reported || !e.process) {
        continue;
      }
      if (auto ended = e.process->poll_exit()) {
        e.reported = true;
        send(encode_exited(handle, ended->to_line()));
      }
    }
  }

  // ---- requests --------------------------------------------------------------------------------

  Result<json> handle(std::uint64_t id, LaunchRequest r) {
    if (r.uid == 0 || r.uid < policy_.first_uid || r.uid > policy_.last_uid) {
      return refused("uid " + std::to_string(r.uid) + " is outside the kernels' range " +
                     std::to_string(policy_.first_uid) + "-" + std::to_string(policy_.last_uid));
    }
    for (const auto& [h, e] : entries_) {
      if (e.uid == r.uid || e.kernel_id == r.kernel_id) {
        return refused(e.uid == r.uid ? "uid " + std::to_string(r.uid) + " is another kernel's"
                                      : "kernel " + r.kernel_id + " already runs");
      }
    }
    const std::uint64_t handle = next_handle_++;
    Entry& entry = entries_[handle];  // holds the uid and the id while it starts
    entry.kernel_id = r.kernel_id;
    entry.uid = r.uid;
    const bool posted = pool_.post([this, id, handle, r = std::move(r)]() mutable {
      auto spec = policy_.find_kernelspec(r.kernelspec);
      Result<std::unique_ptr<kernel::KernelProcessHandle>> started =
          spec ? start(r.kernel_id, r.uid, std::move(spec).value(), std::move(r.env),
                       std::move(r.conn_files))
               : Result<std::unique_ptr<kernel::KernelProcessHandle>>(std::move(spec).error());
      // std::function needs a copyable target: the process handle rides in a shared_ptr.
      auto outcome = std::make_shared<decltype(started)>(std::move(started));
      complete([this, id, handle, outcome] { finish_launch(id, handle, std::move(*outcome)); });
    });
    if (!posted) {
      entries_.erase(handle);
      return busy();
    }
    return json(nullptr);
  }

  void finish_launch(std::uint64_t id, std::uint64_t handle,
                     Result<std::unique_ptr<kernel::KernelProcessHandle>> started) {
    auto it = entries_.find(handle);
    if (!started) {
      spdlog::warn("broker: kernel {} did not start: {}",
                   it != entries_.end() ? it->second.kernel_id : "?", started.error().describe());
      if (it != entries_.end()) {
        entries_.erase(it);
      }
      send(encode_error(id, started.error()));
      return;
    }
    if (it == entries_.end()) {  // not reachable: a starting entry is never ended; be safe
      send(encode_error(id, make_error(ErrorCode::kInternal, "broker", "the launch was lost")));
      return;  // `started` ends the kernel
    }
    Entry& entry = it->second;
    entry.process = std::move(started).value();
    const auto& p = *entry.process;
    spdlog::info("broker: started kernel {} ({}) as uid {}, pid {}", entry.kernel_id,
                 p.connection().kernel_name, entry.uid, p.pid());
    json out = {{"handle", handle},
                {"pid", p.pid()},
                {"jailed", p.jailed()},
                {"zygote", p.from_zygote()},
                {"connection", p.connection().to_json()},
                {"connection_file", p.connection_file()}};
    if (auto facts = p.adoption_facts()) {
      out["facts"] = facts->to_json();
      // The launcher is our child: its pidfd wakes the loop when it (and so its kernel) ends.
      if (auto pidfd = sys::PidFd::open(facts->launcher_pid)) {
        entry.launcher = std::move(pidfd).value();
      }
    }
    send(encode_ok(id, std::move(out)));
  }

  Result<json> handle(std::uint64_t, SignalRequest r) {
    CELLGATE_ASSIGN_OR_RETURN(Entry * entry, find(r.handle));
    if (!entry->process) {
      return make_error(ErrorCode::kNotFound, "no_such_kernel", "the kernel was stopped");
    }
    spdlog::info("broker: signal {} to kernel {}", r.signal, entry->kernel_id);
    CELLGATE_TRY(entry->process->signal(r.signal));
    return json::object();
  }

  Result<json> handle(std::uint64_t id, StopRequest r) { return end(id, r.handle, false); }
  Result<json> handle(std::uint64_t id, DetachRequest r) { return end(id, r.handle, true); }

  // Stop or detach: the entry leaves the map now; the process is ended (kill, reap: up to
  // seconds) on a worker, which answers.
  Result<json> end(std::uint64_t id, std::uint64_t handle, bool detach) {
    CELLGATE_ASSIGN_OR_RETURN(Entry * found, find(handle));
    if (!found->process) {
      // Still starting: the launch owns it until it is done.
      return make_error(ErrorCode::kNotFound, "no_such_kernel", "the kernel was stopped");
    }
    auto entry = std::make_shared<Entry>(std::move(*found));
    entries_.erase(handle);
    const bool posted = pool_.post([this, id, entry, detach] {
      if (detach) {
        entry->process->detach();
      }
      entry->process.reset();  // kills, reaps and removes the runtime dir (unless detached)
      spdlog::info("broker: {} kernel {}", detach ? "let go of" : "stopped", entry->kernel_id);
      send(encode_ok(id, json::object()));
    });
    if (!posted) {
      // No worker to spare: end it here rather than keep a kernel the gateway let go of.
      if (detach) {
        entry->process->detach();
      }
      entry->process.reset();
      return json::object();
    }
    return json(nullptr);
  }

  Result<json> handle(std::uint64_t, LogTailRequest r) {
    CELLGATE_ASSIGN_OR_RETURN(Entry * entry, find(r.handle));
    return json{{"text", entry->process ? entry->process->log_tail(r.max_bytes) : std::string()}};
  }

  Result<json> handle(std::uint64_t, const ReleaseWorkRequest& r) {
    for (const auto& [h, e] : entries_) {
      if (e.kernel_id == r.kernel_id) {
        return refused("kernel " + r.kernel_id + " still runs");
      }
    }
    end_work(r.kernel_id);
    return json::object();
  }

  Result<json> handle(std::uint64_t id, WaitFastRequest r) {
    const bool posted = pool_.post([this, id, timeout = r.timeout] {
      send(encode_ok(id, json{{"fast", backend_.wait_fast(timeout)}}));
    });
    if (!posted) {
      return busy();
    }
    return json(nullptr);
  }

  // ---- helpers ---------------------------------------------------------------------------------

  static Error busy() {
    return make_error(ErrorCode::kResourceExhausted, "broker_busy",
                      "the broker is handling too many requests");
  }

  Result<Entry*> find(std::uint64_t handle) {
    auto it = entries_.find(handle);
    if (it == entries_.end()) {
      return make_error(ErrorCode::kNotFound, "no_such_kernel",
                        "handle " + std::to_string(handle) + " is no kernel of this gateway");
    }
    return &it->second;
  }

  // Runs `fn` on the loop's thread (from a worker).
  void complete(std::function<void()> fn) {
    {
      std::lock_guard lock(completions_mu_);
      completions_.push_back(std::move(fn));
    }
    const std::uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }

  void run_completions() {
    std::uint64_t count = 0;
    (void)!::read(wake_.get(), &count, sizeof count);
    std::deque<std::function<void()>> ready;
    {
      std::lock_guard lock(completions_mu_);
      ready.swap(completions_);
    }
    for (auto& fn : ready) {
      fn();
    }
  }

  void send(const std::string& text) {
    (void)channel_.send(text);  // a gateway that is gone reads nothing
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
    CELLGATE_ASSIGN_OR_RETURN(const bool loopback,
                              kernels::kernel_loopback(spec, policy_.allow_debugger));
    kernel::LaunchRequest req;
    req.spec = std::move(spec);
    req.kernel_id = kernel_id;
    req.runtime_parent = policy_.state_dir + "/run";
    req.work_dir = work_dir;
    req.env = std::move(env);
    req.conn_files = std::move(conn_files);
    req.start_timeout = policy_.start_timeout;
    req.jail = kernels::kernel_jail(policy_.jail, kernel_id, uid, work_dir,
                                    policy_.work_dir_aliases, loopback);
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
    const std::size_t cleaned = kernels::end_runtime_dirs(policy_.state_dir + "/run");
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(policy_.state_dir + "/work", ec)) {
      end_work(entry.path().filename().string());
    }
    if (cleaned > 0) {
      spdlog::info("broker: cleaned up after {} kernel(s) a previous gateway left", cleaned);
    }
  }

  sys::SeqpacketChannel channel_;
  const BrokerPolicy policy_;
  kernel::ProcessBackend backend_;
  UniqueFd wake_;  // an eventfd: a worker has put a completion in completions_
  std::mutex completions_mu_;
  std::deque<std::function<void()>> completions_;
  std::map<std::uint64_t, Entry> entries_;  // the loop's alone
  std::uint64_t next_handle_ = 1;
  bool channel_closed_ = false;
  WorkerPool pool_{kWorkers};  // last: its threads end before the members they use
};

}  // namespace

Result<std::pair<UniqueFd, UniqueFd>> broker_channel() {
  auto pair = sys::SeqpacketChannel::pair();
  if (!pair) {
    return std::move(pair).error();
  }
  return std::make_pair(pair->first.release(), pair->second.release());
}

int serve_broker(UniqueFd channel, BrokerPolicy policy) {
  // Ctrl-C in a terminal reaches the whole process group: the broker ends when its gateway
  // does (the channel closes), after the gateway has stopped its kernels.
  (void)::signal(SIGINT, SIG_IGN);
  (void)::signal(SIGHUP, SIG_IGN);
  (void)::signal(SIGPIPE, SIG_IGN);
  Broker broker(std::move(channel), std::move(policy));
  return broker.run();
}

}  // namespace cellgate::broker
