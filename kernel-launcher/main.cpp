// cellgate-kernel: starts one Jupyter kernel inside the jail and reports on a status fd, or, with
// --zygote, serves as the fork server kernels are started from. See launcher.hpp, zygote.hpp and
// jail/README.md.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cellgate/launcher/launcher.hpp"
#include "cellgate/launcher/zygote.hpp"
#include "cellgate/sys/error_text.hpp"
#include "cellgate/sys/file.hpp"

namespace {

// The zygote is its own binary beside this one (it links CPython; launchers do not): exec it
// with an empty environment, so it never holds a secret of ours.
int exec_zygote(const cellgate::launcher::ZygoteOptions& z) {
  auto self = cellgate::sys::read_link("/proc/self/exe");
  if (!self) {
    std::cerr << "cellgate-kernel: " << self.error().message << "\n";
    return 127;
  }
  std::string path = *self;
  path = path.substr(0, path.rfind('/')) + "/cellgate-zygote";
  std::vector<std::string> args = {path, "--socket", z.socket_path};
  if (z.status_fd >= 0) {
    args.insert(args.end(), {"--status-fd", std::to_string(z.status_fd)});
  }
  std::string list;
  for (const auto& m : z.preload) {
    list += (list.empty() ? "" : ",") + m;
  }
  args.insert(args.end(), {"--preload", list});
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  char* empty[] = {nullptr};
  ::execve(path.c_str(), argv.data(), empty);
  std::cerr << "cellgate-kernel: execve('" << path << "'): " << cellgate::sys::error_text(errno)
            << "\n";
  return 127;
}

int run(int argc, char** argv) {
  CLI::App app{"cellgate-kernel: start one Jupyter kernel in a jail and report how it ends"};
  cellgate::launcher::LaunchOptions options;
  cellgate::launcher::ZygoteOptions zygote;
  bool no_jail = false;
  bool probe_host = false;
  bool zygote_mode = false;
  app.add_option("--spec", options.spec_path, "jail spec (JSON); default: the built-in limits");
  app.add_option("--status-fd", options.status_fd,
                 "write JSON status lines (started, exited; ready for --zygote) to this fd");
  app.add_option("--status-file", options.status_file,
                 "append the same status lines to this file too (it outlives the reader)");
  app.add_option("--connection-file", options.connection_file,
                 "the kernel's connection file (rewritten to ipc endpoints in the jail)");
  app.add_option("--cwd", options.cwd,
                 "working directory (unjailed kernels; with --exec-into, in the jail)");
  app.add_flag("--die-with-parent", options.die_with_parent,
               "kill the kernel when the launcher's parent dies");
  app.add_flag("--no-jail", no_jail, "run the kernel unjailed (explicitly allowed only)");
  app.add_flag("--probe-host", probe_host, "print what this host supports and exit");
  app.add_option("--zygote-socket", options.zygote_socket,
                 "fork a python3 ipykernel from the zygote listening here (cold if none answers)");
  app.add_option("--spool-socket", options.spool_socket,
                 "keep the kernel's last iopub messages; answer for them on this unix socket");
  app.add_flag("--zygote", zygote_mode, "run as the zygote (fork server) on --socket");
  app.add_option("--socket", zygote.socket_path, "the zygote's socket path (with --zygote)");
  app.add_option("--preload", zygote.preload, "modules the zygote imports (with --zygote)")
      ->delimiter(',');
  pid_t checkpoint_pid = -1;
  std::string images;
  app.add_option("--checkpoint", checkpoint_pid,
                 "checkpoint the jail whose pid 1 is this into --images, ending it (CRIU)");
  app.add_option("--images", images, "the image dir --checkpoint creates");
  app.add_flag("--no-compress", options.no_compress,
               "with --checkpoint: page images as CRIU wrote them (no zstd)");
  app.add_flag("--leave-running", options.leave_running,
               "with --checkpoint: a snapshot; the jail runs on, its work files saved too");
  app.add_option("--restore", options.restore_dir,
                 "restore the jail checkpointed in this image dir and supervise it");
  app.add_option("--exec-into", options.exec_into,
                 "run the command after -- inside the running jail whose pid 1 is this");
  app.add_option("--cgroup", options.cgroup_dirs,
                 "with --exec-into: a cgroup dir of the kernel (repeat per hierarchy)")
      ->allow_extra_args(false);
  app.add_option("--env", options.exec_env, "with --exec-into: NAME=VALUE on top of the kernel's")
      ->allow_extra_args(false);
  app.add_option("--pty", options.pty, "with --exec-into: a terminal of COLSxROWS");
  app.add_option("--control-fd", options.control_fd,
                 "with --exec-into: the gateway's SOCK_SEQPACKET socket (reports, signals)");
  app.add_option("argv", options.argv, "the kernel's command line, after --");
  CLI11_PARSE(app, argc, argv);
  if (probe_host) {
    return cellgate::launcher::run_probe_host();
  }
  if (options.exec_into > 0) {
    return cellgate::launcher::run_exec_into(options);
  }
  if (checkpoint_pid > 0) {
    return cellgate::launcher::run_checkpoint(checkpoint_pid, images, options);
  }
  if (!options.restore_dir.empty()) {
    return cellgate::launcher::run_restore_mode(options);
  }
  if (zygote_mode) {
    zygote.status_fd = options.status_fd;
    return exec_zygote(zygote);
  }
  if (no_jail) {
    return cellgate::launcher::run_exec_mode(options);
  }
  return cellgate::launcher::run_jailed_mode(options);
}

}  // namespace

int main(int argc, char** argv) {
  // CLI11 and the standard library may throw (std::bad_alloc): say so and exit as a failed
  // launch, rather than abort and leave the gateway a bare SIGABRT.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "cellgate-kernel: " << e.what() << "\n";
    return 127;
  }
}
