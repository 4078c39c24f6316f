#include "inbox.hpp"

#include <algorithm>

namespace cellgate::execute {

bool Inbox::admit(std::size_t bytes) {
  UniqueLock lock(mu_);
  cv_.wait_for(lock, max_wait_, [&]() CELLGATE_REQUIRES(mu_) {
    return closed_ || pending_ == 0 || pending_ + bytes <= budget_;
  });
  if (closed_) {
    return false;
  }
  pending_ += bytes;
  return true;
}

void Inbox::release(std::size_t bytes) {
  {
    MutexLock lock(mu_);
    pending_ -= std::min(bytes, pending_);
  }
  cv_.notify_all();
}

void Inbox::close() {
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

std::size_t Inbox::pending() const {
  MutexLock lock(mu_);
  return pending_;
}

}  // namespace cellgate::execute
