// Fuzzes verbs::grh_source() on the 40 bytes a NIC writes before a UD message's payload (their
// content comes from the network): it must never read outside them, and what it returns must
// be one of the two shapes it knows (an IPv4-mapped GID taken from bytes 32..35, or the SGID
// at bytes 8..23 of a version-6 GRH).
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "vrdma/nicdrv/verbs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 40) return 0;
  std::array<std::uint8_t, 40> g;  // its own copy: reads past it are ASan's to catch
  std::memcpy(g.data(), data, 40);
  auto r = vrdma::nicdrv::verbs::grh_source(g);
  if (!r) return 0;
  if (r->is_ipv4_mapped() && std::memcmp(r->raw.data() + 12, g.data() + 32, 4) == 0) return 0;
  if ((g[0] >> 4) == 6 && std::memcmp(r->raw.data(), g.data() + 8, 16) == 0) return 0;
  std::abort();
}
