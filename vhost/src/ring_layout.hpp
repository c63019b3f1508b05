// Ring wire layouts (virtio 1.2 §2.7.5, §2.7.6, §2.7.8, §2.8.13), private to vhost/.
#pragma once

#include <cstdint>

#include "vrdma/common/result.hpp"
#include "vrdma/vhost/virtqueue.hpp"

namespace vrdma::vhost {

struct SplitDesc {
  std::uint64_t addr;
  std::uint32_t len;
  std::uint16_t flags;
  std::uint16_t next;
};
struct UsedElem {
  std::uint32_t id;
  std::uint32_t len;
};
struct PackedDesc {
  std::uint64_t addr;
  std::uint32_t len;
  std::uint16_t id;
  std::uint16_t flags;
};
struct PackedEvent {
  std::uint16_t off_wrap;
  std::uint16_t flags;
};
static_assert(sizeof(SplitDesc) == 16 && sizeof(UsedElem) == 8 && sizeof(PackedDesc) == 16 && sizeof(PackedEvent) == 4);

inline constexpr std::uint16_t kDescNext = 1;
inline constexpr std::uint16_t kDescWrite = 2;
inline constexpr std::uint16_t kDescIndirect = 4;
inline constexpr std::uint16_t kPackedAvail = 1u << 7;
inline constexpr std::uint16_t kPackedUsed = 1u << 15;
inline constexpr std::uint16_t kAvailNoInterrupt = 1;  // split avail.flags
inline constexpr std::uint16_t kUsedNoNotify = 1;      // split used.flags
inline constexpr std::uint16_t kEventEnable = 0;       // packed event flags
inline constexpr std::uint16_t kEventDisable = 1;
inline constexpr std::uint16_t kEventDesc = 2;

// Split layout offsets.
inline constexpr std::uint64_t kAvailIdx = 2, kAvailRing = 4;
inline constexpr std::uint64_t kUsedIdx = 2, kUsedRing = 4;

// Appends one buffer to a chain with the ordering, count and overflow checks.
Status append_buf(DescChain& c, std::uint64_t addr, std::uint32_t len, bool writable);
// An indirect table (either layout: 16-byte descriptors): whole descriptors, at most kMaxChain,
// inside one guest memory region.
struct IndirectTable {
  const std::uint8_t* bytes;
  std::uint64_t count;
};
Result<IndirectTable> indirect_table(const GuestView& g, std::uint64_t addr, std::uint32_t len);
// Every buffer of the chain lies in guest memory (a buffer may span adjacent regions).
Status check_buffers_in_memory(const GuestView& g, const DescChain& c);

// Built by make_ring() after the layout checks.
Result<std::unique_ptr<Ring>> make_split_ring(const RingSetup& s, std::uint32_t base, const GuestView& g,
                                              const InflightRegion& inflight);
Result<std::unique_ptr<Ring>> make_packed_ring(const RingSetup& s, std::uint32_t base, const GuestView& g,
                                               PackedInflightRegion inflight);

}  // namespace vrdma::vhost
