// UidAllocator: the uids a gateway's jailed kernels run as, never shared with a stranger.
//
// Two rules keep a kernel's uid (and so RLIMIT_NPROC and every other per-uid resource) its own:
//  - Gateways (and notebook runs) on one host take disjoint ranges. Range i is
//    [base + i*range_size, base + (i+1)*range_size); a gateway holds it by flock()ing the lease
//    file <lease_dir>/range-<i> for its lifetime. The lock dies with the process, so a crashed
//    gateway's range is free again at once — for the next gateway to find its orphans in:
//  - A uid is never handed out while any process still runs as it (real, effective, saved or fs
//    uid, from /proc/<pid>/status), whoever started it.
// A range stays with its state dir across restarts: the lease file names the state dir (`owner`)
// that holds it, and lease() takes, in this order, the ranges of the uids the restarted
// gateway's kernels already run as (`wanted`: adopted and hibernated kernels can only come back
// as their uid), then free ranges no other state dir still keeps kernels in (`owner_keeps`), and
// only then, with a warning, a range another state dir's kernels may need.
// lease_dir is host-wide (/run/cellgate/uid-ranges); when it cannot be made or written, the
// fallback dir (the state dir's) is used and a warning says that other state dirs may then
// draw the same range (the /proc check still keeps live uids apart).
//
//   UidAllocator uids({.fallback_lease_dir = state_dir + "/uid-ranges"});
//   CELLGATE_TRY(uids.lease());                     // optional: allocate() leases on first use
//   CELLGATE_ASSIGN_OR_RETURN(uid_t uid, uids.allocate());
//   ...
//   uids.release(uid);                              // when the kernel is gone
//
// Errors (kResourceExhausted) when every range is leased or every uid of ours is busy: no kernel
// starts then; the message says which option to change.
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::kernels {

struct UidRangeOptions {
  uid_t base = 2000000;       // above the launcher's jail::kUidBase + pid (cellgate run's uids)
  uid_t range_size = 1000;    // uids per gateway: live kernels, pooled ones, orphans skipped
  std::size_t ranges = 1000;  // gateways per host
  std::string lease_dir = "/run/cellgate/uid-ranges";  // host-wide
  std::string fallback_lease_dir;  // when lease_dir is not writable; empty: none
  std::string owner;               // written into the lease file: the gateway's state dir
  // Whether the state dir named in a free range's lease file still has kernels that need that
  // range's uids (a gateway killed, or stopped with kernels hibernated). Empty: never.
  std::function<bool(const std::string& owner)> owner_keeps;
};

class UidAllocator {
 public:
  explicit UidAllocator(UidRangeOptions options);
  UidAllocator(const UidAllocator&) = delete;
  UidAllocator& operator=(const UidAllocator&) = delete;

  // Takes a free range (once; later calls answer the same): one holding the most of `wanted`
  // first, then the first no other owner keeps, then any.
  Result<void> lease(const std::set<uid_t>& wanted = {});
  // The lowest uid of our range not allocated and with no live process; leases first if needed.
  Result<uid_t> allocate();
  // Marks `uid` allocated: a kernel a previous gateway started (adopted, or hibernated with no
  // process that would keep allocate() off its uid). Refused when it is outside our range or
  // allocated already.
  Result<void> reserve(uid_t uid);
  void release(uid_t uid);

  struct Range {
    uid_t first = 0;
    uid_t last = 0;  // inclusive
    std::string lease_file;
  };
  std::optional<Range> range() const;

 private:
  Result<void> lease_locked(const std::set<uid_t>& wanted) CELLGATE_REQUIRES(mu_);
  // Tries every range's lease file in `dir`, in lease()'s order: true when one is ours now, false
  // when all are held, an error when the dir cannot be used at all.
  Result<bool> lease_in(const std::string& dir, const std::set<uid_t>& wanted)
      CELLGATE_REQUIRES(mu_);
  // Makes range i, whose lease file `fd` we have locked, ours.
  void take(std::size_t i, const std::string& path, UniqueFd fd) CELLGATE_REQUIRES(mu_);

  const UidRangeOptions options_;
  mutable Mutex mu_;
  UniqueFd lease_fd_ CELLGATE_GUARDED_BY(mu_);  // flock()ed for our lifetime
  std::optional<Range> range_ CELLGATE_GUARDED_BY(mu_);
  std::set<uid_t> in_use_ CELLGATE_GUARDED_BY(mu_);
};

// Every uid some process of `proc` (a procfs mount) runs as: real, effective, saved and fs.
std::set<uid_t> uids_with_live_processes(const std::string& proc = "/proc");

}  // namespace cellgate::kernels
