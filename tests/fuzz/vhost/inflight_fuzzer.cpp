// Fuzzes reconnect from an inflight area (SET_INFLIGHT_FD hands the backend memory the frontend
// can fill with anything): the input becomes one queue's inflight slice and a small guest memory
// holding a split or packed ring; the ring is built from the slice (recovery, resubmission) and
// then pops and pushes until it is empty, broken, or a bound is reached. AddressSanitizer catches
// any access outside the slice or the regions.
//
// Input: mode (bit 0 packed, 1 event idx, 2 indirect, 3 stamp the slice's version and size so
// the recovery path is taken, 4..7 base), queue size, the slice, then guest memory.
#include <cstdint>
#include <cstring>
#include <vector>

#include "vrdma/vhost/inflight.hpp"
#include "ring_memory.hpp"
#include "vrdma/vhost/virtqueue.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::uint8_t mode = data[0];
  const bool packed = (mode & 1) != 0;
  const auto qsize = static_cast<std::uint16_t>(packed ? 1 + data[1] % 32 : 1u << (data[1] % 6));
  data += 2;
  size -= 2;
  static auto area = InflightArea::create(1, 32);
  if (!area) return 0;
  const InflightRegion slice(area->queue(0).base(), qsize);
  const std::uint64_t slice_bytes = InflightRegion::queue_bytes(qsize);
  std::memset(slice.base(), 0, InflightRegion::queue_bytes(32));
  const std::size_t n = std::min<std::size_t>(size, slice_bytes);
  std::memcpy(slice.base(), data, n);
  data += n;
  size -= n;
  if ((mode & 8) != 0) {  // version 1, desc_num = queue size: both layouts keep them at bytes 8..11
    const std::uint16_t v = 1;
    std::memcpy(slice.base() + 8, &v, 2);
    std::memcpy(slice.base() + 10, &qsize, 2);
  }
  auto mem = fuzz::ring_memory(data, size);
  if (!mem) return 0;
  GuestView g(mem, nullptr);
  RingSetup s;
  s.size = qsize;
  s.packed = packed;
  s.event_idx = (mode & 2) != 0;
  s.indirect = (mode & 4) != 0;
  s.desc = 0;
  s.driver = 0x2000;
  s.device = 0x3000;
  const std::uint32_t base = packed ? (0x80008000u | (mode >> 4) % qsize | (((mode >> 4) % qsize) << 16)) : (mode >> 4);
  auto ring = make_ring(s, base, g, slice);
  if (!ring) return 0;
  for (int i = 0; i < 256; ++i) {
    auto c = (*ring)->pop(g);
    if (!c || !c->has_value()) break;
    ChainWriter wr(g, **c);
    const std::uint8_t status = 0;
    (void)wr.write(&status, std::min<std::uint64_t>(wr.remaining(), 1));
    if (!(*ring)->push(g, **c, static_cast<std::uint32_t>(wr.written())).ok()) break;
  }
  // The slice a reconnect after this would see must recover (or be refused) just as safely.
  auto again = make_ring(s, base, g, slice);
  if (again) (void)(*again)->pop(g);
  return 0;
}
