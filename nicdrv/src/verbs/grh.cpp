// The sender of a UD message from the 40 bytes a NIC writes before its payload (verbs.hpp).
// On its own so that the fuzz target links it without the provider.
#include <cstring>

#include "vrdma/nicdrv/verbs.hpp"

namespace vrdma::nicdrv::verbs {
namespace {

std::uint16_t ipv4_checksum(const std::uint8_t* h) {  // RFC 791 over 20 bytes, checksum field included
  std::uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += static_cast<std::uint32_t>(h[i] << 8 | h[i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum);
}

}  // namespace

std::optional<Gid> grh_source(std::span<const std::uint8_t, 40> g) noexcept {
  Gid out;
  const std::uint8_t* v4 = g.data() + 20;
  const bool v4_shape = v4[0] == 0x45;  // version 4, no options: what RoCE v2 carries
  // RoCE v2 over IPv4 leaves the first 20 bytes to the NIC (zero on rxe) and puts the IPv4
  // header in the last 20. A real GRH (version 6) could look like one by accident in bytes
  // 20..39 (its GIDs), so then only a valid header checksum decides, as in rdma-core's
  // ibv_init_ah_from_wc. (Linux rxe's own loopback leaves the checksum 0, hence not always.)
  const bool grh = (g[0] >> 4) == 6;
  if (v4_shape && (!grh || ipv4_checksum(v4) == 0)) {
    out.raw[10] = 0xff;
    out.raw[11] = 0xff;
    std::memcpy(out.raw.data() + 12, v4 + 12, 4);
    return out;
  }
  if (grh) {  // an IB GRH or RoCE v2 over IPv6: SGID at byte 8
    std::memcpy(out.raw.data(), g.data() + 8, 16);
    return out;
  }
  return std::nullopt;
}

}  // namespace vrdma::nicdrv::verbs
