// Fuzzes the descriptor walkers: the input becomes a small guest memory (two regions with a
// hole) holding a ring, and a split or packed device ring pops and pushes until it is empty,
// broken, or a bound is reached. AddressSanitizer catches any access outside the regions.
#include <cstdint>
#include <cstring>
#include <vector>

#include "ring_memory.hpp"
#include "vrdma/vhost/virtqueue.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  const std::uint8_t mode = data[0];
  const auto qsize = static_cast<std::uint16_t>(1u << (data[1] % 6));  // 1..32
  data += 2;
  size -= 2;
  auto mem = fuzz::ring_memory(data, size);
  if (!mem) return 0;
  GuestView g(mem, nullptr);
  RingSetup s;
  s.size = qsize;
  s.packed = (mode & 1) != 0;
  s.event_idx = (mode & 2) != 0;
  s.indirect = (mode & 4) != 0;
  s.desc = 0;
  s.driver = 0x2000;
  s.device = 0x3000;
  const std::uint32_t base = s.packed ? (0x80008000u | (mode >> 4) % qsize | (((mode >> 4) % qsize) << 16)) : (mode >> 3);
  auto ring = make_ring(s, base, g, InflightRegion{});
  if (!ring) return 0;
  for (int n = 0; n < 256; ++n) {
    auto c = (*ring)->pop(g);
    if (!c || !c->has_value()) break;
    ChainReader rd(g, **c);
    std::uint8_t tmp[256];
    (void)rd.read(tmp, std::min<std::uint64_t>(rd.remaining(), sizeof tmp));
    ChainWriter wr(g, **c);
    (void)wr.write(tmp, std::min<std::uint64_t>(wr.remaining(), sizeof tmp));
    if (!(*ring)->push(g, **c, static_cast<std::uint32_t>(wr.written())).ok()) break;
    (void)(*ring)->should_notify(g);
  }
  return 0;
}
