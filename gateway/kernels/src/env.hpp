// The client-env filter: what of a client's `env` (POST /api/kernels) reaches a kernel.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cellgate/result.hpp"

namespace cellgate::kernels {

// Only KERNEL_* and allowlisted names, string values without control characters, at most 4 KiB
// each. kInvalidArgument ("bad_env") for a non-object or a bad value of a kept name.
Result<std::map<std::string, std::string>> filter_env(const nlohmann::json& env,
                                                      const std::set<std::string>& allow);

}  // namespace cellgate::kernels
