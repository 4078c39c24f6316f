// `cellgate mcp`: the composition root of the stdio MCP server. Embedded, it builds an engine in
// this process (engine/engine.hpp, as server.cpp does for `cellgate serve`);
// with --url it talks to a running gateway. Either way mcp::Server serves the tools and
// mcp::serve_stdio the transport.
#include "cellgate/cli/mcp.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>  // mkdtemp
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "cellgate/cli/exit_codes.hpp"
#include "cellgate/client/kernels.hpp"
#include "cellgate/engine/engine.hpp"
#include "cellgate/engine/host.hpp"
#include "cellgate/mcp/server.hpp"
#include "cellgate/mcp/stdio.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::cli {
namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;

constexpr int kOffloadThreads = 16;  // kernel starts, file I/O, remote cells (each waits)

int mcp_usage_error(const std::string& what) {
  std::cerr << "cellgate mcp: " << what << "\n";
  return kExitUsage;
}

// The embedded gateway: an engine (what `cellgate serve` composes, minus the listeners). State
// lives in --state-dir, or in a temp dir removed when this is destroyed.
class Embedded {
 public:
  static Result<std::unique_ptr<Embedded>> make(const McpOptions& o) {
    // Before anything is made: it can fail, and it moves this process.
    engine::HostOptions host;
    host.jailed = !o.no_jail;
    host.report = [](engine::HostStep step, const std::string& line) {
      if (step == engine::HostStep::kProbe) {
        spdlog::info("mcp: host: {}", line);
      } else if (step == engine::HostStep::kPlaceCgroups) {
        spdlog::info("mcp: cgroups: {}", line);
      }
    };
    CELLGATE_ASSIGN_OR_RETURN(const auto prepared, engine::prepare_host(host));
    std::string dir = o.state_dir;
    bool temporary = false;
    if (dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/cellgate-mcp-XXXXXX";
      if (::mkdtemp(dir.data()) == nullptr) {
        return errno_error(ErrorCode::kInternal, "temp_dir", "mkdtemp('" + dir + "')", errno);
      }
      temporary = true;
    }
    auto e = std::unique_ptr<Embedded>(new Embedded(dir, temporary));
    engine::EngineOptions options;
    kernels::RegistryOptions& r = options.registry;
    r.state_dir = dir;
    r.max_kernels = o.max_kernels;
    r.no_jail = o.no_jail;
    r.jail.cgroup_parent = prepared.cgroup_parent;
    if (o.memory_bytes != 0) {
      r.jail.memory_bytes = o.memory_bytes;
    }
    if (o.cpus > 0) {
      r.jail.cpus = o.cpus;
    }
    if (o.pids != 0) {
      r.jail.pids = static_cast<std::int64_t>(o.pids);
    }
    // Agents get a figure's data beside its PNG, as from `cellgate serve`.
    r.display_formatters = true;
    options.audit.path = o.audit_log;  // "": no audit log
    options.limits.stream_bytes = o.execute_stream_bytes;
    options.limits.output_bytes = o.execute_output_bytes;
    options.limits.grace =
        std::chrono::milliseconds(static_cast<long long>(o.execute_grace * 1000));
    options.offload_threads = kOffloadThreads;
    options.cell_threads = 1;
    // The launcher, no zygote.
    CELLGATE_ASSIGN_OR_RETURN(e->engine_, engine::Engine::create(std::move(options)));
    e->engine_->start();  // threads start here, not in a constructor
    return e;
  }

  ~Embedded() {
    engine_.reset();  // engine.hpp's teardown, before its state dir goes
    if (temporary_) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
      if (ec) {
        std::cerr << "cellgate mcp: cannot remove " << dir_ << ": " << ec.message() << "\n";
      }
    }
  }

  util::Offload offload() { return engine_->offload(); }
  kernels::KernelRegistry& registry() { return engine_->registry(); }
  execute::Executor& executor() { return engine_->executor(); }
  // Blocking work still queued (a close's shutdowns) finishes before the parts go.
  void drain() { engine_->stop(); }

 private:
  Embedded(std::string dir, bool temporary) : dir_(std::move(dir)), temporary_(temporary) {}

  const std::string dir_;
  const bool temporary_;
  std::unique_ptr<engine::Engine> engine_;
};

// SIGINT, SIGTERM and SIGHUP (an MCP client closing down) end the stdio loop through a pipe.
// The signals are blocked in every thread (the mask is inherited, so block before any starts)
// and taken by one sigwait thread.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGHUP);
    sigaddset(&set_, SIGUSR1);  // the destructor's wake-up (kernels are spawned with none blocked)
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) == 0) {
      read_.reset(fds[0]);
      write_.reset(fds[1]);
    }
    thread_ = std::thread([this] {
      int sig = 0;
      while (sigwait(&set_, &sig) == 0) {
        if (sig == SIGUSR1) {
          return;  // the destructor's wake-up
        }
        spdlog::info("mcp: signal {}", sig);
        const char byte = 1;
        (void)!::write(write_.get(), &byte, 1);
      }
    });
  }
  ~StopSignals() {
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  int fd() const { return read_.get(); }

 private:
  sigset_t set_ = [] {
    sigset_t s;
    sigemptyset(&s);
    return s;
  }();
  UniqueFd read_;
  UniqueFd write_;
  std::thread thread_;
};

}  // namespace

CLI::App* add_mcp_command(CLI::App& app, McpOptions& o) {
  auto* cmd = app.add_subcommand(
      "mcp", "serve the Model Context Protocol on stdin/stdout: agents run code in jailed kernels");
  cmd->add_option("--url", o.url,
                  "use this running gateway's kernels (http[s]://host:port) instead of starting "
                  "them here")
      ->envname("CELLGATE_URL");
  cmd->add_option("--token", o.token, "the gateway's token")->envname("CELLGATE_TOKEN");
  cmd->add_option("--max-sessions", o.max_sessions, "sessions (kernels) a client may keep open")
      ->capture_default_str();
  cmd->add_flag("--no-jail", o.no_jail, "run kernels UNJAILED (never with untrusted code)");
  cmd->add_option("--state-dir", o.state_dir,
                  "kernel records, work dirs and artifacts (default: a temp dir, removed at exit)");
  cmd->add_option("--max-kernels", o.max_kernels, "kernels that may run at once")
      ->capture_default_str();
  cmd->add_option("--execute-max-timeout", o.execute_max_timeout,
                  "longest timeout a cell may ask for (seconds)")
      ->capture_default_str();
  cmd->add_option(
         "--execute-grace", o.execute_grace,
         "seconds between a timed-out cell's interrupt and its kernel's restart (up to 3 more "
         "while the kernel keeps using CPU)")
      ->capture_default_str();
  cmd->add_option("--execute-stream-bytes", o.execute_stream_bytes,
                  "stdout and stderr kept per cell, each")
      ->capture_default_str();
  cmd->add_option("--execute-output-bytes", o.execute_output_bytes,
                  "largest single output kept per cell")
      ->capture_default_str();
  cmd->add_option("--max-file-bytes", o.max_file_bytes, "largest file read or written")
      ->capture_default_str();
  cmd->add_option("--audit-log", o.audit_log, "write an audit line per cell to this file");
  cmd->add_option("--memory", o.memory_bytes, "per-kernel memory limit (bytes; default 1 GiB)");
  cmd->add_option("--cpus", o.cpus, "per-kernel CPU quota (default 1)");
  cmd->add_option("--pids", o.pids, "per-kernel process limit (default 256)");
  return cmd;
}

int run_mcp(const McpOptions& options) {
  // stdout is the protocol's: logs go to stderr, and fd 1 itself is pointed at stderr so that
  // nothing else in the process can write a stray line into the MCP stream.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("cellgate-mcp"));
  const int out_fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (out_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    return mcp_usage_error("cannot set stdout aside for MCP messages");
  }
  UniqueFd out(out_fd);
  std::signal(SIGPIPE, SIG_IGN);  // a client that closed its end is an EPIPE, not a crash
  StopSignals stop;

  mcp::ServerOptions server_options;
  server_options.max_sessions = options.max_sessions;
  client::Options ko;
  ko.max_timeout = options.execute_max_timeout;
  ko.max_file_bytes = options.max_file_bytes;
  ko.client = "cellgate mcp";

  if (!options.url.empty()) {
    auto url = http::client::parse_url(options.url);
    if (!url) {
      return mcp_usage_error(url.error().message);
    }
    net::thread_pool pool(kOffloadThreads);
    util::Offload offload = [&pool](std::function<void()> fn) { net::post(pool, std::move(fn)); };
    auto kernels = client::make_remote(std::move(url).value(), options.token, ko, offload);
    if (!kernels) {
      return mcp_usage_error(kernels.error().message);
    }
    spdlog::info("mcp: serving the kernels of {}", options.url);
    mcp::Server server(**kernels, offload, server_options);
    const int status = mcp::serve_stdio(server, STDIN_FILENO, out.get(), stop.fd());
    pool.join();  // the answers still on their way, then the parts they use
    return status == 0 ? kExitOk : kExitUsage;
  }

  if (options.no_jail) {
    spdlog::warn("--no-jail: kernels run UNJAILED, as this user; do not give them untrusted code");
  }
  // Declared before the embedded gateway, so destroyed after it: a cell that ends while the
  // gateway shuts down still calls back into the tools.
  std::unique_ptr<client::Kernels> kernels;
  std::optional<mcp::Server> server;
  auto embedded = Embedded::make(options);
  if (!embedded) {
    return mcp_usage_error(embedded.error().describe());
  }
  auto& e = **embedded;
  kernels = client::make_local(e.registry(), e.executor(), ko);
  server.emplace(*kernels, e.offload(), server_options);
  const int status = mcp::serve_stdio(*server, STDIN_FILENO, out.get(), stop.fd());
  e.drain();  // the shutdowns a close queued, before the parts go
  return status == 0 ? kExitOk : kExitUsage;
}

}  // namespace cellgate::cli
