#include "records.hpp"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>

#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/util/fs.hpp"

namespace cellgate::kernels {
namespace {

// Field 22 of /proc/<pid>/stat: with the pid it identifies the process across pid reuse.
std::string process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) {
    return "";
  }
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

}  // namespace

std::string record_path(const std::string& state_dir, const std::string& id) {
  return state_dir + "/kernels/" + id + ".json";
}

Result<void> write_record(const std::string& state_dir, const ManagedKernel& k,
                          const ProcessFacts& process, const jail::JailSpec& limits) {
  const nlohmann::json record = {
      {"id", k.id()},
      {"kernelspec", k.spec().name},
      {"connection", process.connection.to_json()},
      {"connection_file", process.connection_file},
      {"pid", process.pid},
      {"pid_start_time", process_start_time(process.pid)},
      {"jailed", process.jailed},
      {"uid", k.uid()},
      {"cgroup", "k-" + k.id()},
      {"work_dir", k.work_dir()},
      {"limits", launcher::spec_to_json(limits)},
      {"started_at", protocol::iso8601(std::chrono::system_clock::now())}};
  return atomic_write(record_path(state_dir, k.id()), record.dump(1), 0600);
}

void remove_record(const std::string& state_dir, const std::string& id) {
  ::unlink(record_path(state_dir, id).c_str());
}

}  // namespace cellgate::kernels
