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
// The kernel runs jailed (see jail/README.md) unless --no-jail is given.
//
// Exit codes: 0 ok, 1 the cell raised, 2 usage or start-up failure, 3 the kernel died,
// 124 the timeout passed (the cell was interrupted).
#pragma once

#include <string>

namespace cellgate::cli {

struct ExecOptions {
  std::string code;               // the cell
  std::string file;               // read the cell from this file ("-": stdin)
  std::string kernel = "python3";  // kernelspec name
  double timeout_seconds = 0;      // 0: no limit
  bool no_jail = false;            // run the kernel unjailed (explicit only)
  std::string jail_spec;           // a JailSpec JSON file; "": the defaults
  bool verbose = false;            // log what the host supports and where the kernel runs
};

int run_exec(const ExecOptions& options);

}  // namespace cellgate::cli
