// Checkpoint and restore of a whole jail (its pid namespace: pid 1, the kernel, whatever the
// kernel started) with CRIU: the privileged primitive under hibernate, snapshots and fork.
//
//   // the jail's pid 1 is 4242 (its launcher's "started" event); the gateway has closed its
//   // ZeroMQ sockets (CRIU cannot dump a unix stream half-connected to the outside)
//   CELLGATE_ASSIGN_OR_RETURN(auto dumped, checkpoint::dump_jail({criu, 4242, "/var/lib/…/img1",
//                                                                 conn_dir, work_dir}));
//   // the jail's processes are gone; its launcher reports it ended with SIGKILL
//   CELLGATE_ASSIGN_OR_RETURN(auto restored, checkpoint::restore_jail({criu, "/var/lib/…/img1",
//                                                                      conn_dir, work_dir,
//                                                                      report_write_end}));
//   // restored.init_pid is a child of the caller, which waits for it as for a launched jail
//
// What a jail must be for this (jail/README.md, "Checkpoints"): its pid 1 leads its session
// (contain_init's "session" step); its root is the tmpfs that build_root() makes, which CRIU does
// not save — dump_jail() copies it (the directories, links and small files on it, not the
// mounts) into the image as the skeleton `--root` needs; the connection dir and the host work
// dir are binds CRIU leaves outside the image (keyed "conn" and "work"), given again at restore,
// possibly at other host paths; the other binds (/usr, /etc files) are found again by path; no
// network to lock (`--network-lock skip`). Descriptors opened outside the jail's mount namespace
// are allowed only when open on 0, 1 or 2 (the launcher's /dev/null and log, which the jail
// inherits; ipykernel keeps dups of them higher up): at restore they become the restorer's own
// 0, 1 and 2. A pipe to the outside is allowed only
// as pid 1's report pipe (init.hpp; a write end): at restore it is `report_fd`.
//
// The image directory: created by dump_jail() mode 0700, its files 0600 (they hold the kernel's
// memory); CRIU's images in criu/ (the page images zstd-compressed when zstd is on the PATH),
// the root skeleton in root/, cellgate.json saying what to give back at restore. It is the
// maker's: callers reference images by an id of theirs and never restore a path a less
// privileged party chose.
//
// Thread-safety: functions; a jail is checkpointed or restored by one caller at a time.
// restore_jail() forks CRIU and makes the restored pid 1 a child of the calling process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "cellgate/result.hpp"

namespace cellgate::checkpoint {

struct DumpRequest {
  std::string criu;       // CriuSupport::path
  pid_t init_pid = -1;    // host pid of the jail's pid 1
  std::string image_dir;  // must not exist; created 0700
  std::string conn_dir;   // host dir bound at kJailConnDir; "" when none
  std::string work_dir;   // host dir bound at kJailWorkDir; "" when the jail made its own tmpfs
  bool compress = true;   // zstd -1 on the page images, when zstd is on the PATH
  // A snapshot: the jail runs on after the dump (CRIU's --leave-running), and the work dir's
  // files are copied into the image (work/) first, so that a copy started from it finds them.
  bool leave_running = false;
  // The jail's identity, recorded for a restore under another one (rebase.hpp): the kernel's
  // uid and gid and its cgroup's leaf name. 0 / "": not recorded (no copies of this image).
  uid_t uid = 0;
  gid_t gid = 0;
  std::string cgroup_name;
};

struct DumpFigures {
  double dump_ms = 0;             // criu dump, from start to the jail's processes gone
  double compress_ms = 0;         // zstd over the page images
  std::uint64_t raw_bytes = 0;    // CRIU's images before compression
  std::uint64_t image_bytes = 0;  // as kept
};

// Checkpoints the jail and ends its processes. On failure the jail keeps running as it was
// (CRIU resumes it) and the error carries CRIU's own last error line; the image dir's logs
// (criu/dump.log) stay for a look.
Result<DumpFigures> dump_jail(const DumpRequest& request);

struct RestoreRequest {
  std::string criu;
  std::string image_dir;  // made by dump_jail()
  std::string conn_dir;   // where the connection dir is now (required when dumped with one)
  std::string work_dir;   // where the work dir is now (required when dumped with one)
  int report_fd = -1;     // becomes pid 1's report pipe (required when dumped with one)
  // The restoring jail's identity. When it differs from the one the image recorded (a fork, a
  // start from a snapshot), the image is rebased onto it in a scratch copy (rebase.hpp) and the
  // image's saved work files are copied into work_dir, owned by `uid`. 0 / "": as dumped.
  uid_t uid = 0;
  gid_t gid = 0;
  std::string cgroup_name;
};

struct Restored {
  pid_t init_pid = -1;    // host pid of the restored pid 1, a child of the caller
  double unpack_ms = 0;   // zstd -d of the page images
  double restore_ms = 0;  // criu restore
};

// Restores the jail as a child of the calling process, into the cgroups it was dumped from
// (which must exist), or their rebased names. The image stays as it was: it may be restored
// again, by several restores at once (snapshots, fork: each works in a scratch dir of its own
// inside the image dir), or removed by its maker.
Result<Restored> restore_jail(const RestoreRequest& request);

}  // namespace cellgate::checkpoint
