// Admission: the --max-kernels count, one place per Ticket (admission.hpp).
#include "admission.hpp"

#include <string>
#include <utility>

namespace cellgate::kernels {

Admission::Ticket::Ticket(Ticket&& other) noexcept
    : admission_(std::exchange(other.admission_, nullptr)), kind_(other.kind_) {}

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    reset();
    admission_ = std::exchange(other.admission_, nullptr);
    kind_ = other.kind_;
  }
  return *this;
}

void Admission::Ticket::make_live() {
  if (admission_ == nullptr || kind_ == Kind::kLive) {
    return;
  }
  MutexLock lock(admission_->mu_);
  --admission_->count_locked(kind_);
  ++admission_->counts_.live;
  kind_ = Kind::kLive;
}

void Admission::Ticket::reset() {
  if (admission_ == nullptr) {
    return;
  }
  MutexLock lock(admission_->mu_);
  --admission_->count_locked(kind_);
  admission_ = nullptr;
}

std::size_t& Admission::count_locked(Kind kind) {
  switch (kind) {
    case Kind::kPending:
      return counts_.pending;
    case Kind::kPooled:
      return counts_.pooled;
    case Kind::kLive:
      break;
  }
  return counts_.live;
}

Result<Admission::Ticket> Admission::admit_client() {
  MutexLock lock(mu_);
  if (counts_.live + counts_.pending >= max_) {
    return make_error(ErrorCode::kResourceExhausted, "max_kernels",
                      "Resource Limit: at most " + std::to_string(max_) +
                          " kernels may run at once (--max-kernels)");
  }
  ++counts_.pending;
  return Ticket(this, Kind::kPending);
}

std::optional<Admission::Ticket> Admission::admit_pooled() {
  MutexLock lock(mu_);
  if (counts_.total() >= max_) {
    return std::nullopt;
  }
  ++counts_.pooled;
  return Ticket(this, Kind::kPooled);
}

Admission::Ticket Admission::admit_adopted() {
  MutexLock lock(mu_);
  ++counts_.live;
  return Ticket(this, Kind::kLive);
}

std::size_t Admission::excess() const {
  MutexLock lock(mu_);
  const std::size_t total = counts_.total();
  return total > max_ ? total - max_ : 0;
}

Admission::Counts Admission::counts() const {
  MutexLock lock(mu_);
  return counts_;
}

}  // namespace cellgate::kernels
