#include "delivery_record.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "cellgate/sys/error_text.hpp"
#include "cellgate/unique_fd.hpp"

namespace cellgate::kernels {
namespace {

// One copy of a slot; a slot is two.
struct Copy {
  std::uint64_t generation;
  std::uint64_t checksum;
  std::uint16_t session_len;
  std::uint16_t msg_id_len;
  char session[DeliveryRecord::kMaxSessionBytes];
  char msg_id[DeliveryRecord::kMaxMsgIdBytes];
};
constexpr std::size_t kCopyBytes = 512;
static_assert(sizeof(Copy) <= kCopyBytes);
constexpr std::size_t kSlotBytes = 2 * kCopyBytes;
constexpr std::size_t kFileBytes = DeliveryRecord::kSlots * kSlotBytes;

std::uint64_t checksum_of(const Copy& c) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  auto mix = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h = (h ^ b[i]) * 1099511628211ULL;
    }
  };
  mix(&c.generation, sizeof c.generation);
  mix(&c.session_len, sizeof c.session_len);
  mix(&c.msg_id_len, sizeof c.msg_id_len);
  mix(c.session, std::min<std::size_t>(c.session_len, sizeof c.session));
  mix(c.msg_id, std::min<std::size_t>(c.msg_id_len, sizeof c.msg_id));
  return h;
}

bool whole(const Copy& c) {
  return c.generation != 0 && c.session_len > 0 && c.session_len <= sizeof c.session &&
         c.msg_id_len <= sizeof c.msg_id && c.checksum == checksum_of(c);
}

Copy* copy_at(unsigned char* map, std::size_t slot, int which) {
  return reinterpret_cast<Copy*>(map + slot * kSlotBytes +
                                 static_cast<std::size_t>(which) * kCopyBytes);
}

// The newer whole copy of a slot; null when neither is.
const Copy* newest(unsigned char* map, std::size_t slot) {
  const Copy* a = copy_at(map, slot, 0);
  const Copy* b = copy_at(map, slot, 1);
  const bool wa = whole(*a);
  const bool wb = whole(*b);
  if (wa && wb) {
    return a->generation >= b->generation ? a : b;
  }
  return wa ? a : (wb ? b : nullptr);
}

}  // namespace

DeliveryRecord::~DeliveryRecord() {
  MutexLock lock(mu_);
  if (map_ != nullptr) {
    ::munmap(map_, kFileBytes);
  }
}

bool DeliveryRecord::open_locked() {
  if (tried_) {
    return map_ != nullptr;
  }
  tried_ = true;
  if (path_.empty()) {
    return false;
  }
  UniqueFd fd(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 ||
      (static_cast<std::size_t>(st.st_size) != kFileBytes &&
       ::ftruncate(fd.get(), static_cast<off_t>(kFileBytes)) != 0)) {
    spdlog::warn(
        "delivery record {}: {}; output a client missed during a gateway restart is "
        "not replayed",
        path_, sys::error_text(errno));
    return false;
  }
  void* m = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (m == MAP_FAILED) {
    spdlog::warn("delivery record {}: mmap: {}", path_, sys::error_text(errno));
    return false;
  }
  map_ = static_cast<unsigned char*>(m);
  for (std::size_t s = 0; s < kSlots; ++s) {
    const Copy* c = newest(map_, s);
    newer_[s] = c == nullptr ? -1 : (c == copy_at(map_, s, 0) ? 0 : 1);
    if (c != nullptr) {
      slot_of_.emplace(std::string(c->session, c->session_len), s);
      generation_ = std::max(generation_, c->generation);
    }
  }
  return true;
}

void DeliveryRecord::delivered(std::string_view session_id, std::string_view msg_id) {
  if (session_id.empty() || session_id.size() > kMaxSessionBytes || msg_id.empty() ||
      msg_id.size() > kMaxMsgIdBytes) {
    return;
  }
  MutexLock lock(mu_);
  if (!open_locked()) {
    return;
  }
  std::size_t slot = 0;
  if (auto it = slot_of_.find(session_id); it != slot_of_.end()) {
    slot = it->second;
  } else {
    // A free slot, else the one written longest ago.
    std::uint64_t oldest = UINT64_MAX;
    for (std::size_t s = 0; s < kSlots; ++s) {
      const std::uint64_t g = newer_[s] < 0 ? 0 : copy_at(map_, s, newer_[s])->generation;
      if (g < oldest) {
        oldest = g;
        slot = s;
      }
    }
    std::erase_if(slot_of_, [&](const auto& e) { return e.second == slot; });
    slot_of_.emplace(std::string(session_id), slot);
  }
  // Over the older copy (or the one that is not whole); the newer stays whole meanwhile.
  const int target = newer_[slot] == 0 ? 1 : 0;
  Copy* c = copy_at(map_, slot, target);
  Copy next{};
  next.generation = ++generation_;
  next.session_len = static_cast<std::uint16_t>(session_id.size());
  next.msg_id_len = static_cast<std::uint16_t>(msg_id.size());
  std::memcpy(next.session, session_id.data(), session_id.size());
  std::memcpy(next.msg_id, msg_id.data(), msg_id.size());
  next.checksum = checksum_of(next);
  std::memcpy(static_cast<void*>(c), &next, sizeof next);
  newer_[slot] = target;
}

std::map<std::string, DeliveryRecord::Last> DeliveryRecord::read() {
  std::map<std::string, Last> out;
  MutexLock lock(mu_);
  if (!open_locked()) {
    return out;
  }
  for (std::size_t s = 0; s < kSlots; ++s) {
    if (const Copy* c = newest(map_, s)) {
      Last& last = out[std::string(c->session, c->session_len)];
      if (c->generation > last.generation) {
        last = {std::string(c->msg_id, c->msg_id_len), c->generation};
      }
    }
  }
  return out;
}

}  // namespace cellgate::kernels
