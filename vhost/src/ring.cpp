#include <atomic>
// Ring layout checks shared by split and packed rings.
#include <fmt/format.h>

#include "ring_layout.hpp"

namespace vrdma::vhost {

std::uint64_t desc_area_size(const RingSetup& s) { return std::uint64_t{s.size} * 16; }
std::uint64_t driver_area_size(const RingSetup& s) { return s.packed ? 4 : 6 + std::uint64_t{s.size} * 2; }
std::uint64_t device_area_size(const RingSetup& s) { return s.packed ? 4 : 6 + std::uint64_t{s.size} * 8; }

Result<std::optional<DescChain>> Ring::pop(const GuestView& g) {
  if (broken_) return std::optional<DescChain>{};
  auto r = pop_inner(g);
  if (!r) broken_ = true;
  return r;
}

Status Ring::set_notification(const GuestView& g, bool on) {
  if (on == notify_on_ || broken_) return {};
  VRDMA_TRY(store_notification(g, on));
  notify_on_ = on;
  std::atomic_thread_fence(std::memory_order_seq_cst);  // before the caller looks at the ring again
  return {};
}

Result<std::unique_ptr<Ring>> make_ring(const RingSetup& s, std::uint32_t base, const GuestView& g,
                                        const InflightRegion& inflight) {
  if (s.size == 0 || s.size > kMaxQueueSize || (!s.packed && (s.size & (s.size - 1)) != 0))
    return make_error(Errc::invalid_argument,
                      fmt::format("queue size {} is invalid (1..{}, a power of two for split rings)", s.size,
                                  kMaxQueueSize));
  const std::uint64_t driver_align = s.packed ? 4 : 2;
  const std::uint64_t device_align = 4;
  if (s.desc % 16 != 0 || s.driver % driver_align != 0 || s.device % device_align != 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("ring addresses desc {:#x} driver {:#x} device {:#x} are misaligned", s.desc,
                                  s.driver, s.device));
  struct Area {
    const char* name;
    std::uint64_t gpa, len;
  } areas[] = {{"descriptor table", s.desc, desc_area_size(s)},
               {s.packed ? "driver event area" : "avail ring", s.driver, driver_area_size(s)},
               {s.packed ? "device event area" : "used ring", s.device, device_area_size(s)}};
  for (const auto& a : areas) {
    auto r = g.memory().range(a.gpa, a.len);
    if (!r) return make_error(Errc::access_denied, fmt::format("{} at {:#x}: {}", a.name, a.gpa, r.error().message));
  }
  if (s.packed) return make_packed_ring(s, base, g, PackedInflightRegion(inflight));
  return make_split_ring(s, base, g, inflight);
}

}  // namespace vrdma::vhost
