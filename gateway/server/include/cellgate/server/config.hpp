// ServeOptions: everything `cellgate serve` is configured with (flags, config files,
// CELLGATE_* and Kernel Gateway's KG_* environment variables; cellgate/cli/serve.hpp says which
// wins). The composition root (server.cpp) maps it to each room's own options.
//
// Thread-safety: a value, fixed once the server starts.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cellgate/jail/spec.hpp"

namespace cellgate::server {

struct ServeOptions {
  std::string ip = "127.0.0.1";
  int port = 8888;
  std::string token;      // "" with no_token false: a random one is made and printed once
  bool no_token = false;  // allow every request (only for loopback experiments)
  std::string state_dir;  // "" : $CELLGATE_STATE_DIR or ~/.local/state/cellgate
  std::string base_url = "/";
  std::size_t max_kernels = 64;
  double cull_idle_timeout = 0;  // seconds; 0: never cull
  double cull_interval = 300;
  double hibernate_after = 0;      // seconds idle before a kernel hibernates; 0: never
  bool hibernate_on_stop = false;  // SIGTERM/SIGINT hibernate the kernels that can
  // Checkpoints (hibernate, snapshots, fork) even though a restored kernel loses its Landlock
  // layer (engine::HostOptions::checkpoint_without_landlock); without it they answer 501.
  bool checkpoint_without_landlock = false;
  std::uint64_t hibernate_disk_max = 0;  // bytes of images in all; 0: no limit
  bool cull_connected = false;
  bool cull_busy = false;
  std::vector<std::string> allow_origins;  // exact origins, or "*"
  std::string certfile;
  std::string keyfile;
  // A CA (PEM): clients must present a certificate it signed (Kernel Gateway's client_ca).
  std::string client_ca;
  // The kernelspec started when a request names none ("": python3, else the first found).
  std::string default_kernel;
  std::size_t max_body_bytes = 16u << 20;
  std::size_t max_control_body_bytes = 64u << 10;  // kernel/session/context control routes
  std::size_t max_header_bytes = 16u << 10;
  std::size_t max_connections = 0;  // open client connections; 0: from the open-file limit
  std::size_t max_ws_message_bytes = 64u << 20;  // one inbound WebSocket message
  std::size_t max_ws_queue_bytes = 256u << 20;   // unsent outbound bytes before a client is dropped
  std::size_t max_ws_total_bytes = 256u << 20;   // the same, plus unfinished inbound, all clients
  std::size_t max_kernel_message_bytes = 64u << 20;  // one frame from a kernel; larger: dropped
  double ws_ping_interval = 30;                      // seconds; 0: off
  int threads = 2;
  std::string log_level;                // trace|debug|info|warn|error; "": SPDLOG_LEVEL, else info
  std::string log_format = "text";      // text | json (one {"ts", "level", "msg"} object per line)
  std::set<std::string> env_allowlist;  // client env names passed besides KERNEL_*
  int restart_limit = 5;                // auto-restarts of a dying kernel before it is dead
  double kernel_start_timeout = 60;  // seconds for the launcher's report and the first kernel_info
  // Seconds without heartbeats while the kernel's process uses no CPU before it is restarted
  // (RegistryOptions::heartbeat_timeout); a kernel busy at its CPU quota is never restarted.
  double heartbeat_timeout = 3;
  bool no_jail = false;  // run kernels unjailed (explicit only)
  // Kernelspecs with metadata.cellgate.debugger start with a loopback network (serve
  // --allow-debugger; jail/README.md, "Loopback network"). Off: they are refused.
  bool allow_debugger = false;
  bool list_kernels = true;  // false: GET /api/kernels and /api/sessions are 403 (KG's default)
  // Not an option: why kernels cannot hibernate here ("" when they can), which run_serve takes
  // from engine::prepare_host (RegistryOptions::checkpoints_unavailable).
  std::string checkpoints_unavailable = "this gateway was not set up for checkpoints";
  // SIGTERM and SIGINT leave the client kernels running for the next gateway on the state dir to
  // adopt, as SIGUSR2 always does (a restart or an upgrade under a service manager).
  bool keep_kernels = false;
  // Kernel uids: each gateway on the host leases one range of kernel_uid_range_size uids, range
  // i starting at kernel_uid_base + i * kernel_uid_range_size (kernels/uid_allocator.hpp).
  uid_t kernel_uid_base = 2000000;
  uid_t kernel_uid_range_size = 1000;
  std::size_t kernel_uid_ranges = 1000;
  // Display formatters in python kernels: a matplotlib figure's data and a DataFrame's columns
  // beside the PNG/HTML (the agent API's and E2B's `chart`/`data`). They are also in what
  // Jupyter clients receive and save; `--no-chart-data` leaves kernels' outputs as ipykernel's.
  bool chart_data = true;
  // The warm pool: ready kernels kept per pooled kernelspec (0: off). Off here so embedding
  // code and tests start nothing unasked; `cellgate serve` defaults to 2 (gateway/main.cpp).
  int pool_size = 0;
  int pool_max = 0;  // the most ready per kernelspec by demand (0: pool_size; RegistryOptions)
  std::vector<std::string> pool_kernels;  // kernelspecs pooled; empty: the default one
  int pool_parallel = 0;  // pool starts at once, at most (0: one per CPU; RegistryOptions)
  // The zygote (fork server) python3 ipykernels are started from, jailed kernels only. Off here
  // for the same reason as the pool; `cellgate serve` turns it on (gateway/main.cpp).
  bool zygote = false;
  std::vector<std::string> zygote_preload;  // empty: ipykernel, IPython, numpy, pandas, matplotlib
  // POST /api/kernels/{id}/execute
  double execute_max_timeout = 600;             // seconds; longer requests are clamped
  double execute_grace = 5;                     // seconds between the interrupt and a restart
  std::size_t execute_stream_bytes = 1u << 20;  // stdout and stderr kept per cell, each
  std::size_t execute_output_bytes = 8u << 20;  // one display_data / execute_result
  double execute_keepalive = 3;                 // seconds between keepalives when streaming
  // Artifacts (images and PDFs kernels display, stored by SHA-256 under <state>/artifacts)
  std::size_t artifacts_per_kernel = 1000;
  std::size_t artifact_bytes_per_kernel = 256u << 20;
  // The files API (and one-shot files): the largest file read or written
  std::size_t max_file_bytes = 16u << 20;
  // The audit log: one JSON line per agent execution. "" : <state>/audit.log; "off": none.
  std::string audit_log;
  std::size_t audit_max_bytes = 64u << 20;  // rotated past this
  int audit_keep = 5;                       // rotated files kept
  std::vector<std::string> audit_redact;    // more secret patterns (RE2 syntax)
  // E2B-compatible endpoints on a second listener (same --ip); 0: off.
  int e2b_port = 0;
  // This gateway as a node of a cluster (docs/scale-out.md). node_tag: 0..65535 (a
  // StatefulSet's pod ordinal), the first 4 hex digits of every id minted here. agent_port:
  // HAProxy's agent-check ("ready NN%" / "drain"); 0: off. peers: whose lists to merge.
  int node_tag = 0;
  int agent_port = 0;
  std::vector<std::string> peers;
  // A file holding the secret the cluster's nodes share to sign the kernels they move to each
  // other (POST /api/kernels/{id}/move; cellgate drain --move); "": no moves from or to here.
  std::string move_key_file;
  // E2B sandboxes one tenant (an API key's, `cellgate keys`) may have at once; 0: no limit
  // but max_kernels. Over it: 429, as E2B answers.
  std::size_t tenant_max_sandboxes = 0;
  // Kernels one tenant may have at once through the Jupyter and agent routes, its sandboxes'
  // kernels counted; 0: no limit but max_kernels. Over it: 403 (Jupyter's limit answer).
  std::size_t tenant_max_kernels = 0;
  // CPU-seconds one tenant's kernels and sandboxes may use per window (tenants/cpu_budget.hpp);
  // past it: nothing more starts (403 / E2B's 429) and its kernels are throttled until the next
  // window. 0: no budget.
  double tenant_max_cpu_seconds = 0;
  double tenant_cpu_window = 3600;  // seconds
  // MiB one tenant's kernels (their work dir caps), paused sandboxes and snapshots (their images)
  // may hold (tenants/disk_limit.hpp); past it nothing more starts or is snapshotted (403 /
  // E2B's 429). 0: no limit.
  std::uint64_t tenant_max_disk_mb = 0;
  // E2B lifecycle events (created, paused, resumed, snapshotted, killed) POSTed to these URLs,
  // signed with the secret in e2b_webhook_secret_file (sandboxes/webhooks.hpp).
  std::vector<std::string> e2b_webhooks;
  std::string e2b_webhook_secret_file;
  // E2B's SDK in debug mode sends no token: allow token-less E2B requests (loopback --ip only).
  bool e2b_no_token = false;
  // Kernel Gateway's modes (docs/kernel-gateway.md). api: "jupyter-websocket" (the Jupyter REST
  // and WebSocket API, the agent API, …) or "notebook-http": the annotated cells of the `seed`
  // notebook as HTTP endpoints, served by `prespawn` seeded kernels (notebook_http/service.hpp).
  std::string api = "jupyter-websocket";
  std::string seed;                      // the seed notebook (Kernel Gateway's seed_uri)
  int prespawn = 0;                      // notebook-http: the pool's kernels (0: 1)
  bool allow_notebook_download = false;  // notebook-http: GET /_api/source
  std::string static_path;               // notebook-http: files served at /public/
  // Every kernel is of this kernelspec, whatever a request names ("": as asked).
  std::string force_kernel;
  jail::JailSpec jail;  // limits for every kernel
  // cgroup v2: the delegated cgroup kernels' cgroups go below ("": arranged from our own,
  // jail::place_kernel_cgroups; run_serve fills jail.cgroup_parent from it).
  std::string cgroup_parent;
  // Started as root: everything that speaks HTTP and WebSocket runs as this user (a name, or
  // uid[:gid]) with no capabilities and no_new_privs, and kernels start in a privileged broker
  // (cellgate/broker/broker.hpp). "": one process, as started.
  std::string user;
  // Listening sockets systemd passed (socket activation; run_serve fills them), used instead of
  // opening ip:port and ip:e2b_port. -1: none.
  int http_socket = -1;
  int e2b_socket = -1;
};

}  // namespace cellgate::server
