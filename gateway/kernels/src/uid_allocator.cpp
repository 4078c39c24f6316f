// UidAllocator: disjoint uid ranges per gateway (flock()ed lease files) and no uid handed out
// while a process still runs as it (/proc).
#include "cellgate/kernels/uid_allocator.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "cellgate/sys/error_text.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/proc.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  return sys::error_text(err);
}

}  // namespace

std::set<uid_t> uids_with_live_processes(const std::string& proc) {
  std::set<uid_t> out;
  for (const pid_t pid : sys::list_pids(proc)) {
    // "Uid:\t0\t0\t0\t0" (real, effective, saved, fs); nothing when the process is gone (a
    // race with its exit: then it holds no uid either).
    auto status = sys::read_file(proc + "/" + std::to_string(pid) + "/status", 1 << 16);
    if (!status) {
      continue;
    }
    for (uid_t u : sys::status_ids(*status, "Uid")) {
      out.insert(u);
    }
  }
  return out;
}

UidAllocator::UidAllocator(UidRangeOptions options) : options_(std::move(options)) {}

Result<void> UidAllocator::lease() {
  MutexLock lock(mu_);
  return lease_locked();
}

Result<bool> UidAllocator::lease_in(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return make_error(ErrorCode::kInternal, "uid_lease_dir",
                      "cannot make the uid lease dir " + dir + ": " + ec.message());
  }
  // Root's alone: whoever can write here can take or hold every range.
  ::chmod(dir.c_str(), 0700);
  for (std::size_t i = 0; i < options_.ranges; ++i) {
    const std::string path = dir + "/range-" + std::to_string(i);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) {
      return make_error(ErrorCode::kInternal, "uid_lease_dir",
                        "cannot open the uid lease file " + path + ": " + errno_text(errno));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        continue;  // another live gateway's
      }
      return make_error(ErrorCode::kInternal, "uid_lease_dir",
                        "cannot lock the uid lease file " + path + ": " + errno_text(errno));
    }
    Range r;
    r.first = options_.base + static_cast<uid_t>(i) * options_.range_size;
    r.last = r.first + options_.range_size - 1;
    r.lease_file = path;
    // Who holds it, for an operator reading the dir (the lock, not this text, is the lease).
    const std::string holder = "pid " + std::to_string(::getpid()) + "\nuids " +
                               std::to_string(r.first) + "-" + std::to_string(r.last) + "\n";
    if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), holder.data(), holder.size(), 0) < 0) {
      spdlog::debug("uid ranges: cannot note our pid in {}: {}", path, errno_text(errno));
    }
    lease_fd_ = std::move(fd);
    range_ = std::move(r);
    return true;
  }
  return false;
}

Result<void> UidAllocator::lease_locked() {
  if (range_) {
    return ok_result();
  }
  constexpr auto kMaxUid = static_cast<unsigned long long>(std::numeric_limits<uid_t>::max());
  if (options_.range_size == 0 || options_.ranges == 0 || options_.base == 0 ||
      static_cast<unsigned long long>(options_.base) +
              static_cast<unsigned long long>(options_.range_size) * options_.ranges >=
          kMaxUid) {
    return make_error(ErrorCode::kInvalidArgument, "uid_ranges",
                      "bad kernel uid ranges: base " + std::to_string(options_.base) + ", " +
                          std::to_string(options_.ranges) + " ranges of " +
                          std::to_string(options_.range_size) +
                          " uids (all must be > 0 and end below 4294967295)");
  }
  std::string dir = options_.lease_dir;
  auto leased = lease_in(dir);
  if (!leased && !options_.fallback_lease_dir.empty()) {
    spdlog::warn(
        "uid ranges: {}; leasing in {} instead, so gateways with other state dirs on this host "
        "may draw the same uid range (uids with live processes are still skipped)",
        leased.error().message, options_.fallback_lease_dir);
    dir = options_.fallback_lease_dir;
    leased = lease_in(dir);
  }
  if (!leased) {
    return std::move(leased).error();
  }
  if (!*leased) {
    return make_error(
        ErrorCode::kResourceExhausted, "uid_ranges_exhausted",
        "no kernel uid range is free: all " + std::to_string(options_.ranges) + " ranges of " +
            std::to_string(options_.range_size) + " uids from " + std::to_string(options_.base) +
            " are held by other gateways on this host (their pids are in " + dir +
            "/range-*); stop one, or raise --kernel-uid-ranges or move --kernel-uid-base");
  }
  spdlog::info("uid ranges: kernels run as uids {}-{} (lease {})", range_->first, range_->last,
               range_->lease_file);
  return ok_result();
}

Result<uid_t> UidAllocator::allocate() {
  MutexLock lock(mu_);
  CELLGATE_TRY(lease_locked());
  const std::set<uid_t> busy = uids_with_live_processes();
  for (uid_t uid = range_->first;; ++uid) {
    if (in_use_.count(uid) == 0) {
      if (busy.count(uid) == 0) {
        in_use_.insert(uid);
        return uid;
      }
      // An orphan of an earlier gateway (or anyone's): sharing its uid would share its
      // RLIMIT_NPROC and every other per-uid resource with the new kernel.
      spdlog::warn("uid ranges: skipping uid {}: processes still run as it", uid);
    }
    if (uid == range_->last) {
      break;
    }
  }
  return make_error(
      ErrorCode::kResourceExhausted, "uids_exhausted",
      "no free kernel uid: every uid of " + std::to_string(range_->first) + "-" +
          std::to_string(range_->last) +
          " is held by a kernel or still has live processes (orphans of an earlier gateway?); "
          "end those processes or raise --kernel-uid-range-size");
}

Result<void> UidAllocator::reserve(uid_t uid) {
  MutexLock lock(mu_);
  CELLGATE_TRY(lease_locked());
  if (uid < range_->first || uid > range_->last) {
    return make_error(ErrorCode::kFailedPrecondition, "uid_outside_range",
                      "uid " + std::to_string(uid) + " is outside this gateway's kernel uids " +
                          std::to_string(range_->first) + "-" + std::to_string(range_->last) +
                          " (another gateway's range, or another --kernel-uid-range-size)");
  }
  if (!in_use_.insert(uid).second) {
    return make_error(ErrorCode::kFailedPrecondition, "uid_in_use",
                      "uid " + std::to_string(uid) + " is another kernel's already");
  }
  return {};
}

void UidAllocator::release(uid_t uid) {
  MutexLock lock(mu_);
  in_use_.erase(uid);
}

std::optional<UidAllocator::Range> UidAllocator::range() const {
  MutexLock lock(mu_);
  return range_;
}

}  // namespace cellgate::kernels
