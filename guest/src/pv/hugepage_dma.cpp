#include "hugepage_dma.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>

namespace vrdma::pv {
namespace {

constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kPagemapPresent = 1ull << 63;
constexpr std::uint64_t kPagemapPfnMask = (1ull << 55) - 1;

}  // namespace

Result<HugepageDma> HugepageDma::create(std::uint64_t bytes) {
  if (bytes == 0 || bytes > (64ull << 30)) return make_error(Errc::invalid_argument, "DMA memory must be 1 B..64 GiB");
  const std::uint64_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    return errno_error(errno, fmt::format("cannot map {} MiB of 2 MiB hugepages (free ones in the pool? echo N > "
                                          "/proc/sys/vm/nr_hugepages)", len >> 20));
  HugepageDma d;
  d.map_ = MmapArea(p, len);
  auto* base = static_cast<std::uint8_t*>(p);
  // Touch every page so each is backed now; MAP_POPULATE may leave holes when the pool runs dry.
  for (std::uint64_t off = 0; off < len; off += kHugePage) std::memset(base + off, 0, kHugePage);
  (void)::mlock(p, len);  // hugetlb pages do not swap; the lock only documents intent

  UniqueFd pm(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  if (!pm) return errno_error(errno, "cannot open /proc/self/pagemap");
  std::uint64_t prev_gpa = 0;
  for (std::uint64_t off = 0; off < len; off += kHugePage) {
    const std::uint64_t va = reinterpret_cast<std::uint64_t>(base + off);
    std::uint64_t e = 0;
    if (::pread(pm.get(), &e, sizeof e, static_cast<off_t>(va / kPage * sizeof e)) != static_cast<ssize_t>(sizeof e))
      return errno_error(errno, "reading /proc/self/pagemap");
    const std::uint64_t pfn = e & kPagemapPfnMask;
    if ((e & kPagemapPresent) == 0) return make_error(Errc::no_memory, "a hugepage is not present after touching it");
    if (pfn == 0)
      return make_error(Errc::access_denied, "/proc/self/pagemap shows no physical addresses (needs CAP_SYS_ADMIN: run as root)");
    const std::uint64_t gpa = pfn * kPage;
    if (gpa % kHugePage != 0)
      return make_error(Errc::protocol_error, fmt::format("a hugepage at physical {:#x} is not 2 MiB aligned", gpa));
    if (!d.segs_.empty() && gpa == prev_gpa + kHugePage) {
      d.segs_.back().len += kHugePage;
    } else {
      d.segs_.push_back(Segment{base + off, gpa, kHugePage, nullptr});
    }
    prev_gpa = gpa;
  }
  for (auto& s : d.segs_) {
    s.heap = std::make_unique<PageHeap>();
    s.heap->init(s.host, s.gpa, s.len);
  }
  return d;
}

std::uint64_t HugepageDma::largest_segment() const {
  std::uint64_t m = 0;
  for (const auto& s : segs_) m = std::max(m, s.len);
  return m;
}

Result<DmaArea> HugepageDma::alloc(std::size_t len) {
  const std::uint64_t n = (std::max<std::uint64_t>(len, 1) + kPage - 1) / kPage * kPage;
  for (auto& s : segs_) {
    if (s.len < n) continue;
    if (auto off = s.heap->alloc(n)) {
      std::memset(s.host + *off, 0, n);
      return DmaArea{s.host + *off, s.gpa + *off, static_cast<std::size_t>(n)};
    }
  }
  return make_error(Errc::no_memory,
                    fmt::format("the device's DMA memory ({} MiB of hugepages in {} physically contiguous runs, the largest "
                                "{} MiB) has no {} contiguous bytes free; open the device with a larger ram_mib",
                                map_.size() >> 20, segs_.size(), largest_segment() >> 20, n));
}

std::uint8_t* HugepageDma::host(std::uint64_t gpa, std::uint64_t len) const {
  for (const auto& s : segs_) {
    if (gpa < s.gpa || gpa - s.gpa >= s.len) continue;
    return len <= s.len - (gpa - s.gpa) ? s.host + (gpa - s.gpa) : nullptr;
  }
  return nullptr;
}

Result<std::uint64_t> HugepageDma::alloc(std::uint64_t len, std::uint64_t align) {
  if (align == 0 || align > kPage || (align & (align - 1)) != 0)
    return make_error(Errc::invalid_argument, fmt::format("DMA alignment {} is not a power of two up to 4096", align));
  auto a = alloc(static_cast<std::size_t>(len));
  if (!a) return std::move(a).error();
  return a->gpa;
}

void HugepageDma::free(const DmaArea& a) {
  if (a.host == nullptr) return;
  for (auto& s : segs_) {
    if (a.host >= s.host && a.host < s.host + s.len) {
      s.heap->free(static_cast<std::uint64_t>(a.host - s.host), a.len);
      return;
    }
  }
}

std::optional<std::uint64_t> HugepageDma::gpa_of(const void* p, std::size_t len) const {
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (const auto& s : segs_) {
    if (b < s.host || b >= s.host + s.len) continue;
    const auto off = static_cast<std::uint64_t>(b - s.host);
    if (len > s.len - off) return std::nullopt;  // runs past this physically contiguous run
    return s.gpa + off;
  }
  return std::nullopt;
}

}  // namespace vrdma::pv
