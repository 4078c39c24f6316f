// The launcher's checkpoint modes: `--checkpoint PID --images DIR` dumps a running jail (its
// launcher then reports it ended with SIGKILL), and `--restore DIR` brings it back as this
// launcher's jail, supervised and reported on exactly as a launched one (exec_mode.cpp).
//
//   cellgate-kernel --restore DIR --status-fd 3 --spec jail.json --connection-file conn.json
//     HostJail::build(): the cgroup again (same name, same limits: CRIU puts the processes back
//     into the cgroups they left), the work dir (still mounted: reused), the connection dir
//     → checkpoint::restore_jail(): pid 1 becomes our child, its report pipe a new one of ours
//     → {"event":"started"} → supervise_init() as in exec mode.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cellgate/checkpoint/checkpoint.hpp"
#include "cellgate/checkpoint/criu.hpp"
#include "cellgate/launcher/launcher.hpp"
#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/unique_fd.hpp"
#include "host_jail.hpp"
#include "init.hpp"
#include "report.hpp"

namespace cellgate::launcher {

int run_restore_mode(const LaunchOptions& options) {
  StatusSink status(options.status_fd);
  if (!open_status(options.status_fd, options.status_file, status)) {
    return 127;
  }
  auto fail = [&](const std::string& message) {
    status.report(setup_error(message));
    return 127;
  };
  if (::geteuid() != 0) {
    return fail("restoring a checkpointed jail needs root");
  }
  auto criu = checkpoint::find_criu();
  if (!criu) {
    return fail(criu.error().message);
  }
  auto jail = HostJail::build(options, status);
  if (!jail) {
    return fail(jail.error().message);
  }
  HostJail& j = **jail;
  if (j.spec().name.empty()) {
    return j.fail("a restored jail needs its spec's name: its cgroup's, which CRIU returns it to");
  }
  int rep[2];
  if (::pipe2(rep, O_CLOEXEC) != 0) {
    return j.fail(errno_error(ErrorCode::kInternal, "", "pipe2()", errno).message);
  }
  UniqueFd rep_read(rep[0]);
  UniqueFd rep_write(rep[1]);
  checkpoint::RestoreRequest request;
  request.criu = *criu;
  request.image_dir = options.restore_dir;
  request.conn_dir = j.paths().conn_dir;
  request.work_dir = j.paths().work_dir;
  request.report_fd = rep_write.get();
  request.uid = j.uid();
  request.gid = j.gid();
  request.cgroup_name = j.cgroup_name();
  auto restored = checkpoint::restore_jail(request);
  rep_write.reset();
  if (!restored) {
    return j.fail(restored.error().message);
  }
  std::cerr << "cellgate-kernel: restored " << options.restore_dir << ": zstd -d "
            << static_cast<long>(restored->unpack_ms) << " ms, criu restore "
            << static_cast<long>(restored->restore_ms) << " ms\n";
  init::InitReport report(std::move(rep_read));
  j.report_started(restored->init_pid);
  return supervise_init(j, restored->init_pid, report);
}

int run_checkpoint(pid_t init_pid, const std::string& image_dir, const LaunchOptions& options) {
  auto criu = checkpoint::find_criu();
  if (!criu) {
    std::cerr << "cellgate-kernel: " << criu.error().message << "\n";
    return 1;
  }
  checkpoint::DumpRequest request;
  request.criu = *criu;
  request.init_pid = init_pid;
  request.image_dir = image_dir;
  request.leave_running = options.leave_running;
  request.compress = !options.no_compress;
  // Only whether the jail has these binds matters to the dump (their keys); the restore names
  // where they are then.
  if (!options.connection_file.empty()) {
    request.conn_dir = "(bound)";
  }
  if (!options.spec_path.empty()) {
    auto spec = load_spec(options.spec_path);
    if (!spec) {
      std::cerr << "cellgate-kernel: " << spec.error().message << "\n";
      return 1;
    }
    if (!spec->work_dir.empty()) {
      request.work_dir = spec->work_dir;
    }
    // The identity a copy's restore rebases from (HostJail::choose_identity() as the gateway
    // launches: the spec names the uid).
    request.uid = spec->uid.value_or(0);
    request.gid = spec->access_gid ? *spec->access_gid : spec->gid.value_or(request.uid);
    request.cgroup_name = spec->name;
  }
  auto dumped = checkpoint::dump_jail(request);
  if (!dumped) {
    std::cerr << "cellgate-kernel: " << dumped.error().message << "\n";
    return 1;
  }
  std::cout << nlohmann::json{{"dump_ms", dumped->dump_ms},
                              {"compress_ms", dumped->compress_ms},
                              {"raw_bytes", dumped->raw_bytes},
                              {"image_bytes", dumped->image_bytes}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace cellgate::launcher
