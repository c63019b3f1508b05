// Driver side of a split virtqueue (virtio 1.2 §2.7) in DMA memory the device reaches by
// guest-physical address: what the pci transport posts to the device through QEMU.
//
// Who owns what: the driver writes descriptors and the avail ring, and publishes a descriptor
// before the avail index with release ordering; the device writes the used ring, which the
// driver reads after an acquire load of used.idx. No event idx (not negotiated): the driver
// kicks unless used.flags says NO_NOTIFY, the device interrupts on every used buffer. Every id
// the device returns is checked (range, in use) before it is trusted. One thread per queue.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/vhost/pv.hpp"

namespace vrdma::pv {

class PciVring {
 public:
  // Bytes of DMA memory (4 KiB aligned) the rings of a queue of `size` take.
  static std::size_t bytes(std::uint16_t size);
  // `mem` must be bytes(size) long, zeroed; size a power of two.
  PciVring(DmaArea mem, std::uint16_t size);

  [[nodiscard]] std::uint64_t desc_gpa() const { return mem_.gpa; }
  [[nodiscard]] std::uint64_t avail_gpa() const { return mem_.gpa + avail_off_; }
  [[nodiscard]] std::uint64_t used_gpa() const { return mem_.gpa + used_off_; }
  [[nodiscard]] std::uint16_t size() const { return size_; }
  [[nodiscard]] std::uint16_t free_slots() const { return free_; }

  Result<std::uint16_t> add(std::span<const ChainBuf> bufs);
  // Publishes what was added; true when the device wants a notification.
  bool publish();
  std::optional<std::pair<std::uint16_t, std::uint32_t>> get_used();
  // The device returned an id it does not own: the queue is broken until reset.
  [[nodiscard]] bool broken() const { return broken_; }

 private:
  DmaArea mem_;
  std::uint16_t size_;
  std::size_t avail_off_, used_off_;
  std::uint16_t free_, free_head_ = 0, avail_idx_ = 0, last_used_ = 0;
  std::vector<std::uint16_t> chain_len_;  // per head id: descriptors in the chain (0 = free)
  bool broken_ = false;
};

}  // namespace vrdma::pv
