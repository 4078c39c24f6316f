// A JailSpec as JSON: the launcher's --spec file, the "spec" of a zygote request, and what the
// gateway writes for both. Unknown keys are refused (a misspelt limit must not fall back to a
// default); absent keys keep JailSpec's defaults; the result is checked by JailSpec::validate().
//
//   {"memory_bytes": 536870912, "pids": 64, "work_dir": "/var/lib/cellgate/k1/work",
//    "binds": [{"source": "/usr/local/bin/probe", "target": "/opt/probe", "writable": false}],
//    "optional": ["swap"]}
//
//   CELLGATE_ASSIGN_OR_RETURN(jail::JailSpec spec, load_spec(path));
//   std::string text = spec_to_json(spec).dump(1);
//
// Errors are kInvalidArgument "bad_jail_spec" (kNotFound when the file cannot be opened); no
// nlohmann exception leaves these functions. Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cellgate/jail/spec.hpp"
#include "cellgate/result.hpp"

namespace cellgate::launcher {

nlohmann::json spec_to_json(const jail::JailSpec& spec);
Result<jail::JailSpec> spec_from_json(const nlohmann::json& j);
// Reads and parses a JSON file.
Result<jail::JailSpec> load_spec(const std::string& path);

}  // namespace cellgate::launcher
