// EnvdApi: E2B's in-sandbox daemon (envd, port 49983 in E2B's design), served by the gateway for
// every sandbox: the process RPCs of process.Process (Start, Connect, List, SendInput,
// CloseStdin, SendSignal, Update) and filesystem.Filesystem's Stat, ListDir, MakeDir, Move,
// Remove and WatchDir in Connect's JSON protocol, GET and POST /files (gzip both ways, signed
// URLs), and GET /health. Each command runs
// in the sandbox kernel's jail (kernel::JailCommand, jail/README.md "Exec into a running jail");
// pids are the jail's. What differs from E2B's envd is in docs/e2b.md.
//
//   envd::EnvdOptions o;
//   o.find = [&](std::string_view id) -> std::optional<envd::SandboxTarget> { … };
//   o.jail_of = [&](const std::string& kernel_id) { return registry.jail_target(kernel_id); };
//   o.offload = engine.offload();
//   envd::EnvdApi envd(std::move(o));     // an http::Handler
//
// A request names its sandbox with the E2b-Sandbox-Id header (E2B_SANDBOX_URL mode); an unknown
// one is Connect's not_found (HTTP 404), and /health answers 502 for it, as E2B's proxy does for
// a sandbox that is gone. A sandbox with an access token wants it in X-Access-Token
// (unauthenticated otherwise), or, on /files, a signature made with it (signature.hpp).
//
// Thread-safety: an http::Handler; every method may be called from any thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cellgate/http/handler.hpp"
#include "cellgate/http/router.hpp"
#include "cellgate/kernel/kernel.hpp"
#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::envd {

// The sandbox a request is for. The control plane (gateway/sandboxes) provides these.
struct SandboxTarget {
  std::string sandbox_id, kernel_id, access_token /* "" = none */, tenant;
  bool running = false;
};

struct EnvdOptions {
  std::function<std::optional<SandboxTarget>(std::string_view sandbox_id)> find;
  // Every sandbox of the control plane: a signed /files URL carries no E2b-Sandbox-Id (with
  // E2B_SANDBOX_URL), so its sandbox is the one whose access token its signature checks with.
  // Unset: signed URLs need the header.
  std::function<std::vector<SandboxTarget>()> all;
  // The jail of a sandbox's kernel, to run commands in.
  std::function<Result<kernel::JailTarget>(const std::string& kernel_id)> jail_of;
  util::Offload offload;           // where a command's start (a launcher spawn) waits
  std::size_t max_processes = 64;  // live processes per sandbox
  std::size_t max_watches = 16;    // live WatchDir streams per sandbox
  // The most a gzip upload (Content-Encoding: gzip) may inflate to: the listener's body limit.
  std::size_t max_upload_bytes = 16u << 20;
  // E2B's `base` conventions: commands start here with HOME here, USER and LOGNAME this user.
  std::string home = "/home/user";
  std::string user = "user";
};

class Process;
class DirWatch;

class EnvdApi : public http::Handler {
 public:
  explicit EnvdApi(EnvdOptions options);
  ~EnvdApi() override;  // kills every process it started
  EnvdApi(const EnvdApi&) = delete;
  EnvdApi& operator=(const EnvdApi&) = delete;

  void handle(http::Request req, std::shared_ptr<http::Exchange> exchange) override;
  http::Upgrade upgrade(const http::Request& req) override;

 private:
  struct Call;
  void start(Call& call);
  void connect(Call& call);
  void list(Call& call);
  void send_input(Call& call);
  void close_stdin(Call& call);
  void send_signal(Call& call);
  void update(Call& call);
  // filesystem.cpp: Stat, ListDir, MakeDir, Move, Remove, each run in the sandbox's jail.
  void filesystem(Call& call, const std::string& method);
  // watch.cpp: WatchDir, a stream of the sandbox's directory's events.
  void watch_dir(Call& call);
  // The sandbox a request is for, and whether it may act on it: X-Access-Token, or a signed
  // /files URL (signature.hpp); else the reply is sent and nullopt returned.
  std::optional<SandboxTarget> authorize(const http::Request& req, const http::Target& target,
                                         http::Exchange& exchange);
  // files.cpp: GET and POST /files?path=…, run in the sandbox's jail.
  void files(http::Request req, std::shared_ptr<http::Exchange> ex, const SandboxTarget& sandbox,
             const std::string& path);
  void read_file(const http::Request& req, const std::shared_ptr<http::Exchange>& ex,
                 const std::string& kernel_id, const std::string& path);
  // The process a request's {"process": {"pid"|"tag"}} names in the call's sandbox.
  Result<std::shared_ptr<Process>> select(const Call& call, const nlohmann::json& selector);
  bool sandbox_alive(const std::string& sandbox_id) const;

  const EnvdOptions options_;
  Mutex mu_;
  // kernel id → pid → process
  std::map<std::string, std::map<pid_t, std::shared_ptr<Process>>> processes_
      CELLGATE_GUARDED_BY(mu_);
  // kernel id → its live WatchDir streams
  std::map<std::string, std::map<DirWatch*, std::shared_ptr<DirWatch>>> watches_
      CELLGATE_GUARDED_BY(mu_);
};

}  // namespace cellgate::envd
