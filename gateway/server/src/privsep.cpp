#include "privsep.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>

#include "cellgate/jail/jail.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::server {
namespace {

namespace fs = std::filesystem;

Error bad_user(const std::string& message) {
  return make_error(ErrorCode::kInvalidArgument, "bad_user", message);
}

// A uid or gid: digits, below 2^32 - 1 ((uid_t)-1 means "unchanged" to the kernel).
bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 10 && s.find_first_not_of("0123456789") == std::string::npos &&
         std::stoull(s) < 0xffffffffull;
}

Result<void> make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return errno_error(ErrorCode::kInternal, "state_dir", "mkdir('" + path + "')", errno);
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return make_error(ErrorCode::kFailedPrecondition, "state_dir",
                      path + " must be a directory (not a symlink)");
  }
  return {};
}

Result<void> own(const std::string& path, uid_t uid, gid_t gid, mode_t mode) {
  if (::lchown(path.c_str(), uid, gid) != 0 || ::chmod(path.c_str(), mode) != 0) {
    return errno_error(ErrorCode::kInternal, "state_dir", "chown/chmod('" + path + "')", errno);
  }
  return {};
}

// The gateway's own subdirectory, with everything a root gateway may have left in it.
Result<void> give_tree(const std::string& path, const GatewayUser& user) {
  CELLGATE_TRY(make_dir(path, 0700));
  CELLGATE_TRY(own(path, user.uid, user.gid, 0700));
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    // lchown: a symlink is changed itself, never what it points at.
    if (::lchown(it->path().c_str(), user.uid, user.gid) != 0) {
      return errno_error(ErrorCode::kInternal, "state_dir", "lchown('" + it->path().string() + "')",
                         errno);
    }
  }
  return {};
}

}  // namespace

Result<GatewayUser> resolve_gateway_user(const std::string& spec) {
  GatewayUser user;
  const auto colon = spec.find(':');
  const std::string first = spec.substr(0, colon);
  if (all_digits(first)) {
    user.uid = static_cast<uid_t>(std::stoul(first));
    user.gid = static_cast<gid_t>(user.uid);
    user.name = first;
    if (colon != std::string::npos) {
      const std::string second = spec.substr(colon + 1);
      if (!all_digits(second)) {
        return bad_user("--user " + spec + ": a numeric user takes a numeric group (uid:gid)");
      }
      user.gid = static_cast<gid_t>(std::stoul(second));
    }
  } else {
    if (colon != std::string::npos || first.empty()) {
      return bad_user("--user takes a user name or uid[:gid], not '" + spec + "'");
    }
    const passwd* pw = ::getpwnam(first.c_str());
    if (pw == nullptr) {
      return bad_user("--user " + first +
                      ": no such user (a system user for the gateway: "
                      "useradd --system --no-create-home --shell /usr/sbin/nologin " +
                      first + ")");
    }
    user.name = first;
    user.uid = pw->pw_uid;
    user.gid = pw->pw_gid;
  }
  if (user.uid == 0 || user.gid == 0) {
    return bad_user("--user " + spec + " is root (uid or gid 0); the gateway's user must not be");
  }
  return user;
}

Result<void> prepare_state_dir(const std::string& state_dir, const GatewayUser& user) {
  if (state_dir.empty() || state_dir.front() != '/') {
    return make_error(ErrorCode::kInvalidArgument, "state_dir",
                      "--user needs an absolute --state-dir, not '" + state_dir + "'");
  }
  // Missing parents as a package would make them; each existing one must let the user through.
  for (std::size_t pos = 1; pos < state_dir.size(); ++pos) {
    if (state_dir[pos] != '/') {
      continue;
    }
    const std::string parent = state_dir.substr(0, pos);
    CELLGATE_TRY(make_dir(parent, 0755));
    struct stat st {};
    if (::stat(parent.c_str(), &st) != 0) {
      return errno_error(ErrorCode::kInternal, "state_dir", "stat('" + parent + "')", errno);
    }
    const bool passes = (st.st_mode & S_IXOTH) != 0 ||
                        (st.st_uid == user.uid && (st.st_mode & S_IXUSR) != 0) ||
                        (st.st_gid == user.gid && (st.st_mode & S_IXGRP) != 0);
    if (!passes) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
      return make_error(ErrorCode::kFailedPrecondition, "state_dir",
                        "the gateway's user " + user.name + " cannot reach the state dir " +
                            state_dir + " through " + parent + " (mode " + mode +
                            "); give it a --state-dir it can reach, e.g. /var/lib/cellgate");
    }
  }
  CELLGATE_TRY(make_dir(state_dir, 0711));
  CELLGATE_TRY(own(state_dir, 0, 0, 0711));
  for (const char* broker_dir : {"/run", "/work"}) {
    CELLGATE_TRY(make_dir(state_dir + broker_dir, 0710));
    CELLGATE_TRY(own(state_dir + broker_dir, 0, user.gid, 0710));
  }
  for (const char* mine : {"/kernels", "/artifacts", "/audit", "/uid-ranges"}) {
    CELLGATE_TRY(give_tree(state_dir + mine, user));
  }
  const std::string lock = state_dir + "/lock";
  UniqueFd fd(::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd || ::fchown(fd.get(), user.uid, user.gid) != 0) {
    return errno_error(ErrorCode::kInternal, "state_dir", "open/fchown('" + lock + "')", errno);
  }
  return {};
}

Result<void> become_gateway_user(const GatewayUser& user) {
  CELLGATE_TRY(jail::drop_privileges(user.uid, user.gid));
  CELLGATE_TRY(jail::set_no_new_privs());
  // The uid change made us undumpable, which would leave /proc/self to root; we are our own.
  if (::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) {
    return errno_error(ErrorCode::kInternal, "credentials", "prctl(PR_SET_DUMPABLE, 1)", errno);
  }
  uid_t r, e, s;
  if (::getresuid(&r, &e, &s) != 0 || r != user.uid || e != user.uid || s != user.uid) {
    return make_error(ErrorCode::kInternal, "credentials", "the uid did not change");
  }
  return {};
}

}  // namespace cellgate::server
