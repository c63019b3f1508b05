// Device side of a virtqueue (virtio 1.2 §2.7 split, §2.8 packed).
//
// Who owns what at the ring: the driver (guest or our frontend) produces descriptors and the
// avail ring / avail flags; the device (this code) consumes them and produces the used ring /
// used flags. The device reads the driver's index (or the descriptor flags, packed) with
// acquire ordering before it reads descriptors, and publishes used entries before the index
// (or the used flags) with release ordering. Every device write goes through GuestView, so it
// is dirty-logged when logging is on.
//
// Untrusted input: every index is checked against the queue size, every address through the
// guest memory map; chains are bounded (kMaxChain descriptors and at most `size` steps of a
// direct chain, so a loop is detected), lengths are summed with overflow checks, and an
// indirect table must be whole 16-byte descriptors inside guest memory. A ring that breaks a
// rule is marked broken (virtio DEVICE_NEEDS_RESET); it then does nothing until restarted.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/vhost/guest_memory.hpp"
#include "vrdma/vhost/inflight.hpp"

namespace vrdma::vhost {

inline constexpr std::uint16_t kMaxQueueSize = 32768;
inline constexpr std::uint32_t kMaxChain = 1024;  // descriptors in one chain, indirect included

struct DescBuf {
  std::uint64_t gpa;
  std::uint32_t len;
  bool writable;
};

// One available buffer: readable descriptors first, then writable ones (virtio §2.7.4.2).
struct DescChain {
  std::uint16_t id = 0;     // split: head index; packed: buffer id
  std::uint16_t slots = 0;  // ring slots the chain occupies (packed; 1 when indirect)
  std::vector<DescBuf> bufs;
  std::uint64_t readable = 0;
  std::uint64_t writable = 0;
};

// Sequential reads across a chain's readable buffers.
class ChainReader {
 public:
  ChainReader(const GuestView& g, const DescChain& c) : g_(g), c_(c) {}
  Status read(void* dst, std::uint64_t len);
  [[nodiscard]] std::uint64_t remaining() const { return c_.readable - consumed_; }

 private:
  const GuestView& g_;
  const DescChain& c_;
  std::size_t buf_ = 0;
  std::uint64_t off_ = 0, consumed_ = 0;
};

// Sequential writes across a chain's writable buffers, dirty-logged through GuestView.
class ChainWriter {
 public:
  ChainWriter(const GuestView& g, const DescChain& c);
  Status write(const void* src, std::uint64_t len);
  [[nodiscard]] std::uint64_t remaining() const { return c_.writable - written_; }
  [[nodiscard]] std::uint64_t written() const { return written_; }

 private:
  const GuestView& g_;
  const DescChain& c_;
  std::size_t buf_;
  std::uint64_t off_ = 0, written_ = 0;
};

// Walks a descriptor table (split layout, 16-byte {addr,len,flags,next}) from head. Exposed
// for the fuzzer and unit tests; SplitRing uses it.
Result<DescChain> walk_split_chain(const GuestView& g, std::uint64_t table_gpa, std::uint16_t size,
                                   std::uint16_t head, bool indirect_ok);

// Where a ring lives, as guest-physical addresses.
struct RingSetup {
  std::uint16_t size = 0;
  std::uint64_t desc = 0, driver = 0, device = 0;  // split: desc, avail, used
  bool packed = false;
  bool event_idx = false;
  bool indirect = false;
};


class Ring {
 public:
  virtual ~Ring() = default;
  // Next available chain, or nullopt if the ring is empty (or broken). An error breaks the ring.
  Result<std::optional<DescChain>> pop(const GuestView& g);
  // Returns a chain to the driver with `written` bytes written into it.
  virtual Status push(const GuestView& g, const DescChain& c, std::uint32_t written) = 0;
  // After pushes: does the driver want an interrupt (event suppression)?
  virtual Result<bool> should_notify(const GuestView& g) = 0;
  // Driver notifications (kicks) wanted (on) or not (off: the device polls this ring), virtio
  // §2.7.10 / §2.8.10: split rings without EVENT_IDX set or clear used.flags NO_NOTIFY, with
  // EVENT_IDX the device stops moving avail_event (and moves it to the ring's position when they
  // come back on), packed rings set the device event flags. Idempotent. After turning them
  // back on, the caller pops again: a buffer made available in between came without a kick.
  Status set_notification(const GuestView& g, bool on);
  [[nodiscard]] bool notification() const { return notify_on_; }
  // GET_VRING_BASE value: split: last avail idx; packed: (avail idx | wrap << 15) in bits
  // 0..15 and (used idx | wrap << 15) in bits 16..31, as QEMU encodes it.
  [[nodiscard]] virtual std::uint32_t base() const = 0;
  [[nodiscard]] bool broken() const { return broken_; }

 protected:
  // The layout's pop; pop() turns its errors into a broken ring.
  virtual Result<std::optional<DescChain>> pop_inner(const GuestView& g) = 0;
  // The layout's part of set_notification(): the guest-memory store.
  virtual Status store_notification(const GuestView& g, bool on) = 0;
  bool broken_ = false;
  bool notify_on_ = true;
};

// Checks the ring's layout (alignment, inside guest memory) and builds the ring at `base`.
// `inflight` (may be unattached) records popped-but-unused chains for reconnect; a slice that holds
// state from an earlier backend is recovered, and the ring resumes from it instead of `base`.
Result<std::unique_ptr<Ring>> make_ring(const RingSetup& s, std::uint32_t base, const GuestView& g,
                                        const InflightRegion& inflight);

// Byte sizes of the three ring areas (virtio §2.7 and §2.8).
std::uint64_t desc_area_size(const RingSetup& s);
std::uint64_t driver_area_size(const RingSetup& s);
std::uint64_t device_area_size(const RingSetup& s);

// virtio §2.7.10: has the index passed event since old?
constexpr bool need_event(std::uint16_t event, std::uint16_t new_idx, std::uint16_t old_idx) {
  return static_cast<std::uint16_t>(new_idx - event - 1) < static_cast<std::uint16_t>(new_idx - old_idx);
}

}  // namespace vrdma::vhost
