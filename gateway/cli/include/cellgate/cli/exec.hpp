// `cellgate exec`: run one cell in a fresh kernel and print what it produces as it arrives.
//
//   cellgate exec 'import numpy; print(numpy.arange(3).sum())'     # prints 3
//   cellgate exec -f analysis.py
//   echo 'print(1)' | cellgate exec
//
// Streams go to stdout/stderr as they come; results and displays print their text/plain (or a
// one-line note for images); an error prints its traceback to stderr. input() reads a line from
// the terminal when the code did not come from stdin.
//
// The kernel runs jailed (see jail/README.md) unless --no-jail is given. With --url the cell runs
// on a running `cellgate serve` instead (a fresh kernel per call, or --kernel-id to use one that
// keeps its state), streamed as it happens; input() is not answered there.
//
// Images and PDFs the cell displays are saved as files (--artifacts DIR, default a fresh
// directory under $TMPDIR) and shown as "<image/png saved to PATH>".
//
// Exit codes: 0 ok, 1 the cell raised, 2 usage or start-up failure, 3 the kernel died,
// 124 the timeout passed (the cell was interrupted).
//
// Thread-safety: run_exec blocks and writes to the process's stdout and stderr: one at a time.
#pragma once

#include <string>

#include "cellgate/cli/exit_codes.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace cellgate::cli {

struct ExecOptions {
  std::string code;                // the cell
  std::string file;                // read the cell from this file ("-": stdin)
  std::string kernel = "python3";  // kernelspec name
  double timeout_seconds = 0;      // 0: no limit
  bool no_jail = false;            // run the kernel unjailed (explicit only)
  std::string jail_spec;           // a JailSpec JSON file; "": the defaults
  bool verbose = false;            // log what the host supports and where the kernel runs
  std::string url;                 // a running gateway (http[s]://host:port[/base]); "": local
  std::string token;               // its token
  std::string kernel_id;           // run in this kernel of the gateway instead of a fresh one
  std::string fork;                // run in a new copy of this kernel of the gateway (kept)
  std::string snapshot;            // run in a new kernel started from this snapshot (kept)
  std::string artifacts_dir;       // where displayed images and PDFs are saved
};

// Declares the `exec` subcommand on `app`, its options bound to `options`; returns it (so that
// the caller can tell whether it was parsed).
CLI::App* add_exec_command(CLI::App& app, ExecOptions& options);

// Blocks until the cell has ended; returns the exit code (cellgate/cli/exit_codes.hpp).
int run_exec(const ExecOptions& options);

}  // namespace cellgate::cli
