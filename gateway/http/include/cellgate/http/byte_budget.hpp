// A process-wide budget of bytes held on behalf of clients (WebSocket messages being read,
// output queued for clients that read slowly), shared by every connection. A per-connection
// limit alone lets N connections hold N times it; this caps the sum.
//
//   auto budget = std::make_shared<http::ByteBudget>(256u << 20);
//   auto account = budget->open([weak] { /* post: drop this connection */ });
//   account->set(queued + buffered);   // after every change; may shed the largest holder
//
// When a change takes the total over the limit, the accounts holding the most are shed (asked,
// through their callback, to let go of everything: the connection is dropped) until the rest fit.
// The largest holder is the slowest reader or the client with the biggest unfinished message,
// not whoever happened to add the last byte: an innocent client that reads along is kept.
//
// A flood's bytes freed are not given back to the system by malloc on its own (small messages
// leave its arenas fragmented): `on_drained` is called when the total falls from at least
// `high_water` to a quarter of it, once per such rise, so the owner can trim malloc then.
//
// Thread-safety: every method may be called from any thread. The shed and drained callbacks run
// on the thread whose change crossed the line, outside the budget's lock; they must only post
// work elsewhere.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cellgate/mutex.hpp"

namespace cellgate::http {

class ByteBudget : public std::enable_shared_from_this<ByteBudget> {
 public:
  class Account {
   public:
    Account(const Account&) = delete;
    Account& operator=(const Account&) = delete;
    ~Account();  // gives back what it holds

    // This holder now holds `bytes` (not a delta). Going over the budget sheds accounts,
    // possibly this one.
    void set(std::size_t bytes);
    std::size_t held() const;
    // Whether this account was shed (its callback has been called; it counts no longer).
    bool shed() const;

   private:
    friend class ByteBudget;
    Account(std::shared_ptr<ByteBudget> budget, std::function<void()> on_shed)
        : budget_(std::move(budget)), on_shed_(std::move(on_shed)) {}
    std::shared_ptr<ByteBudget> budget_;
    std::function<void()> on_shed_;
    std::size_t held_ = 0;  // guarded by budget_->mu_ (the analysis cannot see that it is mu_)
    bool shed_ = false;     // guarded by budget_->mu_
  };

  // limit 0: no limit (accounts are still counted). high_water 0: no on_drained.
  explicit ByteBudget(std::size_t limit, std::size_t high_water = 0,
                      std::function<void()> on_drained = nullptr)
      : limit_(limit), high_water_(high_water), on_drained_(std::move(on_drained)) {}

  // An account for one holder; `on_shed` is called at most once.
  std::unique_ptr<Account> open(std::function<void()> on_shed);

  std::size_t limit() const { return limit_; }
  std::size_t used() const;        // every account's bytes, shed ones included until they let go
  std::size_t peak() const;        // the most `used()` has been
  std::size_t shed_count() const;  // accounts shed so far

 private:
  void update(Account& account, std::size_t bytes);
  void close(Account& account);
  // Whether the total just fell from high_water_ to a quarter of it (called under mu_).
  bool drained_locked() CELLGATE_REQUIRES(mu_);

  const std::size_t limit_;
  const std::size_t high_water_;
  const std::function<void()> on_drained_;
  bool above_high_water_ = false;  // reached high_water_ since on_drained_ was last called
  mutable Mutex mu_;
  std::vector<Account*> accounts_ CELLGATE_GUARDED_BY(mu_);
  std::size_t used_ CELLGATE_GUARDED_BY(mu_) = 0;
  std::size_t shed_bytes_ CELLGATE_GUARDED_BY(mu_) =
      0;  // held by shed accounts: going, not counted against the limit
  std::size_t peak_ CELLGATE_GUARDED_BY(mu_) = 0;
  std::size_t shed_count_ CELLGATE_GUARDED_BY(mu_) = 0;
};

}  // namespace cellgate::http
