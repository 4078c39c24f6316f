// Inbox: the hand-off of one cell's kernel messages from the connection's I/O thread to the
// cell's strand, with a byte budget. While the strand is more than the budget behind, the I/O
// thread waits before handing over the next message, so a kernel that prints faster than the
// cell can collect is held back where the kernel client means it to be: the few messages its
// iopub socket queues (ZMQ_RCVHWM), then the kernel's own PUB queue, in the kernel's memory.
//
//   if (inbox->admit(envelope->size())) {              // I/O thread; may wait
//     strand->post([inbox, envelope] { …; inbox->release(envelope->size()); });
//   }
//   inbox->close();                                    // the cell is done: nothing waits again
//
// The wait is bounded (max_wait per message): a strand that does not run (a loop being stopped)
// slows a flood down but never stalls the I/O thread for good.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>

#include "cellgate/mutex.hpp"

namespace cellgate::execute {

class Inbox {
 public:
  Inbox(std::size_t budget_bytes, std::chrono::milliseconds max_wait)
      : budget_(budget_bytes), max_wait_(max_wait) {}

  // Waits while messages of more than the budget are on their way (one message is always let
  // through, whatever its size), then counts `bytes` as on its way. False once closed: drop it.
  bool admit(std::size_t bytes);
  // A message admitted before has been handled (or dropped) on the strand.
  void release(std::size_t bytes);
  // Nothing is admitted from now on, and whoever waits stops waiting.
  void close();

  std::size_t pending() const;

 private:
  const std::size_t budget_;
  const std::chrono::milliseconds max_wait_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  std::size_t pending_ CELLGATE_GUARDED_BY(mu_) = 0;
  bool closed_ CELLGATE_GUARDED_BY(mu_) = false;
};

}  // namespace cellgate::execute
