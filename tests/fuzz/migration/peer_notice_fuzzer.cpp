// Peer notices (migration/include/vrdma/migration/peer_notice.hpp) are bytes from the network: decode()
// must refuse what is malformed without crashing, and what it accepts must be exactly what
// encode() writes for it; the header check must agree with the whole message's.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "vrdma/migration/peer_notice.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace vrdma::migration::notice;
  const std::span<const std::uint8_t> in(data, size);
  auto m = decode(in);
  if (size >= kHeaderLen) {
    auto len = body_length(in.first(kHeaderLen));
    if (m && (!len || *len + kHeaderLen != size)) std::abort();
  }
  if (!m) return 0;
  const auto again = encode(*m);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  auto back = decode(again);
  if (!back || !(*back == *m)) std::abort();
  return 0;
}
