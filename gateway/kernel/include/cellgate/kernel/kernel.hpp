// The seam at the kernel: what the gateway needs from a running kernel's channels
// (KernelConnection) and from starting one (KernelBackend). KernelClient (over ZeroMQ) and the
// launcher (KernelProcess, with the zygote) implement them for real; tests/support has a fake
// backend whose connections are KernelClients over a fake transport (transport.hpp) that replays
// captured ipykernel traffic, so the registry, the executor, the pool, culling and the WebSocket
// bridge are tested without root and without Python, over the client's own router.
//
//   auto process = backend.launch(request);                       // a jailed kernel
//   auto conn = backend.connect(*process.value(), {.on_iopub = …});   // its channels
//   conn.value()->wait_ready(10s);
//   conn.value()->send(Channel::kShell, "execute_request", execute_content("1+1"),
//                      {.on_envelope = …, .on_end = …});
//
// Messages from a kernel arrive as Envelopes (protocol/envelope.hpp): routed on their header,
// parsed only where their content is used.
//
// Thread-safety: KernelConnection's and KernelBackend's methods may be called from any thread.
// Handlers and events run on the connection's I/O thread, one at a time, and must not block.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/spec.hpp"
#include "cellgate/kernel/connection.hpp"
#include "cellgate/launcher/status.hpp"
#include "cellgate/protocol/envelope.hpp"
#include "cellgate/protocol/message.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernel {

using protocol::EnvelopePtr;
using MessageHandler = std::function<void(Channel, const protocol::Message&)>;
using EnvelopeHandler = std::function<void(const EnvelopePtr&)>;

enum class RequestEnd {
  kComplete,    // the reply arrived, and (if waited for) iopub status idle for this request
  kKernelDead,  // the kernel died before the request completed
  kCancelled,   // the connection was closed first
};
const char* to_string(RequestEnd end);

struct RequestHandlers {
  // The reply, every iopub message and every input_request whose parent is this request, as
  // envelopes. When set, on_message is not called.
  EnvelopeHandler on_envelope;
  // The same, parsed (on the I/O thread): for callers that want every message's content.
  MessageHandler on_message;
  // Called exactly once, last.
  std::function<void(RequestEnd)> on_end;
  // Complete only after iopub status "idle" for this request as well as the reply, so every
  // output has been delivered. Turn off for requests whose idle may never come (shutdown, or a
  // kernel_info sent before the iopub subscription is live).
  bool wait_for_idle = true;
};

// Everything one request produced, in arrival order.
struct Collected {
  std::vector<std::pair<Channel, protocol::Message>> messages;
  std::optional<protocol::Message> reply;
  RequestEnd end = RequestEnd::kComplete;
};

// What a kernel's process is doing while its heartbeats go unanswered (ClientOptions::progress).
struct Progress {
  enum class State {
    kRunning,  // alive and using CPU (or held at its CPU quota with work waiting): busy
    kStalled,  // alive and using no CPU, or stopped (SIGSTOP): hung
    kGone,     // the process or its cgroup is gone (its launcher's exit report will say why)
  };
  State state = State::kRunning;
  std::string why;  // for the log: "its cgroup used 212 ms of CPU in 501 ms, throttled 5 times"
};

// How to talk to a kernel, and what the gateway hears from it besides the answers to its own
// requests.
struct ZmqContext;  // client.hpp

struct ClientOptions {
  // A ping every interval; `heartbeat_misses` unanswered pings in a row mean the kernel is dead.
  // Detection takes at most (misses + 1) * interval after the kernel stops. Death is only
  // declared once the kernel has answered a first ping (a starting kernel is not dead). With a
  // `progress` probe, only misses while the probe finds the process making no progress count.
  std::chrono::milliseconds heartbeat_interval{200};
  int heartbeat_misses = 3;
  // Asked at each unanswered ping (on the I/O thread; a few small file reads) whether the
  // kernel's process is alive and making progress since it was last asked. A kernel whose own
  // cell forks CPU-bound workers into its CPU quota leaves the heartbeat thread no CPU for
  // seconds: it is busy, not dead, and its variables are lost if it is restarted. While the probe
  // says kRunning, misses are not counted (jupyter_server likewise decides death by polling the
  // process, never by heartbeats). Unset: every miss counts. progress.hpp makes one from a
  // KernelProcessHandle (its process and its cgroup's CPU figures).
  std::function<Progress()> progress;
  // The kernel's name in log lines (its id); "" names it by its shell endpoint.
  std::string log_name;
  // true: the kernel answers pings while it runs a cell (ipykernel's heartbeat is a thread of its
  // own), so misses count at any time. false: it answers only between requests (IRkernel polls
  // its heartbeat socket in the loop that runs cells, so an R cell of 5 s is 5 s of silence):
  // pings unanswered while its last iopub status is "busy" are not counted. A kernel that ends
  // is still seen at once through its process; only a hang during a cell goes unnoticed.
  // Unset: wait_ready() decides from kernel_info_reply, true for ipykernel (implementation
  // "ipython") and false for any other kernel.
  std::optional<bool> heartbeat_while_busy;
  protocol::Limits limits;
  std::string username = "cellgate";
  // The ZeroMQ context the client's sockets live in: one per gateway (make_zmq_context(), held
  // by the registry), so one libzmq I/O thread serves every kernel instead of one each. Null:
  // the client makes its own.
  std::shared_ptr<ZmqContext> zmq_context;

  // Every iopub message, whether or not it answers a request of ours (it is also given to that
  // request's handler).
  EnvelopeHandler on_iopub;
  // Shell, control and stdin messages whose parent is no request of ours: the replies to
  // messages sent with post(), status at start-up.
  EnvelopeHandler on_unrouted;
  // The kernel stopped answering heartbeats (and, with `progress`, used no CPU meanwhile).
  // Called once, with the reason (also KernelConnection::death_reason()).
  std::function<void(const std::string& reason)> on_dead;
  // A frame set from the kernel that failed its checks (bad signature, bad JSON, too large). It
  // is dropped; nothing else changes.
  std::function<void(Channel, const Error&)> on_wire_error;
};

// content of an execute_request with the spec's defaults.
nlohmann::json execute_content(std::string code, bool allow_stdin = false,
                               bool store_history = true, bool silent = false);

// One running kernel's channels.
class KernelConnection {
 public:
  virtual ~KernelConnection() = default;

  virtual const protocol::Session& session() const = 0;
  // Queues a request; returns its msg_id at once.
  virtual std::string send(Channel channel, protocol::Message msg, RequestHandlers handlers) = 0;
  // Sends a client's message as it is (its own header, session and parent), re-signed with the
  // kernel's key, without tracking a reply: what comes back goes to ClientOptions::on_unrouted.
  virtual void post(Channel channel, EnvelopePtr msg) = 0;
  // Answers an input_request received on the stdin channel.
  virtual void send_input(const protocol::Message& input_request, std::string value) = 0;
  // Waits until the kernel answers kernel_info_request and iopub delivers messages. Returns the
  // kernel_info_reply content. Blocking.
  virtual Result<nlohmann::json> wait_ready(std::chrono::milliseconds timeout) = 0;
  virtual bool is_alive() const = 0;
  // Why the connection declared the kernel dead ("no answer to 6 heartbeats in a row …"); "" while
  // it is alive, or when it does not say.
  virtual std::string death_reason() const { return ""; }

  std::string send(Channel channel, std::string_view msg_type, nlohmann::json content,
                   RequestHandlers handlers);
  // Sends a request and waits until it ends or `timeout` passes (kDeadlineExceeded; the request
  // stays routed and its late messages are dropped). Blocking: never on a loop or I/O thread.
  Result<Collected> request(Channel channel, std::string_view msg_type, nlohmann::json content,
                            std::chrono::milliseconds timeout, bool wait_for_idle = true);
};

// What a gateway that restarts needs to find a running kernel's launcher again (kept in the
// kernel's state record): the launcher, identified across pid reuse by its start time, and the
// kernel's files and cgroup.
struct AdoptionFacts {
  pid_t launcher_pid = -1;
  std::string launcher_start_time;  // field 22 of /proc/<pid>/stat
  pid_t kernel_pid = -1;            // host pid namespace
  bool jailed = false;
  std::string runtime_dir;  // connection dir, jail spec, status file, log
  std::string status_file;  // the launcher's status lines (launcher --status-file)
  std::string log_file;
  std::string work_dir;
  std::vector<std::string> cgroup_paths;  // the kernel's cgroup, one dir per hierarchy
  std::string cgroup_version;             // "v1" or "v2"
  ConnectionInfo connection;
  std::string connection_file;

  nlohmann::json to_json() const;
  static Result<AdoptionFacts> from_json(const nlohmann::json& j);
};

// Field `field` (from 3, after the command name) of /proc/<pid>/stat; "" when it is gone.
std::string proc_stat_field(pid_t pid, int field);
// Field 22 ("" when the process is gone): with the pid, it names one process across pid reuse.
std::string process_start_time(pid_t pid);

// A started kernel process.
// What running a command inside a kernel's jail needs (jail_command.hpp): the launcher, the
// jail's pid 1, the kernel's jail spec file and cgroup dirs, the launcher's environment.
struct JailTarget {
  std::string launcher_path;
  pid_t init_pid = -1;
  std::string spec_file;
  std::vector<std::string> cgroup_dirs;
  std::vector<std::string> launcher_env;
};

class KernelProcessHandle {
 public:
  virtual ~KernelProcessHandle() = default;
  virtual pid_t pid() const = 0;  // the kernel's, in the host's pid namespace
  virtual bool jailed() const = 0;
  virtual const ConnectionInfo& connection() const = 0;
  virtual const std::string& connection_file() const = 0;
  // The last bytes of the kernel's and launcher's own output, for error messages.
  virtual std::string log_tail(std::size_t max_bytes = 2000) const = 0;
  // CPU and memory of the kernel's cgroup; kNotFound when unjailed or gone.
  virtual Result<jail::CgroupStats> cgroup_stats() const = 0;
  // Holds the kernel's cgroup to the least CPU the kernel allows (true), or gives it back the
  // limit it had (false): its tenant is past its CPU budget (tenants/cpu_budget.hpp).
  // kFailedPrecondition where this gateway cannot write the kernel's cgroup.
  virtual Result<void> throttle_cpu(bool /*throttled*/) {
    return make_error(ErrorCode::kFailedPrecondition, "cpu_throttle_unavailable",
                      "this kind of kernel process cannot be throttled");
  }
  virtual Result<void> signal(int sig) = 0;
  // The launcher's "exited" report once the kernel has ended; nullopt while it runs.
  virtual std::optional<launcher::StatusEvent> poll_exit() = 0;
  virtual std::optional<launcher::StatusEvent> wait_exit(std::chrono::milliseconds timeout) = 0;
  // The facts a restarted gateway adopts it by; nullopt when this kind of process cannot be
  // adopted (a fake).
  virtual std::optional<AdoptionFacts> adoption_facts() const { return std::nullopt; }
  // The unix socket where its launcher answers for the iopub it spooled (spool.hpp); "" : none.
  virtual std::string spool_socket() const { return {}; }
  // Whether the launcher reported the kernel forked from the zygote (false: started cold).
  virtual bool from_zygote() const { return false; }
  // Lets the kernel run on when the handle goes (a gateway handing its kernels over to the next
  // one on its state dir): nothing is killed, unmounted or removed then.
  virtual void detach() {}

  // How to run a command in this kernel's jail; kFailedPrecondition "no_jail" when it has none
  // this gateway can enter (unjailed, behind a broker, not running).
  virtual Result<JailTarget> jail_target() const {
    return make_error(ErrorCode::kFailedPrecondition, "no_jail",
                      "this kind of kernel process has no jail to run a command in");
  }

  // ---- hibernation (CRIU: kernel-launcher/checkpoint) ----
  // Why this kernel cannot be checkpointed (reason "not_hibernatable", kFailedPrecondition), or
  // nothing. A kernel forked from the zygote maps cellgate-zygote from outside its jail's mount
  // namespace, which CRIU cannot restore.
  virtual Result<void> checkpointable() const {
    return make_error(ErrorCode::kFailedPrecondition, "not_hibernatable",
                      "this kind of kernel process cannot be checkpointed");
  }
  // Checkpoints the kernel's jail into `image_dir` (which must not exist; made 0700): its
  // processes and cgroup are gone after, the handle keeps its runtime dir for restore(). Nobody
  // may be connected to the kernel's sockets. On failure the kernel runs on as it was. Blocking.
  virtual Result<void> checkpoint(const std::string& image_dir) {
    (void)image_dir;
    return checkpointable();
  }
  // A snapshot: the jail is checkpointed into `image_dir` with its work files and runs on, this
  // handle unchanged. The caller has closed its connection first, as for checkpoint().
  // `compress`: zstd on the page images (a kept snapshot); a fork's, restored at once, is not.
  virtual Result<void> snapshot(const std::string& image_dir, bool compress) {
    (void)image_dir;
    (void)compress;
    return checkpointable();
  }
  // Restores the kernel checkpoint() saved, with a new launcher; blocks until it reports the
  // jail started (or failed). The image stays for the caller to remove.
  virtual Result<void> restore(const std::string& image_dir, std::chrono::milliseconds timeout) {
    (void)image_dir;
    (void)timeout;
    return checkpointable();
  }
  // The kernel took a new connection key (a copy rekeyed after its restore: snapshots.cpp): its
  // connection file and connection() carry `key` from now on.
  virtual Result<void> set_key(const std::string& key) {
    (void)key;
    return make_error(ErrorCode::kFailedPrecondition, "not_rekeyable",
                      "this kind of kernel process keeps its connection key");
  }
};

struct LaunchRequest;  // process.hpp

// Starts kernels and connects to them.
class KernelBackend {
 public:
  virtual ~KernelBackend() = default;
  // Starts what the backend runs on its own (the zygote). Not in the constructor.
  virtual void start() {}
  // Periodic upkeep (reaping and restarting the zygote); from the registry's monitor.
  virtual void tick() {}
  // Waits until launches will be fast (the zygote is ready); false when they will not be.
  virtual bool wait_fast(std::chrono::milliseconds timeout) { return timeout.count() >= 0; }
  // Blocking: returns once the launcher reports the kernel started (or failed).
  virtual Result<std::unique_ptr<KernelProcessHandle>> launch(LaunchRequest request) = 0;
  // Its channels: by default the ZeroMQ KernelClient on the process's connection info.
  virtual Result<std::unique_ptr<KernelConnection>> connect(const KernelProcessHandle& process,
                                                            ClientOptions options);
  // Takes over a kernel a previous gateway started, whose launcher still runs (kNotFound when it
  // does not: gone, or its pid now names another process). The handle supervises it as one of
  // its own; ending the handle ends the kernel.
  virtual Result<std::unique_ptr<KernelProcessHandle>> adopt(const AdoptionFacts& facts) {
    (void)facts;
    return make_error(ErrorCode::kFailedPrecondition, "cannot_adopt",
                      "this kernel backend cannot adopt kernels");
  }
  // A kernel a previous gateway hibernated, from its record: a handle whose restore() brings it
  // back (KernelProcess::hibernated_from). Backends without checkpoints refuse.
  virtual Result<std::unique_ptr<KernelProcessHandle>> adopt_hibernated(
      const AdoptionFacts& facts) {
    (void)facts;
    return make_error(ErrorCode::kFailedPrecondition, "cannot_adopt",
                      "this kernel backend cannot adopt hibernated kernels");
  }
  // A kernel is gone for good (not restarting): its work dir's tmpfs, which outlives each
  // process so that a restarted kernel finds its files, is unmounted (lazily). The directory
  // itself stays for the caller to remove.
  virtual void end_work_dir(const std::string& kernel_id, const std::string& work_dir);
};

}  // namespace cellgate::kernel
