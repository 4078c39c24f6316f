#include "cellgate/util/descriptors.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <string>

#include "cellgate/sys/proc.hpp"

namespace cellgate {

std::size_t descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return std::size_t{1} << 30;
  }
  return static_cast<std::size_t>(limit.rlim_cur);
}

std::size_t descriptor_headroom() {
  return std::clamp<std::size_t>(descriptor_limit() / 16, 32, 256);
}

bool near_descriptor_limit(int fd) {
  if (fd < 0) {
    return false;
  }
  return static_cast<std::size_t>(fd) + 1 + descriptor_headroom() > descriptor_limit();
}

std::size_t descriptors_open() {
  return sys::open_fds().size();  // 0 when /proc is missing or we are out of descriptors
}

std::size_t descriptors_free() {
  const std::size_t limit = descriptor_limit();
  const auto fds = sys::open_fds();
  if (fds.empty()) {
    return 0;  // nothing to count with
  }
  const auto below = static_cast<std::size_t>(std::count_if(
      fds.begin(), fds.end(), [limit](int fd) { return static_cast<std::size_t>(fd) < limit; }));
  return limit - std::min(below, limit);
}

Result<void> require_free_descriptors(std::size_t needed, const char* what) {
  const std::size_t free = descriptors_free();
  if (free >= needed) {
    return {};
  }
  return Error{ErrorCode::kResourceExhausted, "out_of_descriptors",
               std::string("out of file descriptors: ") + what + " needs " +
                   std::to_string(needed) + " and " + std::to_string(free) + " of " +
                   std::to_string(descriptor_limit()) +
                   " are free (raise the gateway's RLIMIT_NOFILE, or lower --max-connections)"};
}

}  // namespace cellgate
