// The fixed pool of seeded kernels that serves notebook-http requests (Kernel Gateway's
// ManagedKernelPool): a request takes the kernel free longest, first come first served; when
// every kernel is busy requests wait in arrival order and the next kernel released goes to the
// oldest of them. No thread waits: `take` runs on whoever hands the kernel over.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <utility>

#include "cellgate/mutex.hpp"

namespace cellgate::notebook_http {

class KernelPool {
 public:
  using Take = std::function<void(std::string id)>;

  void add(std::string id) { release(std::move(id)); }

  // `take` gets a kernel now (on this thread) or once one is released (on the releasing one).
  void acquire(Take take) {
    std::string id;
    {
      MutexLock lock(mu_);
      if (free_.empty()) {
        waiting_.push_back(std::move(take));
        return;
      }
      id = std::move(free_.front());
      free_.pop_front();
    }
    take(std::move(id));
  }

  void release(std::string id) {
    Take next;
    {
      MutexLock lock(mu_);
      if (waiting_.empty()) {
        free_.push_back(std::move(id));
        return;
      }
      next = std::move(waiting_.front());
      waiting_.pop_front();
    }
    next(std::move(id));
  }

  std::size_t waiting() const {
    MutexLock lock(mu_);
    return waiting_.size();
  }
  std::size_t free() const {
    MutexLock lock(mu_);
    return free_.size();
  }

 private:
  mutable Mutex mu_;
  std::deque<std::string> free_ CELLGATE_GUARDED_BY(mu_);
  std::deque<Take> waiting_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace cellgate::notebook_http
