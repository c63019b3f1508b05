// The guest memory the ring fuzzers build from their input: region A at gpa 0x0, 16 KiB (the
// ring at 0x0/0x2000/0x3000 and indirect tables), a hole, region B at gpa 0x10000, 4 KiB
// (buffers). Filled from `data`; the rest is zero. Reuses static buffers: one input at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "vrdma/vhost/guest_memory.hpp"

namespace vrdma::fuzz {

inline std::shared_ptr<const vhost::GuestMemory> ring_memory(const std::uint8_t* data, std::size_t size) {
  static std::vector<std::uint8_t> a(16384), b(4096);
  std::memset(a.data(), 0, a.size());
  std::memset(b.data(), 0, b.size());
  std::memcpy(a.data(), data, std::min(size, a.size()));
  if (size > a.size()) std::memcpy(b.data(), data + a.size(), std::min(size - a.size(), b.size()));
  auto mem = vhost::GuestMemory::build({vhost::MappedRegion::wrap({0, a.size(), 0x7000000000, 0}, a.data()),
                                        vhost::MappedRegion::wrap({0x10000, b.size(), 0x7000100000, 0}, b.data())});
  return mem ? *mem : nullptr;
}

}  // namespace vrdma::fuzz
