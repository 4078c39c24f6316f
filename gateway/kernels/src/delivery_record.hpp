// Internal: which iopub message each WebSocket session of a kernel was last sent, kept so that it
// survives a kill -9 of the gateway: a small file in the kernel's home (state_dir/kernels/<id>/
// delivered), mapped MAP_SHARED, one slot per session. A store into the mapping is in the page
// cache as soon as it is made, so it outlives the process (not a power cut: nothing is synced).
//
//   DeliveryRecord record(home + "/delivered");
//   record.delivered(session_id, msg_id);        // after each iopub frame was written
//   for (auto& [session, last] : record.read()) { … replay what came after `last` … }
//
// Each slot holds two copies, written alternately, each with a generation and a checksum: a kill
// in the middle of a write leaves the other copy whole, and the reader takes the newest whole
// one. A write is a lookup, a copy of a few hundred bytes and a checksum over them (which copy
// of each slot is the newer is kept in memory, not found again by checksums). Past
// kSlots sessions the one written longest ago gives up its slot. Session ids and msg_ids longer
// than the slot holds are not recorded (ipykernel's are ~50 bytes; jupyter clients' uuids 32-36).
//
// Thread-safety: every method is thread-safe (one mutex; WebSocket strands call delivered()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "cellgate/mutex.hpp"

namespace cellgate::kernels {

class DeliveryRecord {
 public:
  static constexpr std::size_t kSlots = 32;
  static constexpr std::size_t kMaxSessionBytes = 200;
  static constexpr std::size_t kMaxMsgIdBytes = 280;

  // Opens (creating, 0600) the file at the first write or read; "" : records nothing.
  explicit DeliveryRecord(std::string path) : path_(std::move(path)) {}
  ~DeliveryRecord();
  DeliveryRecord(const DeliveryRecord&) = delete;
  DeliveryRecord& operator=(const DeliveryRecord&) = delete;

  void delivered(std::string_view session_id, std::string_view msg_id);

  struct Last {
    std::string msg_id;
    std::uint64_t generation = 0;  // larger: written later
  };
  // session id → the last msg_id it was sent.
  std::map<std::string, Last> read();

 private:
  bool open_locked() CELLGATE_REQUIRES(mu_);

  const std::string path_;
  Mutex mu_;
  bool tried_ CELLGATE_GUARDED_BY(mu_) = false;
  unsigned char* map_ CELLGATE_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, std::size_t, std::less<>> slot_of_ CELLGATE_GUARDED_BY(mu_);
  std::uint64_t generation_ CELLGATE_GUARDED_BY(mu_) = 0;
  // Per slot, its newer whole copy (0 or 1), -1 when neither is whole; read once at open, then
  // kept as each write makes the other copy the newer.
  std::array<int, kSlots> newer_ CELLGATE_GUARDED_BY(mu_){};
};

}  // namespace cellgate::kernels
