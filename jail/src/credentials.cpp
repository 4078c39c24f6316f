// Credentials: an unprivileged uid/gid, no groups, no capabilities, no way back.
#include <grp.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "cellgate/jail/jail.hpp"
#include "cellgate/jail/userns.hpp"

namespace cellgate::jail {
namespace {

Error credentials_error(const std::string& call) {
  return errno_error(ErrorCode::kInternal, "credentials", call, errno);
}

}  // namespace

Result<void> drop_privileges(uid_t uid, gid_t gid) {
  // Rootless (userns.hpp): the namespace maps only uid 0, which is the unprivileged user
  // outside; it is then the kernel's uid, and what follows still strips every capability.
  const bool rootless = in_single_uid_user_namespace();
  if ((uid == 0 || gid == 0) && !rootless) {
    return make_error(ErrorCode::kInvalidArgument, "credentials", "refusing uid or gid 0");
  }
  // Empty the bounding set while we still hold CAP_SETPCAP: nothing exec'd later (a setuid or
  // file-capability binary) can gain a capability outside it.
  for (int cap = 0; cap <= CAP_LAST_CAP; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) {
      return credentials_error("prctl(PR_CAPBSET_DROP, " + std::to_string(cap) + ")");
    }
  }
  // uid 0 gets no special capability treatment, and the bits cannot be changed back.
  const unsigned long securebits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED |
                                   SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED;
  if (::prctl(PR_SET_SECUREBITS, securebits, 0, 0, 0) != 0) {
    return credentials_error(
        "prctl(PR_SET_SECUREBITS, NOROOT|NOROOT_LOCKED|NO_SETUID_FIXUP_LOCKED|"
        "KEEP_CAPS_LOCKED)");
  }
  // In a user namespace whose setgroups is "deny" the list is already fixed (the gateway's).
  if (::setgroups(0, nullptr) != 0 && !(rootless && errno == EPERM)) {
    return credentials_error("setgroups(0, NULL)");
  }
  if (::setresgid(gid, gid, gid) != 0) {
    return credentials_error("setresgid(" + std::to_string(gid) + ")");
  }
  // From root to a non-zero uid the kernel clears permitted and effective capabilities.
  if (::setresuid(uid, uid, uid) != 0) {
    return credentials_error("setresuid(" + std::to_string(uid) + ")");
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
    return credentials_error("prctl(PR_CAP_AMBIENT_CLEAR_ALL)");
  }
  // And the inheritable set too, explicitly.
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capset, &header, data) != 0) {
    return credentials_error("capset(all empty)");
  }
  // Check rather than trust: no capability is left, and getting root back must fail.
  __user_cap_data_struct now[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, now) != 0) {
    return credentials_error("capget()");
  }
  for (const auto& d : now) {
    if (d.effective != 0 || d.permitted != 0 || d.inheritable != 0) {
      return make_error(ErrorCode::kInternal, "credentials", "a capability is left after the drop");
    }
  }
  if (!rootless && ::setuid(0) == 0) {
    return make_error(ErrorCode::kInternal, "credentials", "setuid(0) succeeded after the drop");
  }
  return {};
}

Result<void> set_no_new_privs() {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return credentials_error("prctl(PR_SET_NO_NEW_PRIVS, 1)");
  }
  return {};
}

Result<void> close_inherited_fds(int keep) {
  auto close_range = [](unsigned first, unsigned last) {
    return ::syscall(SYS_close_range, first, last, 0u);
  };
  if (keep > 3) {
    if (close_range(3, static_cast<unsigned>(keep - 1)) != 0) {
      return credentials_error("close_range(3, " + std::to_string(keep - 1) + ")");
    }
  }
  const unsigned from = keep >= 3 ? static_cast<unsigned>(keep + 1) : 3u;
  if (close_range(from, ~0u) != 0) {
    return credentials_error("close_range(" + std::to_string(from) + ", ~0)");
  }
  return {};
}

}  // namespace cellgate::jail
