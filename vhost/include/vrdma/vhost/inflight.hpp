// Inflight tracking for backend reconnect (vhost-user.rst "Inflight I/O tracking",
// VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD). The backend allocates a memfd (GET_INFLIGHT_FD);
// the frontend keeps it and hands it back to a restarted backend (SET_INFLIGHT_FD), which
// resubmits every head that was popped but never returned.
//
// Layout per queue (split rings; same shape as libvhost-user's, 64-byte aligned):
//   header {u64 features; u16 version; u16 desc_num; u16 last_batch_head; u16 used_idx}
//   desc[desc_num] {u8 inflight; u8 pad[5]; u16 next; u64 counter}
// The region is backend memory, not guest memory: it is never dirty-logged.
#pragma once

#include <cstdint>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/message.hpp"

namespace vrdma::vhost {

class InflightRegion {
 public:
  InflightRegion() = default;
  InflightRegion(std::uint8_t* base, std::uint16_t size) : base_(base), size_(size) {}

  [[nodiscard]] bool attached() const { return base_ != nullptr; }
  // True if the region holds state from an earlier backend for a queue of this size.
  [[nodiscard]] bool holds_state() const;
  void reset();  // zero the queue's slice and stamp version and size

  void on_pop(std::uint16_t head);
  void on_push_begin(std::uint16_t head);
  void on_push_end(std::uint16_t head, std::uint16_t new_used_idx);
  // After a crash: heads still in flight, oldest first; repairs a half-done push first.
  std::vector<std::uint16_t> recover(std::uint16_t ring_used_idx);

  static std::uint64_t queue_bytes(std::uint16_t queue_size);

 private:
  std::uint8_t* base_ = nullptr;
  std::uint16_t size_ = 0;
  std::uint64_t counter_ = 0;
};

class InflightArea {
 public:
  // New zeroed area for num_queues queues of queue_size (GET_INFLIGHT_FD). A zeroed slice
  // holds no state: the ring starts at the frontend's base and stamps it.
  static Result<InflightArea> create(std::uint16_t num_queues, std::uint16_t queue_size);
  // Maps an area handed back by the frontend (SET_INFLIGHT_FD), checking its geometry.
  static Result<InflightArea> attach(UniqueFd fd, const InflightInfo& info);

  [[nodiscard]] InflightRegion queue(std::uint16_t q) const;
  [[nodiscard]] std::uint16_t num_queues() const { return nq_; }
  [[nodiscard]] std::uint16_t queue_size() const { return qsize_; }
  [[nodiscard]] int fd() const { return fd_.get(); }
  [[nodiscard]] std::uint64_t size() const { return map_.size(); }

 private:
  UniqueFd fd_;
  MmapArea map_;
  std::uint64_t offset_ = 0;
  std::uint16_t nq_ = 0, qsize_ = 0;
};

}  // namespace vrdma::vhost
