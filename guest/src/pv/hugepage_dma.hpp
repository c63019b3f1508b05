// DMA memory for a driver inside a VM without a kernel module (the way DPDK's virtio driver
// works on uio): 2 MiB hugepages (MAP_HUGETLB, from the pool vm.nr_hugepages fills; hugetlb
// pages are never swapped), locked and touched, with guest-physical addresses read from
// /proc/self/pagemap (needs CAP_SYS_ADMIN, else the kernel reports frame 0). Each run of
// hugepages contiguous both virtually and physically is one heap, so every area handed out is
// physically contiguous (what the device's rings and gpa_of need). As a DriverMemory it holds
// the transport's virtqueues. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "page_heap.hpp"
#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/guest/pv.hpp"
#include "vrdma/vhost/driver_memory.hpp"

namespace vrdma::pv {

class HugepageDma final : public vhost::DriverMemory {
 public:
  static constexpr std::uint64_t kHugePage = 2u << 20;

  // `bytes` rounded up to whole hugepages.
  static Result<HugepageDma> create(std::uint64_t bytes);

  Result<DmaArea> alloc(std::size_t len);
  // DriverMemory: whole pages (so at most 4 KiB alignment), zeroed.
  [[nodiscard]] std::uint8_t* host(std::uint64_t gpa, std::uint64_t len) const override;
  Result<std::uint64_t> alloc(std::uint64_t len, std::uint64_t align) override;
  void free(const DmaArea& a);
  [[nodiscard]] std::optional<std::uint64_t> gpa_of(const void* p, std::size_t len) const;
  [[nodiscard]] std::uint64_t size() const { return map_.size(); }
  [[nodiscard]] std::size_t segments() const { return segs_.size(); }
  // Largest physically contiguous run, in bytes.
  [[nodiscard]] std::uint64_t largest_segment() const;

 private:
  struct Segment {
    std::uint8_t* host;
    std::uint64_t gpa, len;
    std::unique_ptr<PageHeap> heap;
  };
  MmapArea map_;
  std::vector<Segment> segs_;
};

}  // namespace vrdma::pv
