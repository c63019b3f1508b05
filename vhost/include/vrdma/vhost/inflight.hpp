// Inflight tracking for backend reconnect (vhost-user.rst "Inflight I/O tracking",
// VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD). The backend allocates a memfd (GET_INFLIGHT_FD);
// the frontend keeps it and hands it back to a restarted backend (SET_INFLIGHT_FD), which
// resubmits every request that was popped but never returned.
//
// The area is one slice per queue, each queue_bytes(queue_size) long (64-byte aligned, room for
// either layout: the ring layout is only known once features are set, after GET_INFLIGHT_FD).
// Split rings (InflightRegion; the spec's QueueRegionSplit):
//   header {u64 features; u16 version; u16 desc_num; u16 last_batch_head; u16 used_idx}
//   desc[desc_num] {u8 inflight; u8 pad[5]; u16 next; u64 counter}
// Packed rings (PackedInflightRegion; the spec's QueueRegionPacked): a 32-byte header
//   {u64 features; u16 version, desc_num, free_head, old_free_head, used_idx, old_used_idx;
//    u8 used_wrap_counter, old_used_wrap_counter, pad[7]}
//   desc[desc_num] {u8 inflight; u8 pad; u16 next, last, num; u64 counter; u16 id, flags; u32 len;
//    u64 addr}
// keeping a copy of every descriptor of a popped chain (the device overwrites ring slots with used
// entries out of order, so the ring itself cannot say what was in flight).
//
// Untrusted: the region is shared with the frontend, which may hand back anything. Every index
// read from it is checked before use; an inconsistent packed region is refused with a sentence
// (the ring stays stopped) and tracking stops rather than write outside the slice. The region is
// backend memory, not guest memory: it is never dirty-logged.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/guest_fault.hpp"
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

  // Bytes of one queue's slice (either layout).
  static std::uint64_t queue_bytes(std::uint16_t queue_size);
  // The slice itself, for the packed view of it.
  [[nodiscard]] std::uint8_t* base() const { return base_; }
  [[nodiscard]] std::uint16_t size() const { return size_; }

 private:
  std::uint8_t* base_ = nullptr;
  std::uint16_t size_ = 0;
  std::uint64_t counter_ = 0;
};

// One descriptor of a packed chain as the driver wrote it in the ring (virtio 1.2 §2.8.13).
struct PackedDescCopy {
  std::uint64_t addr = 0;
  std::uint32_t len = 0;
  std::uint16_t id = 0;
  std::uint16_t flags = 0;
};

// The packed layout over the same slice. Entries form a free list; a popped chain takes `num`
// entries from its head (old_free_head) and returns them when its used descriptor is written.
class PackedInflightRegion {
 public:
  PackedInflightRegion() = default;
  explicit PackedInflightRegion(const InflightRegion& slice) : base_(slice.base()), size_(slice.size()) {}

  [[nodiscard]] bool attached() const { return base_ != nullptr; }
  // True if the region holds state from an earlier backend for a queue of this size.
  [[nodiscard]] bool holds_state() const;
  // Zeroes the slice, stamps version and size, links every entry free, and records the ring's
  // used position (from the frontend's base).
  void reset(std::uint16_t used_idx, bool used_wrap);

  // Records a popped chain (its ring descriptors, in order); returns the head entry to hand to
  // on_push_*, or nullopt when tracking is off (unattached, or the frontend corrupted the free
  // list: then tracking stops with one log line).
  std::optional<std::uint16_t> on_pop(std::span<const PackedDescCopy> descs);
  // Before the used descriptor is written: the chain's entries go back to the free list and
  // the new used position is recorded; after it: the head is no longer in flight and the state
  // is committed.
  void on_push_begin(std::uint16_t entry, std::uint16_t new_used_idx, bool new_used_wrap);
  void on_push_end(std::uint16_t entry);

  struct Chain {
    std::uint16_t entry = 0;
    std::vector<PackedDescCopy> descs;
  };
  struct Recovered {
    std::uint16_t used_idx = 0, avail_idx = 0;  // where the device resumes
    bool used_wrap = true, avail_wrap = true;
    std::vector<Chain> chains;  // in flight, oldest first
  };
  // After a crash. `published(index, wrap)` says whether the ring descriptor at `index` carries a
  // used mark for wrap counter `wrap` (the push that was under way reached the ring): the
  // half-done update is then committed, otherwise rolled back. Validates everything (indexes,
  // chain lengths and links, no entry in two chains, the chains fit in the ring) and rebuilds
  // the free list from what is left. Errc::protocol_error, with a sentence, if it does not hold.
  Result<Recovered> recover(const std::function<bool(std::uint16_t index, bool wrap)>& published);

 private:
  void stop_tracking(const char* why);

  std::uint8_t* base_ = nullptr;
  std::uint16_t size_ = 0;
  std::uint64_t counter_ = 0;
};

class InflightArea {
 public:
  // New zeroed area for num_queues queues of queue_size (GET_INFLIGHT_FD). A zeroed slice
  // holds no state: the ring starts at the frontend's base and stamps it.
  static Result<InflightArea> create(std::uint16_t num_queues, std::uint16_t queue_size);
  // Maps an area handed back by the frontend (SET_INFLIGHT_FD), checking its geometry; sealed
  // against shrinking where the file allows and guarded with `sink` (guest_fault.hpp).
  static Result<InflightArea> attach(UniqueFd fd, const InflightInfo& info, std::shared_ptr<FaultSink> sink = nullptr);

  [[nodiscard]] InflightRegion queue(std::uint16_t q) const;
  [[nodiscard]] std::uint16_t num_queues() const { return nq_; }
  [[nodiscard]] std::uint16_t queue_size() const { return qsize_; }
  [[nodiscard]] int fd() const { return fd_.get(); }
  [[nodiscard]] std::uint64_t size() const { return map_.size(); }

 private:
  UniqueFd fd_;
  MmapArea map_;
  GuardedMapping guard_;  // after map_: unregistered before the unmap
  std::uint64_t offset_ = 0;
  std::uint16_t nq_ = 0, qsize_ = 0;
};

}  // namespace vrdma::vhost
