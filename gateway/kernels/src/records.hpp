// State records: state_dir/kernels/<id>.json, one per client-visible kernel, written atomically
// (util/fs.hpp's atomic_write, 0600: it holds the connection key) when the kernel starts or
// restarts, removed when it is shut down. They say what a restarted gateway needs to find the
// kernel again: connection, pid and its start time, uid, cgroup, work dir, limits.
#pragma once

#include <string>

#include "cellgate/jail/spec.hpp"
#include "cellgate/kernels/managed_kernel.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernels {

std::string record_path(const std::string& state_dir, const std::string& id);
Result<void> write_record(const std::string& state_dir, const ManagedKernel& k,
                          const ProcessFacts& process, const jail::JailSpec& limits);
void remove_record(const std::string& state_dir, const std::string& id);

}  // namespace cellgate::kernels
