#include "cellgate/jail/spec.hpp"

#include <cctype>
#include <fstream>
#include <sstream>

namespace cellgate::jail {
namespace {

using nlohmann::json;

const std::set<std::string> kKnownOptional = {"memory", "swap", "pids", "cpu", "work_size"};

}  // namespace

json JailSpec::to_json() const {
  json binds_json = json::array();
  for (const auto& b : binds) {
    binds_json.push_back({{"source", b.source}, {"target", b.target}, {"writable", b.writable}});
  }
  json j = {{"memory_bytes", memory_bytes},
            {"pids", pids},
            {"cpus", cpus},
            {"tmp_bytes", tmp_bytes},
            {"work_bytes", work_bytes},
            {"shm_bytes", shm_bytes},
            {"tmp_inodes", tmp_inodes},
            {"nofile", nofile},
            {"fsize_bytes", fsize_bytes},
            {"memlock_bytes", memlock_bytes},
            {"time_limit_seconds", time_limit_seconds},
            {"hostname", hostname},
            {"name", name},
            {"cgroup_group", cgroup_group},
            {"work_dir", work_dir},
            {"binds", binds_json},
            {"etc_binds", etc_binds},
            {"env", env},
            {"optional", optional}};
  if (uid) {
    j["uid"] = *uid;
  }
  if (gid) {
    j["gid"] = *gid;
  }
  return j;
}

Result<JailSpec> JailSpec::from_json(const json& j) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "bad_jail_spec", what);
  };
  if (!j.is_object()) {
    return bad("the jail spec is not a JSON object");
  }
  static const std::set<std::string> kKnownKeys = {
      "memory_bytes", "pids",       "cpus",      "tmp_bytes",      "work_bytes",
      "shm_bytes",    "tmp_inodes", "nofile",    "fsize_bytes",    "memlock_bytes",
      "time_limit_seconds", "uid", "gid",       "hostname",       "name",
      "cgroup_group", "work_dir",   "binds",     "etc_binds",      "env",
      "optional"};
  for (const auto& [key, value] : j.items()) {
    if (kKnownKeys.count(key) == 0) {
      // A misspelt limit must not silently fall back to a default.
      return bad("unknown key '" + key + "'");
    }
  }
  JailSpec spec;
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
    get("work_dir", spec.work_dir);
    get("etc_binds", spec.etc_binds);
    get("env", spec.env);
    get("optional", spec.optional);
    if (auto it = j.find("uid"); it != j.end() && !it->is_null()) {
      spec.uid = it->get<uid_t>();
    }
    if (auto it = j.find("gid"); it != j.end() && !it->is_null()) {
      spec.gid = it->get<gid_t>();
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
  if (spec.pids <= 0 || spec.cpus <= 0 || spec.memory_bytes < (16ull << 20)) {
    return bad("limits must be positive (memory at least 16 MiB)");
  }
  if (spec.uid && *spec.uid == 0) {
    return bad("the kernel's uid must not be 0");
  }
  if (spec.gid && *spec.gid == 0) {
    return bad("the kernel's gid must not be 0");
  }
  for (const auto& name : spec.optional) {
    if (kKnownOptional.count(name) == 0) {
      return bad("unknown optional limit '" + name + "' (known: memory, swap, pids, cpu, work_size)");
    }
  }
  auto plain_name = [](const std::string& s) {
    if (s.empty() || s == "." || s == ".." || s.size() > 128) {
      return false;
    }
    for (char c : s) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '@')) {
        return false;
      }
    }
    return true;
  };
  if (!plain_name(spec.cgroup_group)) {
    return bad("cgroup_group must be a plain name ([A-Za-z0-9_@-])");
  }
  if (!spec.name.empty() && !plain_name(spec.name)) {
    return bad("name must be a plain name ([A-Za-z0-9_@-])");
  }
  for (const auto& b : spec.binds) {
    if (b.source.empty() || b.target.empty() || b.target.front() != '/' ||
        b.target.find("..") != std::string::npos) {
      return bad("bind mounts need a source and an absolute target without '..'");
    }
  }
  for (const auto& e : spec.etc_binds) {
    if (e.empty() || e.find('/') != std::string::npos || e == "." || e == "..") {
      return bad("etc_binds are names directly under /etc");
    }
    if (e == "shadow" || e == "gshadow" || e == "ssh" || e == "sudoers") {
      return bad("/etc/" + e + " is never bound into a jail");
    }
  }
  return spec;
}

Result<JailSpec> JailSpec::load(const std::string& path) {
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
  return from_json(j);
}

}  // namespace cellgate::jail
