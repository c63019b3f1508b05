// Memory a virtio driver places its rings and buffers in, which the device reaches by
// guest-physical address: the frontend's memfd GuestRam (vhost-user), or hugepages inside a VM
// (libpvverbs' pci transport). DriverQueue works over this interface.
#pragma once

#include <cstdint>

#include "vrdma/common/result.hpp"

namespace vrdma::vhost {

class DriverMemory {
 public:
  virtual ~DriverMemory() = default;
  // Host pointer for [gpa, gpa+len) when the range lies in one mapped, physically contiguous
  // piece; nullptr otherwise.
  [[nodiscard]] virtual std::uint8_t* host(std::uint64_t gpa, std::uint64_t len) const = 0;
  // `len` bytes, physically contiguous, aligned to `align` (a power of two, at most 4096);
  // returns their guest-physical address. Errc::no_memory when there is no room.
  virtual Result<std::uint64_t> alloc(std::uint64_t len, std::uint64_t align) = 0;

 protected:
  DriverMemory() = default;
  DriverMemory(const DriverMemory&) = default;
  DriverMemory& operator=(const DriverMemory&) = default;
  DriverMemory(DriverMemory&&) = default;
  DriverMemory& operator=(DriverMemory&&) = default;
};

}  // namespace vrdma::vhost
