// `cellgate mcp`: an MCP server on stdin/stdout for agents (Claude Desktop, IDEs, any MCP
// client that starts servers as subprocesses). Either embedded — it starts its own jailed
// kernels in this process, as `cellgate run` does — or, with --url, a front for a running
// `cellgate serve` (its kernels, limits and audit log).
//
//   cellgate mcp                                   # embedded, state in a temp dir
//   cellgate mcp --url http://127.0.0.1:8888 --token "$TOKEN"
//
// stdout carries only MCP messages (one JSON-RPC message per line); logs go to stderr. At the
// end of stdin, or on SIGTERM/SIGINT/SIGHUP, every session's kernel is shut down (on the
// gateway too, with --url) and the command exits 0. The tools: docs/mcp.md.
//
// Exit codes: 0 the client went away, 2 bad options or an unreachable gateway (checked before
// the first message is read).
//
// Thread-safety: run_mcp blocks and owns the process's stdin and stdout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace cellgate::cli {

struct McpOptions {
  std::string url;    // a running gateway (http[s]://host:port[/base]); "": embedded
  std::string token;  // its token
  // Embedded only:
  bool no_jail = false;
  std::string state_dir;  // "": a temp dir, removed at exit
  std::size_t max_kernels = 16;
  double execute_max_timeout = 600;  // seconds
  double execute_grace = 5;
  std::size_t execute_stream_bytes = 1u << 20;
  std::size_t execute_output_bytes = 8u << 20;
  std::size_t max_file_bytes = 16u << 20;
  std::string audit_log;           // "": none
  std::uint64_t memory_bytes = 0;  // 0: the jail's default
  double cpus = 0;
  std::uint64_t pids = 0;
  // Both:
  std::size_t max_sessions = 16;  // named sessions per client
};

CLI::App* add_mcp_command(CLI::App& app, McpOptions& options);

int run_mcp(const McpOptions& options);

}  // namespace cellgate::cli
