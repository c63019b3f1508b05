// The re-creation record of a QP stopped on a NIC and the record of a NIC's SRQ (its receives
// still posted; vrdma/migration/rebuild_record.hpp) come inside a device state from the
// frontend. Both decoders read every input: each must refuse what is out of range without
// crashing; what decode() accepts in the current version must be exactly what encode() writes
// for it, and a record of an older version must come back the same after encode() and
// decode(); what decode_srq() accepts must be exactly what encode_srq() writes.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "vrdma/migration/rebuild_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace vrdma::migration::rebuild;
  if (auto srq = decode_srq(std::span(data, size))) {
    const auto again = encode_srq(*srq);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  }
  auto r = decode(std::span(data, size));
  if (!r) return 0;
  const auto again = encode(*r);
  const bool current = again.size() > 4 && size > 4 && data[4] == again[4];  // the version byte
  if (current && (again.size() != size || !std::equal(again.begin(), again.end(), data))) std::abort();
  auto back = decode(again);
  if (!back || !(*back == *r)) std::abort();
  return 0;
}
