// MCP's stdio transport (basic/transports "stdio"): one JSON-RPC message per line on stdin,
// one per line on stdout, nothing else on stdout (logs go to stderr).
//
//   int stop[2]; ::pipe(stop);                    // a signal thread writes to stop[1]
//   mcp::serve_stdio(server, STDIN_FILENO, STDOUT_FILENO, stop[0]);
//
// Requests are handled as they arrive, so a ping or a notifications/cancelled is answered while
// a long cell runs; their responses may leave in any order (JSON-RPC matches them by id). A line
// that is not JSON is answered with a parse error (-32700, id null); an over-long line (more
// than 64 MiB) too, and is skipped. At the end of input or when `stop_fd` is readable, the
// conversation is closed — its cells cancelled and its kernels shut down — and serve_stdio
// returns; answers that come later are dropped.
//
// Thread-safety: blocks the calling thread; writes to out_fd come from any thread, one line at
// a time. SIGPIPE should be ignored (a client that closed stdout is not a crash).
#pragma once

#include "cellgate/mcp/server.hpp"

namespace cellgate::mcp {

// Returns 0 at the end of input or a stop, 1 if reading failed.
int serve_stdio(Server& server, int in_fd, int out_fd, int stop_fd);

}  // namespace cellgate::mcp
