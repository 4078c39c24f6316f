// cellgate: the Jupyter kernel gateway. The composition root: parses the command line (flags,
// CELLGATE_* environment variables, an optional config file) and hands each subcommand its
// options.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "cellgate/cli/exec.hpp"
#include "cellgate/cli/mcp.hpp"
#include "cellgate/notebooks/run.hpp"
#include "cellgate/server/server.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cellgate: jailed Jupyter kernels for JupyterLab, agents and notebook runs"};
  app.require_subcommand(1);

  cellgate::cli::ExecOptions exec;
  auto* exec_cmd = cellgate::cli::add_exec_command(app, exec);
  cellgate::notebooks::NotebookRunOptions run;
  auto* run_cmd = cellgate::notebooks::add_run_command(app, run);
  cellgate::cli::McpOptions mcp;
  auto* mcp_cmd = cellgate::cli::add_mcp_command(app, mcp);

  cellgate::server::ServeOptions serve;
  auto* serve_cmd = app.add_subcommand(
      "serve", "serve the Jupyter Kernel Gateway API (HTTP + WebSocket) with jailed kernels");
  serve_cmd->set_config("--config", "", "read options from this TOML/INI file");
  serve_cmd->add_option("--ip", serve.ip, "address to listen on")
      ->envname("CELLGATE_IP")
      ->capture_default_str();
  serve_cmd->add_option("--port", serve.port, "port (0: any free one)")
      ->envname("CELLGATE_PORT")
      ->capture_default_str();
  serve_cmd->add_option("--token", serve.token, "API token (default: a random one, printed once)")
      ->envname("CELLGATE_TOKEN");
  serve_cmd->add_option(
      "--state-dir", serve.state_dir,
      "state directory (default: $CELLGATE_STATE_DIR or ~/.local/state/cellgate)");
  serve_cmd->add_option("--base-url", serve.base_url, "URL prefix of every route")
      ->envname("CELLGATE_BASE_URL")
      ->capture_default_str();
  serve_cmd->add_option("--max-kernels", serve.max_kernels, "kernels that may run at once")
      ->envname("CELLGATE_MAX_KERNELS")
      ->capture_default_str();
  serve_cmd
      ->add_option("--cull-idle-timeout", serve.cull_idle_timeout,
                   "shut down kernels idle this many seconds (0: never)")
      ->envname("CELLGATE_CULL_IDLE_TIMEOUT")
      ->capture_default_str();
  serve_cmd->add_option("--cull-interval", serve.cull_interval, "seconds between cull checks")
      ->capture_default_str();
  serve_cmd->add_flag("--cull-connected", serve.cull_connected,
                      "also cull kernels with open WebSockets");
  serve_cmd->add_flag("--cull-busy", serve.cull_busy, "also cull busy kernels");
  serve_cmd
      ->add_option("--allow-origin", serve.allow_origins,
                   "browser origins allowed (repeat; '*' for any)")
      ->envname("CELLGATE_ALLOW_ORIGIN");
  serve_cmd->add_option("--certfile", serve.certfile, "TLS certificate chain (PEM)")
      ->envname("CELLGATE_CERTFILE");
  serve_cmd->add_option("--keyfile", serve.keyfile, "TLS private key (PEM)")
      ->envname("CELLGATE_KEYFILE");
  serve_cmd->add_option("--max-body-bytes", serve.max_body_bytes, "largest request body")
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-control-body-bytes", serve.max_control_body_bytes,
                   "largest request body of kernel/session/context control routes")
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-connections", serve.max_connections,
                   "open client connections before new ones get 503 (0: 3/4 of the "
                   "open-file limit, at most 4096)")
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-ws-message-bytes", serve.max_ws_message_bytes,
                   "largest WebSocket message from a client")
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-ws-queue-bytes", serve.max_ws_queue_bytes,
                   "unsent bytes for one WebSocket before that client is disconnected")
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-ws-total-bytes", serve.max_ws_total_bytes,
                   "bytes held for all WebSocket clients together (unsent output, "
                   "unfinished messages); over it the one holding the most is dropped "
                   "(0: no global cap)")
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-kernel-message-bytes", serve.max_kernel_message_bytes,
                   "largest message frame taken from a kernel; a larger output is dropped "
                   "and the clients are told")
      ->capture_default_str();
  serve_cmd
      ->add_option("--ws-ping-interval", serve.ws_ping_interval,
                   "WebSocket keepalive ping seconds (0: off)")
      ->capture_default_str();
  serve_cmd->add_option("--env-allow", serve.env_allowlist,
                        "client env names passed to kernels besides KERNEL_* (repeat)");
  serve_cmd
      ->add_option("--kernel-uid-base", serve.kernel_uid_base,
                   "first uid of the host's kernel uid ranges (jail/README.md)")
      ->capture_default_str();
  serve_cmd
      ->add_option("--kernel-uid-range-size", serve.kernel_uid_range_size,
                   "uids in each gateway's range")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve_cmd
      ->add_option("--kernel-uid-ranges", serve.kernel_uid_ranges,
                   "ranges on the host: gateways (and notebook runs) at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve_cmd
      ->add_option("--heartbeat-timeout", serve.heartbeat_timeout,
                   "seconds a kernel may leave heartbeats unanswered while its process uses "
                   "no CPU before it is declared dead and restarted (a kernel busy at its "
                   "CPU quota, e.g. starved by its own cell's workers, is never restarted)")
      ->envname("CELLGATE_HEARTBEAT_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve_cmd
      ->add_option("--kernel-start-timeout", serve.kernel_start_timeout,
                   "seconds a kernel may take to start: its launcher building the jail, "
                   "then its first kernel_info answer (Enterprise Gateway's "
                   "KERNEL_LAUNCH_TIMEOUT; raise it on slow or emulated hosts)")
      ->envname("CELLGATE_KERNEL_START_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve_cmd
      ->add_option("--restart-limit", serve.restart_limit,
                   "automatic restarts of a dying kernel before it is left dead")
      ->capture_default_str();
  bool no_chart_data = false;
  serve_cmd->add_flag("--no-chart-data", no_chart_data,
                      "no chart/data display formatters in python kernels: agents and E2B get "
                      "no `chart`/`data`, and notebooks saved by Jupyter clients get only "
                      "ipykernel's own MIME types");
  serve.pool_size = 2;  // ServeOptions' own default is 0 (off) for embedding code and tests
  serve_cmd
      ->add_option("--pool-size", serve.pool_size,
                   "ready kernels kept per pooled kernelspec, claimed by new kernels that "
                   "ask for no env (0: off; they count towards --max-kernels)")
      ->envname("CELLGATE_POOL_SIZE")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  serve.pool_max = 8;  // like --pool-size: 0 (a fixed size) in ServeOptions
  serve_cmd
      ->add_option("--pool-max", serve.pool_max,
                   "ready kernels kept per pooled kernelspec at most while recent starts "
                   "ask for more than --pool-size: the most starts within one refill time "
                   "in the last minute (at most --pool-size: a fixed size)")
      ->envname("CELLGATE_POOL_MAX")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  serve_cmd
      ->add_option("--pool-parallel", serve.pool_parallel,
                   "pool kernels started at once to refill it, at most (0: one per CPU; "
                   "one fewer for each client start in flight, never below 1)")
      ->envname("CELLGATE_POOL_PARALLEL")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  serve_cmd->add_option("--pool-kernel", serve.pool_kernels,
                        "a kernelspec to pool (repeat; default: the default kernelspec)");
  serve.zygote = true;  // off in ServeOptions, like the pool
  bool no_zygote = false;
  serve_cmd
      ->add_flag("--no-zygote", no_zygote,
                 "start every kernel cold instead of forking python3 kernels from the "
                 "zygote (a preloaded fork server)")
      ->envname("CELLGATE_NO_ZYGOTE");
  serve_cmd
      ->add_option("--zygote-preload", serve.zygote_preload,
                   "modules the zygote imports, comma-separated (default: ipykernel, "
                   "IPython, numpy, pandas, matplotlib)")
      ->delimiter(',');
  serve_cmd
      ->add_option("--execute-max-timeout", serve.execute_max_timeout,
                   "longest timeout an execute request may ask for (seconds)")
      ->capture_default_str();
  serve_cmd
      ->add_option("--execute-grace", serve.execute_grace,
                   "seconds between a timed-out cell's interrupt and its kernel's restart")
      ->capture_default_str();
  serve_cmd
      ->add_option("--execute-stream-bytes", serve.execute_stream_bytes,
                   "stdout and stderr kept per executed cell, each")
      ->capture_default_str();
  serve_cmd
      ->add_option("--execute-output-bytes", serve.execute_output_bytes,
                   "largest single output kept per executed cell")
      ->capture_default_str();
  serve_cmd
      ->add_option("--execute-keepalive", serve.execute_keepalive,
                   "seconds between keepalive events of a streamed execute answer")
      ->capture_default_str();
  serve_cmd
      ->add_option("--artifacts-per-kernel", serve.artifacts_per_kernel,
                   "images and PDFs kept per kernel")
      ->capture_default_str();
  serve_cmd
      ->add_option("--artifact-bytes-per-kernel", serve.artifact_bytes_per_kernel,
                   "artifact bytes kept per kernel")
      ->capture_default_str();
  serve_cmd
      ->add_option("--max-file-bytes", serve.max_file_bytes,
                   "largest file read or written through the files API")
      ->capture_default_str();
  serve_cmd
      ->add_option("--audit-log", serve.audit_log,
                   "audit log file (default <state-dir>/audit.log; 'off' for none)")
      ->envname("CELLGATE_AUDIT_LOG");
  serve_cmd
      ->add_option("--audit-max-bytes", serve.audit_max_bytes,
                   "audit log size before it is rotated")
      ->capture_default_str();
  serve_cmd->add_option("--audit-keep", serve.audit_keep, "rotated audit logs kept")
      ->capture_default_str();
  serve_cmd->add_option(
      "--audit-redact", serve.audit_redact,
      "another secret pattern (RE2 syntax: no back-references or lookaround) to redact (repeat)");
  serve_cmd
      ->add_option("--e2b-port", serve.e2b_port,
                   "also serve E2B-compatible endpoints on this port (0: off; E2B's SDK in "
                   "debug mode uses 49999)")
      ->envname("CELLGATE_E2B_PORT")
      ->capture_default_str();
  serve_cmd->add_flag("--e2b-no-token", serve.e2b_no_token,
                      "accept E2B requests without a token, as E2B's SDK in debug mode sends "
                      "none (only with a loopback --ip)");
  serve_cmd->add_option("--memory", serve.jail.memory_bytes, "per-kernel memory limit (bytes)")
      ->capture_default_str();
  serve_cmd->add_option("--cpus", serve.jail.cpus, "per-kernel CPU quota")->capture_default_str();
  serve_cmd->add_option("--pids", serve.jail.pids, "per-kernel process limit")
      ->capture_default_str();
  serve_cmd
      ->add_option("--optional-limits", serve.jail.optional,
                   "jail limits a kernel may start without when this host cannot enforce "
                   "them (comma-separated: memory, swap, pids, cpu, work_size, landlock; "
                   "default: none — a limit the host lacks stops the kernel, naming it)")
      ->delimiter(',')
      ->envname("CELLGATE_OPTIONAL_LIMITS");
  serve_cmd
      ->add_option("--cgroup-parent", serve.cgroup_parent,
                   "cgroup v2: a cgroup delegated to the gateway (e.g. "
                   "/system.slice/cellgate-kernels.slice) to make kernels' cgroups below; "
                   "default: the gateway's own, moving itself into a leaf 'gateway' of it "
                   "when systemd delegated it (Delegate=yes)")
      ->envname("CELLGATE_CGROUP_PARENT");
  serve_cmd
      ->add_option("--user", serve.user,
                   "started as root: run everything that speaks HTTP as this user (a name, "
                   "or uid[:gid]) with no capabilities, and start kernels in a small "
                   "privileged broker that takes only narrow requests (privilege "
                   "separation). The state dir then defaults to /var/lib/cellgate")
      ->envname("CELLGATE_USER");
  serve_cmd->add_flag("--no-jail", serve.no_jail,
                      "run kernels UNJAILED (never with untrusted code)");
  serve_cmd->add_flag("--keep-kernels", serve.keep_kernels,
                      "on SIGTERM/SIGINT leave the client kernels running for the next gateway "
                      "on this --state-dir to adopt (SIGUSR2 always does; a restart or upgrade "
                      "keeps every session)");
  serve_cmd->add_option("--threads", serve.threads, "network threads")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    // Every subcommand documents exit code 2 for usage errors (--help still exits 0).
    return code != 0 ? 2 : code;
  }
  // exec and run write a cell's output and a notebook run's results to stdout: their log goes
  // to stderr, so a pipe gets only what was asked for.
  if (exec_cmd->parsed()) {
    spdlog::set_default_logger(spdlog::stderr_logger_mt("cellgate"));
    return cellgate::cli::run_exec(exec);
  }
  if (run_cmd->parsed()) {
    spdlog::set_default_logger(spdlog::stderr_logger_mt("cellgate"));
    return cellgate::notebooks::run_notebooks(run);
  }
  if (mcp_cmd->parsed()) {
    return cellgate::cli::run_mcp(mcp);
  }
  if (serve_cmd->parsed()) {
    serve.zygote = !no_zygote;
    serve.chart_data = !no_chart_data;
    return cellgate::server::run_serve(std::move(serve));
  }
  return 2;
}
