// Rebasing a checkpoint image onto another kernel identity: the uid, gid and cgroup a copy of a
// kernel (a fork, a start from a snapshot) must have instead of its source's.
//
//   checkpoint::Rebase r{2000002, 2000007, 2000002, 2000007, "k-<source id>", "k-<copy id>"};
//   // for each file of the image's criu/ dir, into the restore's own scratch dir:
//   CELLGATE_ASSIGN_OR_RETURN(bool changed, checkpoint::rebase_image(name, in_path, out_path, r));
//   // false: the file holds nothing to change; the caller links the original instead
//
// CRIU restores exactly what it dumped: the tasks' credentials, the owners of the files on the
// jail's private tmpfs, the owner of each bound unix socket and the cgroup paths. It has no
// option to change them, so the image's protobuf records are edited (CRIU's images/*.proto:
// each file is magic words then [u32 size][message] records). Only fields whose meaning is known
// are touched, and only where they hold the source's value:
//   core-*.img     core_entry.thread_core.creds: uid, euid, suid, fsuid, gid, … and groups
//   files.img      file_entry.usk.file_perms: the owner of a bound unix socket
//   ghost-file-*   ghost_file_entry uid/gid (a file unlinked while open)
//   cgroup.img     every cgroup path and top dir name: the component `from_cgroup` becomes
//                  `to_cgroup`; the dirs' and properties' owners
//   tmpfs-dev-*    the tar of a private tmpfs (/tmp, /dev/shm): unpacked, re-owned, packed again
// Images holding what cannot be given another owner safely (SysV IPC objects, memfd inodes)
// are refused with kFailedPrecondition naming them: a copy is not made rather than made wrong.
//
// Images are hostile input (they come from disk): every length is checked against what is left,
// nesting is bounded, and a malformed record is an error, never a crash or a partial file.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "cellgate/result.hpp"

namespace cellgate::checkpoint {

struct Rebase {
  uid_t from_uid = 0;
  uid_t to_uid = 0;
  gid_t from_gid = 0;
  gid_t to_gid = 0;
  std::string from_cgroup;  // the last component of the source's cgroup ("k-<id>")
  std::string to_cgroup;
  bool identity() const {
    return from_uid == to_uid && from_gid == to_gid && from_cgroup == to_cgroup;
  }
};

// Writes the rebased `in_path` to `out_path` (mode 0600) and answers true, or answers false and
// writes nothing when `name` (the file's name in criu/) holds nothing `r` changes.
Result<bool> rebase_image(const std::string& name, const std::string& in_path,
                          const std::string& out_path, const Rebase& r);

// The record-level edit behind rebase_image(), exposed for tests and the fuzz target: `image`
// is a whole CRIU image file of kind `name`; answers the rebased bytes.
Result<std::string> rebase_records(const std::string& name, std::string_view image,
                                   const Rebase& r);

}  // namespace cellgate::checkpoint
