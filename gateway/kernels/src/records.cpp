#include "records.hpp"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "cellgate/kernels/registry.hpp"
#include "cellgate/launcher/spec_json.hpp"
#include "cellgate/util/fs.hpp"

namespace cellgate::kernels {

std::string record_path(const std::string& state_dir, const std::string& id) {
  return state_dir + "/kernels/" + id + ".json";
}

Result<void> write_record(const std::string& state_dir, const ManagedKernel& k,
                          const ProcessFacts& process, const jail::JailSpec& limits, bool pooled,
                          bool hibernated) {
  nlohmann::json record = {{"id", k.id()},
                           {"kernelspec", k.spec().name},
                           {"connection", process.connection.to_json()},
                           {"connection_file", process.connection_file},
                           {"pid", process.pid},
                           {"pid_start_time", kernel::process_start_time(process.pid)},
                           {"jailed", process.jailed},
                           {"uid", k.uid()},
                           {"cgroup", "k-" + k.id()},
                           {"work_dir", k.work_dir()},
                           {"limits", launcher::spec_to_json(limits)},
                           {"started_at", protocol::iso8601(std::chrono::system_clock::now())},
                           {"pooled", pooled},
                           {"hibernated", hibernated},
                           {"env", k.env()}};
  if (process.adoption) {
    record["process"] = process.adoption->to_json();
  }
  return atomic_write(record_path(state_dir, k.id()), record.dump(1), 0600);
}

namespace {

// The fields of a record object; throws json::exception on a field of the wrong type.
void read_fields(const nlohmann::json& j, Record& r) {
  r.kernelspec = j.value("kernelspec", "");
  r.uid = j.value("uid", 0u);
  r.pooled = j.value("pooled", false);
  r.hibernated = j.value("hibernated", false);
  if (j.contains("env") && j["env"].is_object()) {
    for (const auto& [key, value] : j["env"].items()) {
      if (value.is_string()) {
        r.env[key] = value.get<std::string>();
      }
    }
  }
  if (j.contains("process")) {
    if (auto facts = kernel::AdoptionFacts::from_json(j["process"]); facts) {
      r.process = std::move(facts).value();
    }
  }
}

}  // namespace

std::vector<Record> read_records(const std::string& state_dir) {
  std::vector<Record> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(state_dir + "/kernels", ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".json" || !entry.is_regular_file(ec)) {
      continue;
    }
    Record r;
    r.path = entry.path().string();
    r.id = name.substr(0, name.size() - 5);
    std::ifstream in(r.path);
    const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      try {
        read_fields(j, r);
      } catch (const nlohmann::json::exception&) {
        Record bare;  // a field of the wrong type: unreadable, cleaned up
        bare.path = std::move(r.path);
        bare.id = std::move(r.id);
        r = std::move(bare);
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::set<uid_t> recorded_kernel_uids(const std::string& state_dir) {
  std::set<uid_t> out;
  for (const Record& r : read_records(state_dir)) {
    if (!r.pooled && r.process && r.uid != 0) {
      out.insert(r.uid);
    }
  }
  return out;
}

UidRangeOptions owned_by_state_dir(UidRangeOptions uids, const std::string& state_dir) {
  uids.owner = state_dir;
  uids.owner_keeps = [](const std::string& owner) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(owner + "/kernels", ec)) {
      if (entry.path().extension() == ".json") {
        return true;
      }
    }
    return false;
  };
  return uids;
}

void remove_record(const std::string& state_dir, const std::string& id) {
  ::unlink(record_path(state_dir, id).c_str());
}

}  // namespace cellgate::kernels
