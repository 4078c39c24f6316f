// Ending what a kernel left behind when nothing supervises it any more: its cgroup (and whatever
// still runs there), its runtime dir and the work dir mounted in it. Used by adoption (a previous
// gateway's kernels) and by the broker at its start (privilege separation).
#pragma once

#include <sys/mount.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/launcher/status.hpp"

namespace cellgate::kernels {

inline jail::CgroupVersion cgroup_version(const std::string& v) {
  return v == "v2" ? jail::CgroupVersion::kV2 : jail::CgroupVersion::kV1;
}

// Kills whatever still runs in a kernel's cgroup and removes it (the launcher would have).
inline void end_cgroup(const std::string& version, const std::vector<std::string>& dirs) {
  if (!dirs.empty()) {
    jail::Cgroup::adopt(cgroup_version(version), dirs);  // its destructor kills and removes
  }
}

// The kernel's cgroup as its launcher reported it in the status file ("started").
inline void end_cgroup_from_status(const std::string& status_file) {
  std::ifstream in(status_file);
  for (std::string line; std::getline(in, line);) {
    auto ev = launcher::StatusEvent::parse_line(line);
    if (ev && ev->kind == launcher::StatusEvent::Kind::kStarted) {
      end_cgroup(ev->cgroup_version, ev->cgroup_paths);
    }
  }
}

// A runtime dir (connection key, ipc sockets, status, log), with a work dir mounted in it when
// the kernel had no home of its own.
inline void remove_runtime_dir(const std::string& dir) {
  ::umount2((dir + "/work").c_str(), MNT_DETACH);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Every runtime dir (cellgate-*) in `run_dir` but those in `keep`, with what still runs in the
// cgroup its launcher reported: a start cut short, or a kernel nothing supervises any more.
// Returns how many were removed.
inline std::size_t end_runtime_dirs(const std::string& run_dir,
                                    const std::set<std::string>& keep = {}) {
  std::size_t ended = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
    const std::string path = entry.path().string();
    if (entry.path().filename().string().rfind("cellgate-", 0) != 0 || !entry.is_directory(ec) ||
        keep.count(path) != 0) {
      continue;
    }
    end_cgroup_from_status(path + "/status");
    remove_runtime_dir(path);
    ++ended;
  }
  return ended;
}

}  // namespace cellgate::kernels
