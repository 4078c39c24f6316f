// A mutex that clang's thread-safety analysis (-Wthread-safety) can check, and its guards.
//
//   class Counter {
//    public:
//     void add() { MutexLock lock(mu_); ++n_; }
//    private:
//     mutable Mutex mu_;
//     int n_ CELLGATE_GUARDED_BY(mu_) = 0;
//   };
//
// Reading or writing `n_` without holding `mu_` is then a compile error in the clang build that
// scripts/test makes (CELLGATE_THREAD_SAFETY; g++ ignores the attributes). `Mutex` is a
// std::mutex underneath; `UniqueLock` works with std::condition_variable_any.
// Thread-safety: these are the locking primitives; see clang's "Thread Safety Analysis" page.
#pragma once

#include <mutex>

#if defined(__clang__)
#define CELLGATE_THREAD_ATTR(x) __attribute__((x))
#else
#define CELLGATE_THREAD_ATTR(x)
#endif

#define CELLGATE_CAPABILITY(x) CELLGATE_THREAD_ATTR(capability(x))
#define CELLGATE_SCOPED_CAPABILITY CELLGATE_THREAD_ATTR(scoped_lockable)
#define CELLGATE_GUARDED_BY(x) CELLGATE_THREAD_ATTR(guarded_by(x))
#define CELLGATE_PT_GUARDED_BY(x) CELLGATE_THREAD_ATTR(pt_guarded_by(x))
#define CELLGATE_REQUIRES(...) CELLGATE_THREAD_ATTR(requires_capability(__VA_ARGS__))
#define CELLGATE_EXCLUDES(...) CELLGATE_THREAD_ATTR(locks_excluded(__VA_ARGS__))
#define CELLGATE_ACQUIRE(...) CELLGATE_THREAD_ATTR(acquire_capability(__VA_ARGS__))
#define CELLGATE_RELEASE(...) CELLGATE_THREAD_ATTR(release_capability(__VA_ARGS__))
#define CELLGATE_TRY_ACQUIRE(...) CELLGATE_THREAD_ATTR(try_acquire_capability(__VA_ARGS__))
#define CELLGATE_NO_THREAD_SAFETY_ANALYSIS CELLGATE_THREAD_ATTR(no_thread_safety_analysis)

namespace cellgate {

class CELLGATE_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() CELLGATE_ACQUIRE() { mu_.lock(); }
  void unlock() CELLGATE_RELEASE() { mu_.unlock(); }
  bool try_lock() CELLGATE_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

// std::lock_guard, annotated.
class CELLGATE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) CELLGATE_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() CELLGATE_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// std::unique_lock, annotated: for std::condition_variable_any, which unlocks and relocks it
// inside wait() (the analysis sees the lock held across the wait, as it is on return). A thread
// may also let go of the mutex for a while and take it back, with unlock() and lock(): the
// analysis tracks both (a guarded member touched in between is an error), and the destructor
// releases the mutex only if it is held. A wait predicate that reads guarded members says so:
//
//   UniqueLock lock(mu_);
//   cv_.wait(lock, [&]() CELLGATE_REQUIRES(mu_) { return ready_; });
class CELLGATE_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(Mutex& mu) CELLGATE_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~UniqueLock() CELLGATE_RELEASE() {
    if (owned_) {
      mu_.unlock();
    }
  }
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void lock() CELLGATE_ACQUIRE() {
    mu_.lock();
    owned_ = true;
  }
  void unlock() CELLGATE_RELEASE() {
    owned_ = false;
    mu_.unlock();
  }

 private:
  Mutex& mu_;
  bool owned_ = true;
};

}  // namespace cellgate
