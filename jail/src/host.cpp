// What the host supports, for the start-up log and for failing closed with a clear reason.
#include <linux/landlock.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "cellgate/jail/cgroup.hpp"
#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/seccomp.hpp"
#include "cellgate/sys/file.hpp"

namespace cellgate::jail {

HostSupport probe_host() {
  HostSupport h;
  h.root = ::geteuid() == 0;
  h.user_namespaces =
      std::atol(sys::read_trimmed("/proc/sys/user/max_user_namespaces").c_str()) > 0;
  long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  h.landlock_abi = abi > 0 ? static_cast<int>(abi) : 0;
  auto cg = CgroupHost::detect_system();
  h.cgroup = cg ? cg->describe() : "no usable cgroups: " + cg.error().message;
  h.seccomp = describe_seccomp_support();
  utsname u{};
  if (::uname(&u) == 0) {
    h.kernel_release = u.release;
  }
  return h;
}

std::string HostSupport::describe() const {
  return "linux " + kernel_release + "; " + (root ? "running as root" : "not root") +
         "; user namespaces " + (user_namespaces ? "available" : "unavailable") + "; landlock " +
         (landlock_abi > 0 ? "ABI " + std::to_string(landlock_abi) + " (applied to every kernel)"
                           : "unavailable (kernels start only with \"landlock\" optional)") +
         "; " + cgroup + "; " + seccomp;
}

}  // namespace cellgate::jail
