// The re-creation record of a QP stopped on a NIC (vhost/src/rdma/rebuild_record.hpp) comes
// inside a device state from the frontend. decode() must refuse what is out of range without
// crashing, and what it accepts must be exactly what encode() writes for it.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "rebuild_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace vrdma::vhost::rebuild;
  auto r = decode(std::span(data, size));
  if (!r) return 0;
  const auto again = encode(*r);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  auto back = decode(again);
  if (!back || !(*back == *r)) std::abort();
  return 0;
}
