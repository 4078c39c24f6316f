// UidAllocator: disjoint uid ranges per gateway (flock()ed lease files) and no uid handed out
// while a process still runs as it (/proc).
#include "cellgate/kernels/uid_allocator.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string_view>
#include <utility>
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

Result<void> UidAllocator::lease(const std::set<uid_t>& wanted) {
  MutexLock lock(mu_);
  return lease_locked(wanted);
}

namespace {

constexpr std::string_view kOwnerKey = "state_dir ";

// The owner a lease file names ("" when none: never used, or by a gateway before owners).
std::string lease_owner(int fd) {
  char buf[4096];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  if (n <= 0) {
    return "";
  }
  const std::string_view text(buf, static_cast<std::size_t>(n));
  for (std::size_t at = 0; at < text.size();) {
    std::size_t eol = text.find('\n', at);
    if (eol == std::string_view::npos) {
      return "";  // cut short: no whole line to trust
    }
    const std::string_view line = text.substr(at, eol - at);
    if (line.substr(0, kOwnerKey.size()) == kOwnerKey) {
      return std::string(line.substr(kOwnerKey.size()));
    }
    at = eol + 1;
  }
  return "";
}

}  // namespace

Result<bool> UidAllocator::lease_in(const std::string& dir, const std::set<uid_t>& wanted) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return make_error(ErrorCode::kInternal, "uid_lease_dir",
                      "cannot make the uid lease dir " + dir + ": " + ec.message());
  }
  // Root's alone: whoever can write here can take or hold every range.
  ::chmod(dir.c_str(), 0700);
  // The ranges of the uids our kernels run as, most kernels first; then all the others in order.
  std::map<std::size_t, std::size_t> counts;
  for (const uid_t uid : wanted) {
    if (uid >= options_.base) {
      const std::size_t i = (uid - options_.base) / options_.range_size;
      if (i < options_.ranges) {
        ++counts[i];
      }
    }
  }
  std::vector<std::size_t> order;
  order.reserve(options_.ranges);
  for (const auto& [i, n] : counts) {
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return counts[a] > counts[b]; });
  for (std::size_t i = 0; i < options_.ranges; ++i) {
    if (counts.count(i) == 0) {
      order.push_back(i);
    }
  }
  // Free ranges another state dir still keeps kernels in: taken only when nothing else is free.
  std::vector<std::pair<std::size_t, std::string>> kept;
  for (const std::size_t i : order) {
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
    if (counts.count(i) == 0 && options_.owner_keeps) {
      std::string owner = lease_owner(fd.get());
      if (!owner.empty() && owner != options_.owner && options_.owner_keeps(owner)) {
        kept.emplace_back(i, std::move(owner));
        continue;  // unlocked as fd closes
      }
    }
    take(i, path, std::move(fd));
    return true;
  }
  for (const auto& [i, owner] : kept) {
    const std::string path = dir + "/range-" + std::to_string(i);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
    if (fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) {
      spdlog::warn(
          "uid ranges: every other range is held, so this gateway takes range {}, last used by "
          "the state dir {}: its kernels that were left running or hibernated cannot come back "
          "there while this gateway runs",
          i, owner);
      take(i, path, std::move(fd));
      return true;
    }
  }
  return false;
}

void UidAllocator::take(std::size_t i, const std::string& path, UniqueFd fd) {
  Range r;
  r.first = options_.base + static_cast<uid_t>(i) * options_.range_size;
  r.last = r.first + options_.range_size - 1;
  r.lease_file = path;
  // Who holds it, for an operator reading the dir and for the next gateway of our state dir (the
  // lock, not this text, is the lease).
  std::string holder = "pid " + std::to_string(::getpid()) + "\nuids " + std::to_string(r.first) +
                       "-" + std::to_string(r.last) + "\n";
  if (!options_.owner.empty() && options_.owner.find('\n') == std::string::npos) {
    holder += std::string(kOwnerKey) + options_.owner + "\n";
  }
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), holder.data(), holder.size(), 0) < 0) {
    spdlog::debug("uid ranges: cannot note our pid in {}: {}", path, errno_text(errno));
  }
  lease_fd_ = std::move(fd);
  range_ = std::move(r);
}

Result<void> UidAllocator::lease_locked(const std::set<uid_t>& wanted) {
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
  auto leased = lease_in(dir, wanted);
  if (!leased && !options_.fallback_lease_dir.empty()) {
    spdlog::warn(
        "uid ranges: {}; leasing in {} instead, so gateways with other state dirs on this host "
        "may draw the same uid range (uids with live processes are still skipped)",
        leased.error().message, options_.fallback_lease_dir);
    dir = options_.fallback_lease_dir;
    leased = lease_in(dir, wanted);
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
  CELLGATE_TRY(lease_locked({}));
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
  CELLGATE_TRY(lease_locked({}));
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
