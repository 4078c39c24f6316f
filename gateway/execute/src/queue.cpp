#include "queue.hpp"

#include <algorithm>

namespace cellgate::execute {

KernelQueues::Ticket KernelQueues::enter(const std::string& kernel_id,
                                         std::function<void()> on_turn) {
  Ticket ticket = 0;
  {
    MutexLock lock(mu_);
    ticket = next_++;
    Line& line = lines_[kernel_id];
    if (line.holder) {
      line.waiting.emplace_back(ticket, std::move(on_turn));
      return ticket;
    }
    line.holder = ticket;
  }
  on_turn();
  return ticket;
}

void KernelQueues::leave(const std::string& kernel_id, Ticket ticket) {
  std::function<void()> next;
  {
    MutexLock lock(mu_);
    auto it = lines_.find(kernel_id);
    if (it == lines_.end()) {
      return;
    }
    Line& line = it->second;
    if (line.holder == ticket) {
      line.holder.reset();
      if (!line.waiting.empty()) {
        line.holder = line.waiting.front().first;
        next = std::move(line.waiting.front().second);
        line.waiting.pop_front();
      }
    } else {
      std::erase_if(line.waiting, [&](const auto& w) { return w.first == ticket; });
    }
    if (!line.holder && line.waiting.empty()) {
      lines_.erase(it);
    }
  }
  if (next) {
    next();
  }
}

std::size_t KernelQueues::waiting(const std::string& kernel_id) const {
  MutexLock lock(mu_);
  auto it = lines_.find(kernel_id);
  return it == lines_.end() ? 0 : it->second.waiting.size();
}

}  // namespace cellgate::execute
