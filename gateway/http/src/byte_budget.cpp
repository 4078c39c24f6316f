#include "cellgate/http/byte_budget.hpp"

#include <algorithm>

namespace cellgate::http {

std::unique_ptr<ByteBudget::Account> ByteBudget::open(std::function<void()> on_shed) {
  std::unique_ptr<Account> account(new Account(shared_from_this(), std::move(on_shed)));
  MutexLock lock(mu_);
  accounts_.push_back(account.get());
  return account;
}

ByteBudget::Account::~Account() {
  budget_->close(*this);
}

void ByteBudget::Account::set(std::size_t bytes) {
  budget_->update(*this, bytes);
}

std::size_t ByteBudget::Account::held() const {
  MutexLock lock(budget_->mu_);
  return held_;
}

bool ByteBudget::Account::shed() const {
  MutexLock lock(budget_->mu_);
  return shed_;
}

std::size_t ByteBudget::used() const {
  MutexLock lock(mu_);
  return used_;
}

std::size_t ByteBudget::peak() const {
  MutexLock lock(mu_);
  return peak_;
}

std::size_t ByteBudget::shed_count() const {
  MutexLock lock(mu_);
  return shed_count_;
}

bool ByteBudget::drained_locked() {
  if (high_water_ == 0 || !on_drained_) {
    return false;
  }
  if (used_ >= high_water_) {
    above_high_water_ = true;
  } else if (above_high_water_ && used_ <= high_water_ / 4) {
    above_high_water_ = false;
    return true;
  }
  return false;
}

void ByteBudget::update(Account& account, std::size_t bytes) {
  std::vector<std::function<void()>> to_call;
  bool drained = false;
  {
    MutexLock lock(mu_);
    used_ = used_ - account.held_ + bytes;
    if (account.shed_) {
      shed_bytes_ = shed_bytes_ - account.held_ + bytes;
    }
    account.held_ = bytes;
    peak_ = std::max(peak_, used_);
    // Shed the largest holders until what is left fits. Bytes of shed accounts are on their way
    // out (their connections are being dropped) and count no longer, or one slow reader would
    // make every later change shed another innocent connection.
    while (limit_ > 0 && used_ - shed_bytes_ > limit_) {
      Account* largest = nullptr;
      for (Account* a : accounts_) {
        if (!a->shed_ && a->held_ > 0 && (largest == nullptr || a->held_ > largest->held_)) {
          largest = a;
        }
      }
      if (largest == nullptr) {
        break;
      }
      largest->shed_ = true;
      shed_bytes_ += largest->held_;
      ++shed_count_;
      if (largest->on_shed_) {
        // Copied: the account may be gone by the time the callback runs (it only posts).
        to_call.push_back(std::move(largest->on_shed_));
        largest->on_shed_ = nullptr;
      }
    }
    drained = drained_locked();
  }
  for (auto& f : to_call) {
    f();
  }
  if (drained) {
    on_drained_();
  }
}

void ByteBudget::close(Account& account) {
  bool drained = false;
  {
    MutexLock lock(mu_);
    used_ -= account.held_;
    if (account.shed_) {
      shed_bytes_ -= account.held_;
    }
    account.held_ = 0;
    accounts_.erase(std::remove(accounts_.begin(), accounts_.end(), &account), accounts_.end());
    drained = drained_locked();
  }
  if (drained) {
    on_drained_();
  }
}

}  // namespace cellgate::http
