// `cellgate serve`'s options (cellgate/cli/serve.hpp): one add_option per ServeOptions field,
// then what every option gets alike (an environment name, units for sizes).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "cellgate/cli/serve.hpp"

namespace cellgate::cli {
namespace {

// CELLGATE_<NAME> from --name: upper case, '-' → '_'.
std::string env_name(const std::string& long_name) {
  std::string name = "CELLGATE_";
  for (char c : long_name) {
    name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

// Options whose values are byte counts: they take units (2G, 512M, 64k; powers of 1024).
bool is_size(const std::string& long_name) {
  return long_name == "memory" || long_name.ends_with("-bytes") ||
         long_name == "hibernate-disk-max" || long_name == "artifact-bytes-per-kernel";
}

}  // namespace

CLI::App* add_serve_command(CLI::App& app, ServeCommandLine& serve) {
  server::ServeOptions& o = serve.options;
  auto* cmd = app.add_subcommand(
      "serve", "serve the Jupyter Kernel Gateway API (HTTP + WebSocket) with jailed kernels");
  cmd->set_config("--config", "",
                  "read options from this TOML file (repeat: a later one wins; default: "
                  "/etc/cellgate/cellgate.toml, then ~/.config/cellgate/cellgate.toml)")
      ->expected(1, 16);
  cmd->add_flag("--print-config", serve.print_config,
                "print the effective configuration (a TOML file, each value's source in a "
                "comment; the token hidden) and exit");
  cmd->add_option("--ip", o.ip, "address to listen on")
      ->envname("CELLGATE_IP")
      ->capture_default_str();
  cmd->add_option("--port", o.port, "port (0: any free one)")
      ->envname("CELLGATE_PORT")
      ->capture_default_str();
  cmd->add_option("--token", o.token, "API token (default: a random one, printed once)")
      ->envname("CELLGATE_TOKEN");
  cmd->add_option("--state-dir", o.state_dir,
                  "state directory (default: $CELLGATE_STATE_DIR or ~/.local/state/cellgate)");
  cmd->add_option("--base-url", o.base_url, "URL prefix of every route")
      ->envname("CELLGATE_BASE_URL")
      ->capture_default_str();
  cmd->add_option("--max-kernels", o.max_kernels, "kernels that may run at once")
      ->envname("CELLGATE_MAX_KERNELS")
      ->capture_default_str();
  cmd->add_option("--cull-idle-timeout", o.cull_idle_timeout,
                  "shut down kernels idle this many seconds (0: never)")
      ->envname("CELLGATE_CULL_IDLE_TIMEOUT")
      ->capture_default_str();
  cmd->add_option("--cull-interval", o.cull_interval, "seconds between cull checks")
      ->capture_default_str();
  cmd->add_option("--hibernate-after", o.hibernate_after,
                  "hibernate kernels idle this many seconds (CRIU; 0: never): their processes "
                  "end, their state waits on disk, the first touch resumes them")
      ->capture_default_str();
  cmd->add_option("--hibernate-disk-max", o.hibernate_disk_max,
                  "bytes the hibernated kernels' images may take together, with units (4G); a "
                  "hibernation that could pass it is refused with 507 (0: no limit)")
      ->capture_default_str();
  cmd->add_flag("--hibernate-on-stop", o.hibernate_on_stop,
                "on SIGTERM/SIGINT hibernate every kernel that can (the next gateway on this "
                "--state-dir resumes each on first use); the others end");
  cmd->add_flag("--checkpoint-without-landlock", o.checkpoint_without_landlock,
                "allow hibernate, snapshots and fork although CRIU cannot save Landlock: a "
                "restored kernel keeps its namespaces, seccomp, uid and cgroup but runs without "
                "its Landlock layer (without this flag checkpoints answer 501)");
  cmd->add_flag("--cull-connected", o.cull_connected, "also cull kernels with open WebSockets");
  cmd->add_flag("--cull-busy", o.cull_busy, "also cull busy kernels");
  cmd->add_option("--allow-origin", o.allow_origins,
                  "browser origins allowed (repeat, or comma-separated; '*' for any)")
      ->delimiter(',')
      ->envname("CELLGATE_ALLOW_ORIGIN");
  cmd->add_option("--certfile", o.certfile, "TLS certificate chain (PEM)")
      ->envname("CELLGATE_CERTFILE");
  cmd->add_option("--keyfile", o.keyfile, "TLS private key (PEM)")->envname("CELLGATE_KEYFILE");
  cmd->add_option("--client-ca", o.client_ca,
                  "CA certificate (PEM): clients must present a certificate it signed "
                  "(mutual TLS; needs --certfile and --keyfile)");
  cmd->add_option("--default-kernel", o.default_kernel,
                  "kernelspec started when a request names none (default: python3, else the "
                  "first one found)");
  cmd->add_option("--max-body-bytes", o.max_body_bytes, "largest request body")
      ->capture_default_str();
  cmd->add_option("--max-control-body-bytes", o.max_control_body_bytes,
                  "largest request body of kernel/session/context control routes")
      ->capture_default_str();
  cmd->add_option("--max-connections", o.max_connections,
                  "open client connections before new ones get 503 (0: 3/4 of the "
                  "open-file limit, at most 4096)")
      ->capture_default_str();
  cmd->add_option("--max-ws-message-bytes", o.max_ws_message_bytes,
                  "largest WebSocket message from a client")
      ->capture_default_str();
  cmd->add_option("--max-ws-queue-bytes", o.max_ws_queue_bytes,
                  "unsent bytes for one WebSocket before that client is disconnected")
      ->capture_default_str();
  cmd->add_option("--max-ws-total-bytes", o.max_ws_total_bytes,
                  "bytes held for all WebSocket clients together (unsent output, "
                  "unfinished messages); over it the one holding the most is dropped "
                  "(0: no global cap)")
      ->capture_default_str();
  cmd->add_option("--max-kernel-message-bytes", o.max_kernel_message_bytes,
                  "largest message frame taken from a kernel; a larger output is dropped "
                  "and the clients are told")
      ->capture_default_str();
  cmd->add_option("--ws-ping-interval", o.ws_ping_interval,
                  "WebSocket keepalive ping seconds (0: off)")
      ->capture_default_str();
  cmd->add_option("--env-allow", o.env_allowlist,
                  "client env names passed to kernels besides KERNEL_* (repeat, or "
                  "comma-separated)")
      ->delimiter(',');
  cmd->add_option("--kernel-uid-base", o.kernel_uid_base,
                  "first uid of the host's kernel uid ranges (jail/README.md)")
      ->capture_default_str();
  cmd->add_option("--kernel-uid-range-size", o.kernel_uid_range_size,
                  "uids in each gateway's range")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--kernel-uid-ranges", o.kernel_uid_ranges,
                  "ranges on the host: gateways (and notebook runs) at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--heartbeat-timeout", o.heartbeat_timeout,
                  "seconds a kernel may leave heartbeats unanswered while its process uses "
                  "no CPU before it is declared dead and restarted (a kernel busy at its "
                  "CPU quota, e.g. starved by its own cell's workers, is never restarted)")
      ->envname("CELLGATE_HEARTBEAT_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--kernel-start-timeout", o.kernel_start_timeout,
                  "seconds a kernel may take to start: its launcher building the jail, "
                  "then its first kernel_info answer (Enterprise Gateway's "
                  "KERNEL_LAUNCH_TIMEOUT; raise it on slow or emulated hosts)")
      ->envname("CELLGATE_KERNEL_START_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--restart-limit", o.restart_limit,
                  "automatic restarts of a dying kernel before it is left dead")
      ->capture_default_str();
  cmd->add_flag("--no-chart-data", serve.no_chart_data,
                "no chart/data display formatters in python kernels: agents and E2B get "
                "no `chart`/`data`, and notebooks saved by Jupyter clients get only "
                "ipykernel's own MIME types");
  o.pool_size = 2;  // ServeOptions' own default is 0 (off) for embedding code and tests
  cmd->add_option("--pool-size", o.pool_size,
                  "ready kernels kept per pooled kernelspec, claimed by new kernels that "
                  "ask for no env (0: off; they count towards --max-kernels)")
      ->envname("CELLGATE_POOL_SIZE")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  o.pool_max = 8;  // like --pool-size: 0 (a fixed size) in ServeOptions
  cmd->add_option("--pool-max", o.pool_max,
                  "ready kernels kept per pooled kernelspec at most while recent starts "
                  "ask for more than --pool-size: the most starts within one refill time "
                  "in the last minute (at most --pool-size: a fixed size)")
      ->envname("CELLGATE_POOL_MAX")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--pool-parallel", o.pool_parallel,
                  "pool kernels started at once to refill it, at most (0: one per CPU; "
                  "one fewer for each client start in flight, never below 1)")
      ->envname("CELLGATE_POOL_PARALLEL")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--pool-kernel", o.pool_kernels,
                  "a kernelspec to pool (repeat; default: the default kernelspec)");
  o.zygote = true;  // off in ServeOptions, like the pool
  cmd->add_flag("--no-zygote", serve.no_zygote,
                "start every kernel cold instead of forking python3 kernels from the "
                "zygote (a preloaded fork server)")
      ->envname("CELLGATE_NO_ZYGOTE");
  cmd->add_option("--zygote-preload", o.zygote_preload,
                  "modules the zygote imports, comma-separated (default: ipykernel, "
                  "IPython, numpy, pandas, matplotlib)")
      ->delimiter(',');
  cmd->add_option("--execute-max-timeout", o.execute_max_timeout,
                  "longest timeout an execute request may ask for (seconds)")
      ->capture_default_str();
  cmd->add_option(
         "--execute-grace", o.execute_grace,
         "seconds between a timed-out cell's interrupt and its kernel's restart (up to 3 more "
         "while the kernel keeps using CPU)")
      ->capture_default_str();
  cmd->add_option("--execute-stream-bytes", o.execute_stream_bytes,
                  "stdout and stderr kept per executed cell, each")
      ->capture_default_str();
  cmd->add_option("--execute-output-bytes", o.execute_output_bytes,
                  "largest single output kept per executed cell")
      ->capture_default_str();
  cmd->add_option("--execute-keepalive", o.execute_keepalive,
                  "seconds between keepalive events of a streamed execute answer")
      ->capture_default_str();
  cmd->add_option("--artifacts-per-kernel", o.artifacts_per_kernel,
                  "images and PDFs kept per kernel")
      ->capture_default_str();
  cmd->add_option("--artifact-bytes-per-kernel", o.artifact_bytes_per_kernel,
                  "artifact bytes kept per kernel")
      ->capture_default_str();
  cmd->add_option("--max-file-bytes", o.max_file_bytes,
                  "largest file read or written through the files API")
      ->capture_default_str();
  cmd->add_option("--audit-log", o.audit_log,
                  "audit log file (default <state-dir>/audit.log; 'off' for none)")
      ->envname("CELLGATE_AUDIT_LOG");
  cmd->add_option("--audit-max-bytes", o.audit_max_bytes, "audit log size before it is rotated")
      ->capture_default_str();
  cmd->add_option("--audit-keep", o.audit_keep, "rotated audit logs kept")->capture_default_str();
  cmd->add_option(
      "--audit-redact", o.audit_redact,
      "another secret pattern (RE2 syntax: no back-references or lookaround) to redact (repeat)");
  cmd->add_option("--e2b-port", o.e2b_port,
                  "also serve E2B-compatible endpoints on this port (0: off; E2B's SDK in "
                  "debug mode uses 49999)")
      ->envname("CELLGATE_E2B_PORT")
      ->capture_default_str();
  cmd->add_option("--node-tag", o.node_tag,
                  "this node's number in a cluster (0-65535, e.g. a StatefulSet's pod "
                  "ordinal): every id minted here begins with it in 4 hex digits, so a router "
                  "finds the node (docs/scale-out.md)")
      ->envname("CELLGATE_NODE_TAG")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--agent-port", o.agent_port,
                  "answer HAProxy's agent-check on this port: 'ready NN%' (room left for "
                  "kernels) or 'drain' (0: off)")
      ->envname("CELLGATE_AGENT_PORT")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--peers", o.peers,
                  "the cluster's gateways, host[:port] (comma-separated or repeated; a name "
                  "resolving to all of them, e.g. a headless Service): GET /api/kernels and "
                  "/api/sessions merge their lists (?scope=local: this node's only)")
      ->envname("CELLGATE_PEERS")
      ->delimiter(',');
  cmd->add_option("--move-key-file", o.move_key_file,
                  "a file holding the secret (16+ characters) every node of the cluster "
                  "shares to sign the kernels they move to each other (cellgate drain --move; "
                  "docs/scale-out.md); without it this node neither sends nor takes kernels")
      ->envname("CELLGATE_MOVE_KEY_FILE");
  cmd->add_option("--tenant-max-sandboxes", o.tenant_max_sandboxes,
                  "E2B sandboxes one tenant (an API key of `cellgate keys`) may have at once "
                  "(0: no limit but --max-kernels); more: 429, as E2B answers")
      ->envname("CELLGATE_TENANT_MAX_SANDBOXES")
      ->capture_default_str();
  cmd->add_option("--tenant-max-kernels", o.tenant_max_kernels,
                  "kernels one tenant may have at once through the Jupyter and agent routes, "
                  "its E2B sandboxes' counted (0: no limit but --max-kernels); more: 403")
      ->envname("CELLGATE_TENANT_MAX_KERNELS")
      ->capture_default_str();
  cmd->add_option("--tenant-max-cpu-seconds", o.tenant_max_cpu_seconds,
                  "CPU-seconds one tenant's kernels and sandboxes (their commands included) may "
                  "use per --tenant-cpu-window, counted from their cgroups (0: no budget); past "
                  "it nothing more starts (403; E2B: 429) and its kernels are throttled to 1% of "
                  "a CPU until the next window")
      ->envname("CELLGATE_TENANT_MAX_CPU_SECONDS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--tenant-cpu-window", o.tenant_cpu_window,
                  "the window of --tenant-max-cpu-seconds, in seconds (fixed windows from the "
                  "Unix epoch: 3600 is each hour of the clock)")
      ->envname("CELLGATE_TENANT_CPU_WINDOW")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--tenant-max-disk-mb", o.tenant_max_disk_mb,
                  "MiB one tenant may hold: each running kernel or sandbox its work dir's cap, "
                  "each paused sandbox and snapshot its image (0: no limit); past it nothing "
                  "more starts, forks or is snapshotted (403; E2B: 429)")
      ->envname("CELLGATE_TENANT_MAX_DISK_MB")
      ->capture_default_str();
  cmd->add_option("--e2b-webhook", o.e2b_webhooks,
                  "POST E2B's sandbox lifecycle events (created, paused, resumed, snapshotted, "
                  "killed) as JSON to this URL (repeat for more), signed: X-Cellgate-Signature "
                  "sha256=HMAC-SHA256(secret, body)")
      ->envname("CELLGATE_E2B_WEBHOOKS")
      ->delimiter(',');
  cmd->add_option("--e2b-webhook-secret-file", o.e2b_webhook_secret_file,
                  "a file holding the webhooks' signing secret (16+ characters)")
      ->envname("CELLGATE_E2B_WEBHOOK_SECRET_FILE");
  cmd->add_flag("--e2b-no-token", o.e2b_no_token,
                "accept E2B requests without a token, as E2B's SDK in debug mode sends "
                "none (only with a loopback --ip)");
  cmd->add_option("--api", o.api,
                  "which API to serve: jupyter-websocket (the Jupyter REST and WebSocket API, "
                  "the agent API, E2B, MCP) or notebook-http (the --seed notebook's annotated "
                  "cells as HTTP endpoints; Kernel Gateway's module names are accepted too)")
      ->transform(CLI::Transformer(std::map<std::string, std::string>{
          {"kernel_gateway.notebook_http", "notebook-http"},
          {"kernel_gateway.jupyter_websocket", "jupyter-websocket"}}))
      ->check(CLI::IsMember({"jupyter-websocket", "notebook-http"}))
      ->capture_default_str();
  cmd->add_option("--seed", o.seed,
                  "a notebook (.ipynb) whose code cells run in every new kernel of its "
                  "language before a client gets it; with --api notebook-http its annotated "
                  "cells are the endpoints and its other code cells seed the pool's kernels "
                  "(Kernel Gateway's seed_uri; a file, not a URL)");
  cmd->add_option("--prespawn", o.prespawn,
                  "--api notebook-http: kernels in the fixed pool that serves requests (default "
                  "1, or --pool-size when that is given)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--allow-notebook-download", o.allow_notebook_download,
                "--api notebook-http: serve the --seed notebook at /_api/source");
  cmd->add_option("--static-path", o.static_path,
                  "--api notebook-http: serve this directory's files at /public/");
  cmd->add_option("--list-kernels", o.list_kernels,
                  "false: GET /api/kernels and /api/sessions answer 403, as Kernel Gateway's "
                  "default (list_kernels); jupyter_server --gateway-url needs them listed")
      ->capture_default_str();
  cmd->add_option("--force-kernel", o.force_kernel,
                  "every kernel runs this kernelspec, whatever a request or the --seed "
                  "notebook names (Kernel Gateway's force_kernel_name)");
  cmd->add_option("--memory", o.jail.memory_bytes, "per-kernel memory limit (a size: 2G, 512M)")
      ->capture_default_str();
  cmd->add_option("--cpus", o.jail.cpus, "per-kernel CPU quota")->capture_default_str();
  cmd->add_option("--pids", o.jail.pids, "per-kernel process limit")->capture_default_str();
  cmd->add_option("--optional-limits", o.jail.optional,
                  "jail limits a kernel may start without when this host cannot enforce "
                  "them (comma-separated: memory, swap, pids, cpu, work_size, landlock; "
                  "default: none — a limit the host lacks stops the kernel, naming it)")
      ->delimiter(',')
      ->envname("CELLGATE_OPTIONAL_LIMITS");
  cmd->add_option("--cgroup-parent", o.cgroup_parent,
                  "cgroup v2: a cgroup delegated to the gateway (e.g. "
                  "/system.slice/cellgate-kernels.slice) to make kernels' cgroups below; "
                  "default: the gateway's own, moving itself into a leaf 'gateway' of it "
                  "when systemd delegated it (Delegate=yes)")
      ->envname("CELLGATE_CGROUP_PARENT");
  cmd->add_option("--user", o.user,
                  "started as root: run everything that speaks HTTP as this user (a name, "
                  "or uid[:gid]) with no capabilities, and start kernels in a small "
                  "privileged broker that takes only narrow requests (privilege "
                  "separation). The state dir then defaults to /var/lib/cellgate")
      ->envname("CELLGATE_USER");
  cmd->add_flag("--no-jail", o.no_jail, "run kernels UNJAILED (never with untrusted code)");
  cmd->add_flag("--allow-debugger", o.allow_debugger,
                "let kernelspecs with metadata.cellgate.debugger start: such a kernel gets a "
                "loopback-only network in its own namespace and may open TCP/UDP sockets, "
                "which ipykernel's debugger (debugpy) needs (jail/README.md); off: they are "
                "refused")
      ->envname("CELLGATE_ALLOW_DEBUGGER");
  cmd->add_flag("--keep-kernels", o.keep_kernels,
                "on SIGTERM/SIGINT leave the client kernels running for the next gateway "
                "on this --state-dir to adopt (SIGUSR2 always does; a restart or upgrade "
                "keeps every session)");
  cmd->add_option("--threads", o.threads, "network threads")->capture_default_str();
  cmd->add_option("--log-level", o.log_level,
                  "least severe log lines shown: trace, debug, info, warn or error (default: "
                  "$SPDLOG_LEVEL in spdlog's syntax, else info)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  cmd->add_option("--log-format", o.log_format,
                  "text, or json: one {\"ts\", \"level\", \"msg\"} object per line (under "
                  "systemd the journal keeps its own fields: journalctl -o json)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  // Every option can be set from the environment, and every size takes units.
  for (CLI::Option* option : cmd->get_options()) {
    if (option->get_lnames().empty()) {
      continue;
    }
    const std::string& name = option->get_lnames().front();
    if (name == "help" || name == "config" || name == "print-config") {
      continue;
    }
    if (option->get_envname().empty()) {
      option->envname(env_name(name));
    }
    option->capture_default_str();  // for --help and --print-config
    if (is_size(name)) {
      option->transform(CLI::AsSizeValue(false));
    }
  }
  return cmd;
}

}  // namespace cellgate::cli
