// State records: state_dir/kernels/<id>.json, one per client-visible kernel, written atomically
// (util/fs.hpp's atomic_write, 0600: it holds the connection key) when the kernel starts or
// restarts, removed when it is shut down; pooled kernels have one too (marked "pooled"), so
// nothing a gateway started is unaccounted for after a crash. They say what a restarted gateway
// needs to find the kernel again (records.cpp's read_records; registry.cpp's adopt_kernels):
// the launcher and its start time, connection, uid, client env, cgroup, work dir, limits.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cellgate/jail/spec.hpp"
#include "cellgate/kernels/managed_kernel.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernels {

std::string record_path(const std::string& state_dir, const std::string& id);
// `hibernated`: the kernel has no process; its image is in <state_dir>/kernels/<id>/hibernated
// and the process facts say where its runtime dir (jail spec, connection) is kept.
Result<void> write_record(const std::string& state_dir, const ManagedKernel& k,
                          const ProcessFacts& process, const jail::JailSpec& limits,
                          bool pooled = false, bool hibernated = false);

// A record as read back.
struct Record {
  std::string path;
  std::string id;
  std::string kernelspec;
  uid_t uid = 0;
  bool pooled = false;
  bool hibernated = false;
  std::map<std::string, std::string> env;
  std::optional<kernel::AdoptionFacts> process;  // absent in records of older gateways
};
// Every record in state_dir/kernels; unreadable ones are returned with only `path` and `id` set
// (from the file name), so the caller can still clean up after them.
std::vector<Record> read_records(const std::string& state_dir);
void remove_record(const std::string& state_dir, const std::string& id);

}  // namespace cellgate::kernels
