#include "cellgate/launcher/spec_json.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

namespace cellgate::launcher {
namespace {

using nlohmann::json;

Error bad(const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, "bad_jail_spec", what);
}

}  // namespace

json spec_to_json(const jail::JailSpec& spec) {
  json binds_json = json::array();
  for (const auto& b : spec.binds) {
    binds_json.push_back({{"source", b.source}, {"target", b.target}, {"writable", b.writable}});
  }
  json j = {{"memory_bytes", spec.memory_bytes},
            {"pids", spec.pids},
            {"cpus", spec.cpus},
            {"tmp_bytes", spec.tmp_bytes},
            {"work_bytes", spec.work_bytes},
            {"shm_bytes", spec.shm_bytes},
            {"tmp_inodes", spec.tmp_inodes},
            {"nofile", spec.nofile},
            {"fsize_bytes", spec.fsize_bytes},
            {"memlock_bytes", spec.memlock_bytes},
            {"time_limit_seconds", spec.time_limit_seconds},
            {"hostname", spec.hostname},
            {"name", spec.name},
            {"cgroup_group", spec.cgroup_group},
            {"cgroup_parent", spec.cgroup_parent},
            {"work_dir", spec.work_dir},
            {"binds", binds_json},
            {"etc_binds", spec.etc_binds},
            {"system_binds", spec.system_binds},
            {"env", spec.env},
            {"optional", spec.optional},
            {"loopback_network", spec.loopback_network}};
  if (spec.uid) {
    j["uid"] = *spec.uid;
  }
  if (spec.gid) {
    j["gid"] = *spec.gid;
  }
  if (spec.access_gid) {
    j["access_gid"] = *spec.access_gid;
  }
  return j;
}

Result<jail::JailSpec> spec_from_json(const json& j) {
  if (!j.is_object()) {
    return bad("the jail spec is not a JSON object");
  }
  static constexpr std::array<std::string_view, 25> kKnownKeys = {"memory_bytes",
                                                                  "pids",
                                                                  "cpus",
                                                                  "tmp_bytes",
                                                                  "work_bytes",
                                                                  "shm_bytes",
                                                                  "tmp_inodes",
                                                                  "nofile",
                                                                  "fsize_bytes",
                                                                  "memlock_bytes",
                                                                  "time_limit_seconds",
                                                                  "uid",
                                                                  "gid",
                                                                  "access_gid",
                                                                  "hostname",
                                                                  "name",
                                                                  "cgroup_group",
                                                                  "cgroup_parent",
                                                                  "work_dir",
                                                                  "binds",
                                                                  "etc_binds",
                                                                  "system_binds",
                                                                  "env",
                                                                  "optional",
                                                                  "loopback_network"};
  for (const auto& [key, value] : j.items()) {
    if (std::find(kKnownKeys.begin(), kKnownKeys.end(), key) == kKnownKeys.end()) {
      // A misspelt limit must not silently fall back to a default.
      return bad("unknown key '" + key + "'");
    }
  }
  jail::JailSpec spec;
  try {
    auto get = [&](const char* key, auto& out) {
      if (auto it = j.find(key); it != j.end()) {
        it->get_to(out);
      }
    };
    get("memory_bytes", spec.memory_bytes);
    get("pids", spec.pids);
    get("cpus", spec.cpus);
    get("tmp_bytes", spec.tmp_bytes);
    get("work_bytes", spec.work_bytes);
    get("shm_bytes", spec.shm_bytes);
    get("tmp_inodes", spec.tmp_inodes);
    get("nofile", spec.nofile);
    get("fsize_bytes", spec.fsize_bytes);
    get("memlock_bytes", spec.memlock_bytes);
    get("time_limit_seconds", spec.time_limit_seconds);
    get("hostname", spec.hostname);
    get("name", spec.name);
    get("cgroup_group", spec.cgroup_group);
    get("cgroup_parent", spec.cgroup_parent);
    get("work_dir", spec.work_dir);
    get("etc_binds", spec.etc_binds);
    get("system_binds", spec.system_binds);
    get("env", spec.env);
    get("optional", spec.optional);
    get("loopback_network", spec.loopback_network);
    if (auto it = j.find("uid"); it != j.end() && !it->is_null()) {
      spec.uid = it->get<uid_t>();
    }
    if (auto it = j.find("gid"); it != j.end() && !it->is_null()) {
      spec.gid = it->get<gid_t>();
    }
    if (auto it = j.find("access_gid"); it != j.end() && !it->is_null()) {
      spec.access_gid = it->get<gid_t>();
    }
    if (auto it = j.find("binds"); it != j.end()) {
      for (const auto& b : *it) {
        spec.binds.push_back({b.at("source").get<std::string>(), b.at("target").get<std::string>(),
                              b.value("writable", false)});
      }
    }
  } catch (const json::exception& e) {
    return bad(std::string("a field has the wrong type: ") + e.what());
  }
  CELLGATE_TRY(spec.validate());
  return spec;
}

Result<jail::JailSpec> load_spec(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return errno_error(ErrorCode::kNotFound, "bad_jail_spec", "open('" + path + "')", errno);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) {
    return make_error(ErrorCode::kInvalidArgument, "bad_jail_spec", path + " is not valid JSON");
  }
  return spec_from_json(j);
}

}  // namespace cellgate::launcher
