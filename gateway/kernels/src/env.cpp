#include "env.hpp"

namespace cellgate::kernels {

// jupyter_server 1.23 sends its whole environment here: everything not asked for is dropped
// unlogged.
Result<std::map<std::string, std::string>> filter_env(const nlohmann::json& env,
                                                      const std::set<std::string>& allow) {
  std::map<std::string, std::string> out;
  if (env.is_null()) {
    return out;
  }
  if (!env.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "bad_env", "'env' must be an object");
  }
  for (const auto& [key, value] : env.items()) {
    if (!key.starts_with("KERNEL_") && allow.count(key) == 0) {
      continue;
    }
    if (!value.is_string()) {
      return make_error(ErrorCode::kInvalidArgument, "bad_env",
                        "env value of " + key + " must be a string");
    }
    const auto& v = value.get_ref<const std::string&>();
    if (v.size() > 4096 || v.find_first_of(std::string("\0\n\r", 3)) != std::string::npos) {
      return make_error(ErrorCode::kInvalidArgument, "bad_env",
                        "env value of " + key + " is too long or has control characters");
    }
    out[key] = v;
  }
  return out;
}

}  // namespace cellgate::kernels
