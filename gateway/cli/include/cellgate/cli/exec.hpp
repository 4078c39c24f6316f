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
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cellgate::cli {

// The exit codes of `cellgate exec` (local and --url) and `cellgate run`.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCellError = 1;  // exec: the cell raised; run: a notebook failed
inline constexpr int kExitUsage = 2;
inline constexpr int kExitKernelDied = 3;
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitInterrupted = 130;

struct ExecOptions {
  std::string code;               // the cell
  std::string file;               // read the cell from this file ("-": stdin)
  std::string kernel = "python3";  // kernelspec name
  double timeout_seconds = 0;      // 0: no limit
  bool no_jail = false;            // run the kernel unjailed (explicit only)
  std::string jail_spec;           // a JailSpec JSON file; "": the defaults
  bool verbose = false;            // log what the host supports and where the kernel runs
  std::string url;                 // a running gateway (http[s]://host:port[/base]); "": local
  std::string token;               // its token
  std::string kernel_id;           // run in this kernel of the gateway instead of a fresh one
  std::string artifacts_dir;       // where displayed images and PDFs are saved
};

int run_exec(const ExecOptions& options);

namespace detail {
// Saves the images and PDFs of a mime bundle; returns "<mime saved to PATH>" lines.
class ArtifactSaver {
 public:
  explicit ArtifactSaver(std::string dir) : dir_(std::move(dir)) {}
  std::vector<std::string> save(const nlohmann::json& data);

 private:
  std::string dir_;
  bool made_ = false;
};
// The local and remote runs print a bundle the same way.
void print_bundle(const nlohmann::json& data, ArtifactSaver& saver);
// `cellgate exec --url`: remote_exec.cpp.
int run_remote_exec(const ExecOptions& options, const std::string& code);
}  // namespace detail

}  // namespace cellgate::cli
