// Internal: the skeleton of a jail's root, for CRIU's --root.
//
// CRIU does not save the root mount of the namespace it dumps; at restore it mounts everything
// else onto the directory --root names, which must hold every mount point and what the root
// tmpfs held itself (build_root()'s /etc/passwd, the /bin -> usr/bin links). copy_skeleton()
// copies that: directories, symlinks and regular files on the source root's own filesystem,
// and, for what is mounted over (another device), an empty directory or file of the same mode
// to mount on, never descending into it. The source is a jail's /proc/PID/root at dump (its
// root tmpfs is read-only and root's), or the image's copy at restore.
//
// Thread-safety: functions.
#pragma once

#include <string>

#include "cellgate/result.hpp"

namespace cellgate::checkpoint {

// Copies the skeleton of the directory tree at `source` into the existing directory `target`.
// Files larger than 1 MiB, special files and a depth past 32 are refused: a jail's root holds
// none of them.
Result<void> copy_skeleton(const std::string& source, const std::string& target);

}  // namespace cellgate::checkpoint
