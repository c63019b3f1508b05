// Driver side of a virtqueue (what a guest's virtio driver does), in driver-owned memory
// (DriverMemory): used by the frontend (libpvverbs, tests) to post buffers to a backend, and by
// libpvverbs' pci transport inside a VM.
//
// Who owns what: this side produces descriptors and the avail ring (split) or the avail
// flags (packed), and only reads the used ring. It publishes a descriptor before the avail
// index (or the first descriptor's flags) with release ordering, and reads used entries
// after an acquire load. The device is not trusted: a used entry naming a buffer the driver did
// not give it breaks the queue (broken(): nothing more is taken from it until it is made
// again). Not thread-safe: one thread drives one queue.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/vhost/driver_memory.hpp"

namespace vrdma::vhost {

struct DriverBuf {
  std::uint64_t gpa;
  std::uint32_t len;
  bool writable;
};

struct UsedBuf {
  std::uint16_t id;
  std::uint32_t len;
};

class DriverQueue {
 public:
  static constexpr std::uint16_t kMaxIndirect = 64;

  // Places the rings (and per-slot indirect tables) in `mem`, which must outlive the queue.
  static Result<DriverQueue> create(DriverMemory& mem, std::uint16_t size, bool packed, bool event_idx);

  // Adds one chain (readable buffers first). With `indirect`, the chain goes into an indirect
  // table and takes one ring slot. Errc::would_block when the ring is full. Returns its id.
  Result<std::uint16_t> add(std::span<const DriverBuf> bufs, bool indirect = false);
  // Makes everything added so far visible to the device (split: the avail index).
  void publish();
  // Does the device want a kick for what was published since the last kick?
  bool needs_kick();
  // The next used buffer, if any (none once the queue is broken).
  std::optional<UsedBuf> get_used();
  // Asks the device to notify (interrupt) when it returns buffers, or not to (virtio 1.2 §2.7.10,
  // §2.8.10): a queue the driver only reaps as it posts needs none. Off, split: the avail flag
  // NO_INTERRUPT, or with EVENT_IDX a used_event the device has just passed; packed: the driver
  // event DISABLE. A hint (a device may still notify). After turning it on, check get_used()
  // again: a buffer returned in between raised no notification.
  void set_interrupts(bool on);
  // The device returned a buffer id it does not own.
  [[nodiscard]] bool broken() const { return broken_; }

  [[nodiscard]] std::uint16_t size() const { return size_; }
  [[nodiscard]] std::uint16_t free_slots() const { return free_; }
  [[nodiscard]] bool packed() const { return packed_; }
  // Ring addresses: guest-physical, and as frontend-virtual addresses for SET_VRING_ADDR.
  [[nodiscard]] std::uint64_t desc_gpa() const { return desc_; }
  [[nodiscard]] std::uint64_t driver_gpa() const { return driver_; }
  [[nodiscard]] std::uint64_t device_gpa() const { return device_; }
  [[nodiscard]] std::uint64_t uaddr(std::uint64_t gpa) const;
  // Initial SET_VRING_BASE value. Packed rings start with both wrap counters at 1; the used
  // state travels in bits 16..31 (QEMU's encoding).
  [[nodiscard]] std::uint32_t initial_base() const { return packed_ ? 0x80008000u : 0u; }

 private:
  Result<std::uint16_t> add_split(std::span<const DriverBuf> bufs, bool indirect);
  Result<std::uint16_t> add_packed(std::span<const DriverBuf> bufs, bool indirect);
  std::optional<UsedBuf> used_split();
  std::optional<UsedBuf> used_packed();
  void write_indirect(std::uint16_t id, std::span<const DriverBuf> bufs, bool packed_layout);

  DriverMemory* ram_ = nullptr;
  std::uint16_t size_ = 0;
  bool packed_ = false, event_idx_ = false, broken_ = false, interrupts_ = true;
  std::uint64_t desc_ = 0, driver_ = 0, device_ = 0, indirect_ = 0;
  std::uint16_t free_ = 0;
  // split
  std::uint16_t free_head_ = 0, avail_idx_ = 0, published_ = 0, kicked_ = 0, last_used_ = 0;
  // packed
  std::uint16_t next_avail_ = 0, next_used_ = 0;
  bool avail_wrap_ = true, used_wrap_ = true;
  std::vector<std::uint16_t> free_ids_;
  std::vector<std::uint16_t> chain_len_;  // per id: descriptors (split) or slots (packed)
};

}  // namespace vrdma::vhost
