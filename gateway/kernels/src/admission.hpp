// Admission: how many kernels may exist at once (--max-kernels). Three kinds count: live (the
// clients' kernels), pending (client starts in flight) and pooled (the warm pool's, ready or
// starting). Each place is held by a Ticket that gives it back when it goes, so no error path
// decrements a count by hand.
//
//   Admission admission(64);
//   CELLGATE_ASSIGN_OR_RETURN(Admission::Ticket t, admission.admit_client());  // or 429
//   … launch …
//   t.make_live();           // kept beside the kernel; its place is given back with it
//
// Pooled kernels count towards the limit but never cost a client its kernel: a client is refused
// only when live + pending reach the limit, and excess() then says how many pooled kernels must
// give way (warm_pool.hpp evicts them).
//
// Thread-safety: all members are thread-safe; a Ticket may move between threads but must not
// outlive its Admission. A leaf lock: nothing is called while it is held.
#pragma once

#include <cstddef>
#include <optional>

#include "cellgate/mutex.hpp"
#include "cellgate/result.hpp"

namespace cellgate::kernels {

class Admission {
 public:
  enum class Kind { kLive, kPending, kPooled };

  class Ticket {
   public:
    Ticket() = default;  // holds no place
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { reset(); }

    // A pending client start that succeeded, or a pooled kernel claimed: a live kernel now.
    void make_live();
    void reset();  // gives the place back now
    explicit operator bool() const { return admission_ != nullptr; }
    Kind kind() const { return kind_; }

   private:
    friend class Admission;
    Ticket(Admission* admission, Kind kind) : admission_(admission), kind_(kind) {}
    Admission* admission_ = nullptr;
    Kind kind_ = Kind::kLive;
  };

  struct Counts {
    std::size_t live = 0;
    std::size_t pending = 0;
    std::size_t pooled = 0;
    std::size_t total() const { return live + pending + pooled; }
  };

  explicit Admission(std::size_t max_kernels) : max_(max_kernels) {}
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // A client start (pending): kResourceExhausted when live + pending reach the limit.
  Result<Ticket> admit_client();
  // A pool start: only while every kind together is below the limit.
  std::optional<Ticket> admit_pooled();
  // A kernel a previous gateway left running (adoption): live, never refused, since it runs
  // already; the limit then holds new starts back until enough end.
  Ticket admit_adopted();

  // How far every kind together is over the limit (pooled kernels must give way), or 0.
  std::size_t excess() const;
  Counts counts() const;
  std::size_t max_kernels() const { return max_; }

 private:
  std::size_t& count_locked(Kind kind) CELLGATE_REQUIRES(mu_);

  mutable Mutex mu_;
  const std::size_t max_;
  Counts counts_ CELLGATE_GUARDED_BY(mu_);
};

}  // namespace cellgate::kernels
