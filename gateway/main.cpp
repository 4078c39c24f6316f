// cellgate: the Jupyter kernel gateway. The composition root: parses the command line (flags,
// CELLGATE_* environment variables, an optional config file) and hands each subcommand its
// options.
#include <CLI/CLI.hpp>

#include "cellgate/cli/exec.hpp"
#include "cellgate/notebooks/run.hpp"
#include "cellgate/server/server.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cellgate: jailed Jupyter kernels for JupyterLab, agents and notebook runs"};
  app.require_subcommand(1);

  cellgate::cli::ExecOptions exec;
  auto* exec_cmd = app.add_subcommand("exec", "run one cell in a fresh kernel and print its output");
  exec_cmd->add_option("code", exec.code, "the code to run ('-' or nothing: read stdin)");
  exec_cmd->add_option("-f,--file", exec.file, "read the code from this file");
  exec_cmd->add_option("-k,--kernel", exec.kernel, "kernelspec name")->capture_default_str();
  exec_cmd->add_option("-t,--timeout", exec.timeout_seconds,
                       "interrupt the cell after this many seconds (0: never)");
  exec_cmd->add_flag("--no-jail", exec.no_jail, "run the kernel unjailed (not for untrusted code)");
  exec_cmd->add_option("--jail-spec", exec.jail_spec, "jail spec JSON (limits, mounts, env)");
  exec_cmd->add_flag("-v,--verbose", exec.verbose, "log what the host supports");
  exec_cmd->add_option("--url", exec.url, "run on this running gateway (http[s]://host:port)")
      ->envname("CELLGATE_URL");
  exec_cmd->add_option("--token", exec.token, "the gateway's token")->envname("CELLGATE_TOKEN");
  exec_cmd->add_option("--kernel-id", exec.kernel_id,
                       "with --url: run in this kernel (state kept) instead of a fresh one");
  exec_cmd->add_option("--artifacts", exec.artifacts_dir,
                       "save displayed images and PDFs here (default: a new dir in $TMPDIR)");

  cellgate::notebooks::NotebookRunOptions run;
  auto* run_cmd = app.add_subcommand(
      "run", "execute notebooks headless in jailed kernels (exit 0 ok, 1 a notebook failed, "
             "2 usage or invalid notebook)");
  run_cmd->add_option("notebooks", run.inputs, "notebooks (.ipynb) or directories of them")
      ->required();
  run_cmd->add_option("-o,--output", run.output, "write the executed notebook here (one input)");
  run_cmd->add_option("--output-dir", run.output_dir,
                      "write each executed notebook to DIR/<name>.ipynb");
  run_cmd->add_flag("--inplace", run.inplace, "write each executed notebook over its input");
  run_cmd->add_option("-p,--parameter", run.parameters,
                      "NAME=VALUE: set a parameter after the cell tagged 'parameters' (repeat)")
      ->allow_extra_args(false);  // one value per -p: the notebooks may follow
  run_cmd->add_option("-t,--timeout", run.timeout_seconds,
                      "interrupt a cell after this many seconds; the notebook fails (0: never)");
  run_cmd->add_flag("--allow-errors", run.allow_errors,
                    "run every cell even after errors (still fails on timeouts)");
  run_cmd->add_option("--artifacts", run.artifacts_dir,
                      "save displayed images and PDFs to DIR/<notebook>/cell<i>-<n>.<ext>");
  run_cmd->add_option("-k,--kernel", run.kernel,
                      "kernelspec (default: the notebook's, when known here; else python3)");
  run_cmd->add_option("--url", run.url, "run on this running gateway (http[s]://host:port)")
      ->envname("CELLGATE_URL");
  run_cmd->add_option("--token", run.token, "the gateway's token")->envname("CELLGATE_TOKEN");
  run_cmd->add_flag("--json", run.json, "print the summary as JSON on stdout");
  run_cmd->add_option("-j,--jobs", run.jobs, "notebooks run at once, each in its own kernel")
      ->capture_default_str();
  run_cmd->add_option("--results", run.results,
                      "write per-notebook results: FILE.json / FILE.csv, or both for another name");
  run_cmd->add_flag("--no-jail", run.no_jail,
                    "run embedded kernels UNJAILED (not for untrusted notebooks)");
  run_cmd->add_flag("!--no-progress", run.progress, "no progress line on a terminal");

  cellgate::server::ServeOptions serve;
  auto* serve_cmd = app.add_subcommand(
      "serve", "serve the Jupyter Kernel Gateway API (HTTP + WebSocket) with jailed kernels");
  serve_cmd->set_config("--config", "", "read options from this TOML/INI file");
  serve_cmd->add_option("--ip", serve.ip, "address to listen on")
      ->envname("CELLGATE_IP")->capture_default_str();
  serve_cmd->add_option("--port", serve.port, "port (0: any free one)")
      ->envname("CELLGATE_PORT")->capture_default_str();
  serve_cmd->add_option("--token", serve.token, "API token (default: a random one, printed once)")
      ->envname("CELLGATE_TOKEN");
  serve_cmd->add_option("--state-dir", serve.state_dir,
                        "state directory (default: $CELLGATE_STATE_DIR or ~/.local/state/cellgate)");
  serve_cmd->add_option("--base-url", serve.base_url, "URL prefix of every route")
      ->envname("CELLGATE_BASE_URL")->capture_default_str();
  serve_cmd->add_option("--max-kernels", serve.max_kernels, "kernels that may run at once")
      ->envname("CELLGATE_MAX_KERNELS")->capture_default_str();
  serve_cmd->add_option("--cull-idle-timeout", serve.cull_idle_timeout,
                        "shut down kernels idle this many seconds (0: never)")
      ->envname("CELLGATE_CULL_IDLE_TIMEOUT")->capture_default_str();
  serve_cmd->add_option("--cull-interval", serve.cull_interval, "seconds between cull checks")
      ->capture_default_str();
  serve_cmd->add_flag("--cull-connected", serve.cull_connected,
                      "also cull kernels with open WebSockets");
  serve_cmd->add_flag("--cull-busy", serve.cull_busy, "also cull busy kernels");
  serve_cmd->add_option("--allow-origin", serve.allow_origins,
                        "browser origins allowed (repeat; '*' for any)")
      ->envname("CELLGATE_ALLOW_ORIGIN");
  serve_cmd->add_option("--certfile", serve.certfile, "TLS certificate chain (PEM)")
      ->envname("CELLGATE_CERTFILE");
  serve_cmd->add_option("--keyfile", serve.keyfile, "TLS private key (PEM)")
      ->envname("CELLGATE_KEYFILE");
  serve_cmd->add_option("--max-body-bytes", serve.max_body_bytes, "largest request body")
      ->capture_default_str();
  serve_cmd->add_option("--max-ws-message-bytes", serve.max_ws_message_bytes,
                        "largest WebSocket message from a client")
      ->capture_default_str();
  serve_cmd->add_option("--max-ws-queue-bytes", serve.max_ws_queue_bytes,
                        "unsent bytes for one WebSocket before that client is disconnected")
      ->capture_default_str();
  serve_cmd->add_option("--ws-ping-interval", serve.ws_ping_interval,
                        "WebSocket keepalive ping seconds (0: off)")
      ->capture_default_str();
  serve_cmd->add_option("--env-allow", serve.env_allowlist,
                        "client env names passed to kernels besides KERNEL_* (repeat)");
  serve_cmd->add_option("--restart-limit", serve.restart_limit,
                        "automatic restarts of a dying kernel before it is left dead")
      ->capture_default_str();
  serve.pool_size = 2;  // ServeOptions' own default is 0 (off) for embedding code and tests
  serve_cmd->add_option("--pool-size", serve.pool_size,
                        "ready kernels kept per pooled kernelspec, claimed by new kernels that "
                        "ask for no env (0: off; they count towards --max-kernels)")
      ->envname("CELLGATE_POOL_SIZE")->check(CLI::NonNegativeNumber)->capture_default_str();
  serve_cmd->add_option("--pool-kernel", serve.pool_kernels,
                        "a kernelspec to pool (repeat; default: the default kernelspec)");
  serve.zygote = true;  // off in ServeOptions, like the pool
  bool no_zygote = false;
  serve_cmd->add_flag("--no-zygote", no_zygote,
                      "start every kernel cold instead of forking python3 kernels from the "
                      "zygote (a preloaded fork server)")
      ->envname("CELLGATE_NO_ZYGOTE");
  serve_cmd->add_option("--zygote-preload", serve.zygote_preload,
                        "modules the zygote imports, comma-separated (default: ipykernel, "
                        "IPython, numpy, pandas, matplotlib)")
      ->delimiter(',');
  serve_cmd->add_option("--execute-max-timeout", serve.execute_max_timeout,
                        "longest timeout an execute request may ask for (seconds)")
      ->capture_default_str();
  serve_cmd->add_option("--execute-grace", serve.execute_grace,
                        "seconds between a timed-out cell's interrupt and its kernel's restart")
      ->capture_default_str();
  serve_cmd->add_option("--execute-stream-bytes", serve.execute_stream_bytes,
                        "stdout and stderr kept per executed cell, each")
      ->capture_default_str();
  serve_cmd->add_option("--execute-output-bytes", serve.execute_output_bytes,
                        "largest single output kept per executed cell")
      ->capture_default_str();
  serve_cmd->add_option("--execute-keepalive", serve.execute_keepalive,
                        "seconds between keepalive events of a streamed execute answer")
      ->capture_default_str();
  serve_cmd->add_option("--artifacts-per-kernel", serve.artifacts_per_kernel,
                        "images and PDFs kept per kernel")
      ->capture_default_str();
  serve_cmd->add_option("--artifact-bytes-per-kernel", serve.artifact_bytes_per_kernel,
                        "artifact bytes kept per kernel")
      ->capture_default_str();
  serve_cmd->add_option("--max-file-bytes", serve.max_file_bytes,
                        "largest file read or written through the files API")
      ->capture_default_str();
  serve_cmd->add_option("--audit-log", serve.audit_log,
                        "audit log file (default <state-dir>/audit.log; 'off' for none)")
      ->envname("CELLGATE_AUDIT_LOG");
  serve_cmd->add_option("--audit-max-bytes", serve.audit_max_bytes,
                        "audit log size before it is rotated")
      ->capture_default_str();
  serve_cmd->add_option("--audit-keep", serve.audit_keep, "rotated audit logs kept")
      ->capture_default_str();
  serve_cmd->add_option("--audit-redact", serve.audit_redact,
                        "another secret pattern (ECMAScript regex) to redact (repeat)");
  serve_cmd->add_option("--e2b-port", serve.e2b_port,
                        "also serve E2B-compatible endpoints on this port (0: off; E2B's SDK in "
                        "debug mode uses 49999)")
      ->envname("CELLGATE_E2B_PORT")->capture_default_str();
  serve_cmd->add_flag("--e2b-no-token", serve.e2b_no_token,
                      "accept E2B requests without a token, as E2B's SDK in debug mode sends "
                      "none (only with a loopback --ip)");
  serve_cmd->add_option("--memory", serve.jail.memory_bytes, "per-kernel memory limit (bytes)")
      ->capture_default_str();
  serve_cmd->add_option("--cpus", serve.jail.cpus, "per-kernel CPU quota")->capture_default_str();
  serve_cmd->add_option("--pids", serve.jail.pids, "per-kernel process limit")
      ->capture_default_str();
  serve_cmd->add_flag("--no-jail", serve.no_jail,
                      "run kernels UNJAILED (never with untrusted code)");
  serve_cmd->add_option("--threads", serve.threads, "network threads")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    // Every subcommand documents exit code 2 for usage errors (--help still exits 0).
    return code != 0 ? 2 : code;
  }
  if (exec_cmd->parsed()) {
    return cellgate::cli::run_exec(exec);
  }
  if (run_cmd->parsed()) {
    return cellgate::notebooks::run_notebooks(run);
  }
  if (serve_cmd->parsed()) {
    serve.zygote = !no_zygote;
    return cellgate::server::run_serve(std::move(serve));
  }
  return 2;
}
