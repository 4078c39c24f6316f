// KernelQueues: one FIFO per kernel, so agent calls on one kernel run one at a time, in the order
// they arrived, instead of interleaving their messages in the kernel.
//
//   auto ticket = queues.enter(kernel_id, [cell] { strand->post([cell] { cell->on_turn(); }); });
//   …                                          // the cell runs once on_turn is called
//   queues.leave(kernel_id, ticket);           // done, or gave up waiting: the next one's turn
//
// A cell that leaves while waiting (its deadline passed, its client left) gives up its place; one
// that leaves holding the turn passes it to the next in line. Nothing here waits: the turn is
// handed over by calling the next cell's `on_turn`.
//
// Thread-safety: enter() and leave() may be called from any thread. `on_turn` is called on the
// thread that calls enter() or the leave() that frees the kernel, never under the lock; it must
// only post work.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "cellgate/mutex.hpp"

namespace cellgate::execute {

class KernelQueues {
 public:
  using Ticket = std::uint64_t;

  Ticket enter(const std::string& kernel_id, std::function<void()> on_turn);
  // Safe to call twice, or for a ticket that never entered.
  void leave(const std::string& kernel_id, Ticket ticket);
  // Cells waiting behind the one that holds the turn (for tests).
  std::size_t waiting(const std::string& kernel_id) const;

 private:
  struct Line {
    std::optional<Ticket> holder;
    std::deque<std::pair<Ticket, std::function<void()>>> waiting;
  };

  mutable Mutex mu_;
  std::map<std::string, Line> lines_
      CELLGATE_GUARDED_BY(mu_);  // kernels with a cell running or waiting
  Ticket next_ CELLGATE_GUARDED_BY(mu_) = 1;
};

}  // namespace cellgate::execute
