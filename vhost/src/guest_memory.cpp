#include "vrdma/vhost/guest_memory.hpp"

#include "vrdma/vhost/write_journal.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

namespace vrdma::vhost {
namespace {

constexpr std::uint64_t kPage = 4096;

// [a, a+alen) and [b, b+blen) overlap; lengths are non-zero and ends do not overflow.
bool overlaps(std::uint64_t a, std::uint64_t alen, std::uint64_t b, std::uint64_t blen) {
  return a < b + blen && b < a + alen;
}

Status check_region(const MemRegion& r) {
  std::uint64_t end = 0;
  if (r.memory_size == 0) return make_error(Errc::invalid_argument, "guest memory region has size 0");
  if (__builtin_add_overflow(r.guest_phys_addr, r.memory_size, &end) ||
      __builtin_add_overflow(r.userspace_addr, r.memory_size, &end) ||
      __builtin_add_overflow(r.mmap_offset, r.memory_size, &end))
    return make_error(Errc::invalid_argument,
                      fmt::format("guest memory region gpa {:#x} size {:#x} wraps the address space",
                                  r.guest_phys_addr, r.memory_size));
  return {};
}

// Seals `fd` against shrinking when it can be sealed and is not yet (QEMU's memory-backend-memfd
// comes sealed already: seal=on, its default). True when the file can no longer shrink.
bool seal_against_shrinking(int fd) {
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return false;  // not a memfd (a file on tmpfs or hugetlbfs): cannot be sealed
  if ((seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) == 0 && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0)
    seals |= F_SEAL_SHRINK;
  return (seals & F_SEAL_SHRINK) != 0;
}

}  // namespace

Result<std::shared_ptr<const MappedRegion>> MappedRegion::map(const MemRegion& r, UniqueFd fd,
                                                              std::shared_ptr<FaultSink> sink) {
  VRDMA_TRY(check_region(r));
  if (!fd) return make_error(Errc::invalid_argument, "guest memory region came without a file descriptor");
  const bool sealed = seal_against_shrinking(fd.get());  // before the size check, which it makes final
  if (r.mmap_offset % kPage != 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("guest memory region mmap_offset {:#x} is not page-aligned", r.mmap_offset));
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return errno_error(errno, "fstat of a guest memory fd");
  if (!S_ISREG(st.st_mode))
    return make_error(Errc::invalid_argument, "guest memory fd is not a memfd or regular file");
  if (static_cast<std::uint64_t>(st.st_size) < r.mmap_offset + r.memory_size)
    return make_error(Errc::invalid_argument,
                      fmt::format("guest memory region needs {:#x} bytes of its fd but the fd has only {:#x}",
                                  r.mmap_offset + r.memory_size, st.st_size));
  if (r.memory_size > static_cast<std::uint64_t>(PTRDIFF_MAX))
    return make_error(Errc::invalid_argument, "guest memory region is larger than the address space");
  void* p = ::mmap(nullptr, r.memory_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd.get(),
                   static_cast<off_t>(r.mmap_offset));
  if (p == MAP_FAILED) return errno_error(errno, "mmap of a guest memory region");
  auto m = std::make_shared<MappedRegion>();
  m->desc_ = r;
  m->map_ = MmapArea(p, r.memory_size);
  m->host_ = static_cast<std::uint8_t*>(p);
  m->fd_ = std::move(fd);
  m->sealed_ = sealed;
  m->guard_ = GuardedMapping(p, r.memory_size, "guest memory", std::move(sink));
  return std::shared_ptr<const MappedRegion>(std::move(m));
}

std::shared_ptr<const MappedRegion> MappedRegion::wrap(const MemRegion& r, std::uint8_t* host) {
  auto m = std::make_shared<MappedRegion>();
  m->desc_ = r;
  m->host_ = host;
  return m;
}

Result<std::shared_ptr<const GuestMemory>> GuestMemory::build(std::vector<RegionPtr> regions) {
  if (regions.size() > kMaxMemSlots)
    return make_error(Errc::limit_exceeded, fmt::format("guest memory table has {} regions; at most {} are allowed",
                                                        regions.size(), kMaxMemSlots));
  for (std::size_t i = 0; i < regions.size(); ++i) {
    VRDMA_TRY(check_region(regions[i]->desc()));
    for (std::size_t j = 0; j < i; ++j) {
      const auto& a = regions[i]->desc();
      const auto& b = regions[j]->desc();
      if (overlaps(a.guest_phys_addr, a.memory_size, b.guest_phys_addr, b.memory_size))
        return make_error(Errc::invalid_argument,
                          fmt::format("guest memory regions at gpa {:#x} and {:#x} overlap", a.guest_phys_addr,
                                      b.guest_phys_addr));
      if (overlaps(a.userspace_addr, a.memory_size, b.userspace_addr, b.memory_size))
        return make_error(Errc::invalid_argument,
                          fmt::format("guest memory regions at uaddr {:#x} and {:#x} overlap", a.userspace_addr,
                                      b.userspace_addr));
    }
  }
  std::sort(regions.begin(), regions.end(), [](const RegionPtr& a, const RegionPtr& b) { return a->gpa() < b->gpa(); });
  auto g = std::make_shared<GuestMemory>();
  g->regions_ = std::move(regions);
  return std::shared_ptr<const GuestMemory>(std::move(g));
}

std::shared_ptr<const GuestMemory> GuestMemory::empty() {
  static const auto e = std::make_shared<const GuestMemory>();
  return e;
}

Result<std::shared_ptr<const GuestMemory>> GuestMemory::with(RegionPtr r) const {
  auto v = regions_;
  v.push_back(std::move(r));
  return build(std::move(v));
}

Result<std::shared_ptr<const GuestMemory>> GuestMemory::without(const MemRegion& r) const {
  auto v = regions_;
  auto it = std::find_if(v.begin(), v.end(), [&](const RegionPtr& x) {
    return x->gpa() == r.guest_phys_addr && x->size() == r.memory_size && x->desc().userspace_addr == r.userspace_addr;
  });
  if (it == v.end())
    return make_error(Errc::not_found, fmt::format("no guest memory region at gpa {:#x} size {:#x} to remove",
                                                   r.guest_phys_addr, r.memory_size));
  v.erase(it);
  return build(std::move(v));
}

Result<GuestMemory::Span> GuestMemory::at(std::uint64_t gpa) const {
  for (const auto& r : regions_) {
    if (gpa >= r->gpa() && gpa - r->gpa() < r->size()) {
      const std::uint64_t off = gpa - r->gpa();
      return Span{r->host() + off, r->size() - off};
    }
  }
  return make_error(Errc::access_denied, fmt::format("guest address {:#x} is outside guest memory", gpa));
}

Result<std::uint8_t*> GuestMemory::range(std::uint64_t gpa, std::uint64_t len) const {
  auto s = at(gpa);
  if (!s) return std::move(s).error();
  if (len > s->len)
    return make_error(Errc::access_denied,
                      fmt::format("guest range {:#x}+{:#x} runs past the end of its memory region", gpa, len));
  return s->ptr;
}

Result<std::uint64_t> GuestMemory::uaddr_to_gpa(std::uint64_t uaddr, std::uint64_t len) const {
  for (const auto& r : regions_) {
    const std::uint64_t ua = r->desc().userspace_addr;
    if (uaddr >= ua && uaddr - ua < r->size()) {
      if (len > r->size() - (uaddr - ua)) break;
      return r->gpa() + (uaddr - ua);
    }
  }
  return make_error(Errc::access_denied,
                    fmt::format("frontend address {:#x}+{:#x} is not inside one guest memory region", uaddr, len));
}

Result<std::shared_ptr<DirtyLog>> DirtyLog::map(UniqueFd fd, std::uint64_t size, std::uint64_t offset,
                                                std::shared_ptr<FaultSink> sink) {
  if (size == 0 || size > (std::uint64_t{1} << 40))
    return make_error(Errc::invalid_argument, fmt::format("dirty log size {:#x} is out of range", size));
  if (offset % kPage != 0)
    return make_error(Errc::invalid_argument, fmt::format("dirty log offset {:#x} is not page-aligned", offset));
  (void)seal_against_shrinking(fd.get());
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return errno_error(errno, "fstat of the dirty log fd");
  std::uint64_t end = 0;
  if (!S_ISREG(st.st_mode) || __builtin_add_overflow(offset, size, &end) ||
      static_cast<std::uint64_t>(st.st_size) < end)
    return make_error(Errc::invalid_argument, "dirty log fd is not a file of at least mmap_offset + mmap_size bytes");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), static_cast<off_t>(offset));
  if (p == MAP_FAILED) return errno_error(errno, "mmap of the dirty log");
  auto l = std::make_shared<DirtyLog>();
  l->map_ = MmapArea(p, size);
  l->guard_ = GuardedMapping(p, size, "the dirty log", std::move(sink));
  l->bits_ = static_cast<std::uint8_t*>(p);
  l->size_ = size;
  return l;
}

bool DirtyLog::mark(std::uint64_t gpa, std::uint64_t len) noexcept {
  if (len == 0) return true;
  const std::uint64_t first = gpa / kPageSize;
  const std::uint64_t last = (len - 1 > UINT64_MAX - gpa) ? UINT64_MAX / kPageSize : (gpa + len - 1) / kPageSize;
  for (std::uint64_t page = first; page <= last; ++page) {
    const std::uint64_t byte = page / 8;
    if (byte >= size_) {
      overflow_.fetch_add(last - page + 1, std::memory_order_relaxed);
      return false;
    }
    std::atomic_ref<std::uint8_t>(bits_[byte]).fetch_or(static_cast<std::uint8_t>(1u << (page % 8)),
                                                        std::memory_order_relaxed);
  }
  return true;
}

namespace {

// Calls f(host, offset, n) for each piece of [gpa, gpa+len) that lies in one region, in order;
// stops at the first address outside guest memory (or a wrap) with its error.
template <class F>
Status for_each_piece(const GuestMemory& mem, std::uint64_t gpa, std::uint64_t len, F&& f) {
  std::uint64_t done = 0;
  while (done < len) {
    std::uint64_t a = 0;
    if (__builtin_add_overflow(gpa, done, &a))
      return make_error(Errc::access_denied, fmt::format("guest range {:#x}+{:#x} wraps", gpa, len));
    auto s = mem.at(a);
    if (!s) return std::move(s).error();
    const std::uint64_t n = std::min(s->len, len - done);
    f(s->ptr, done, n);
    done += n;
  }
  return {};
}

}  // namespace

Status GuestView::read(std::uint64_t gpa, void* dst, std::uint64_t len) const {
  auto* out = static_cast<std::uint8_t*>(dst);
  return for_each_piece(*mem_, gpa, len,
                        [&](std::uint8_t* p, std::uint64_t off, std::uint64_t n) { std::memcpy(out + off, p, n); });
}

Status GuestView::write(std::uint64_t gpa, const void* src, std::uint64_t len) const {
  // Check the whole range first so a failed write leaves guest memory untouched.
  VRDMA_TRY(for_each_piece(*mem_, gpa, len, [](std::uint8_t*, std::uint64_t, std::uint64_t) {}));
  const auto* in = static_cast<const std::uint8_t*>(src);
  VRDMA_TRY(for_each_piece(*mem_, gpa, len,
                           [&](std::uint8_t* p, std::uint64_t off, std::uint64_t n) { std::memcpy(p, in + off, n); }));
  const bool logged = log_ != nullptr && log_->mark(gpa, len);
  journal::write(gpa, len, journal::Source::backend, log_ != nullptr, logged);
  return {};
}

Result<std::uint16_t> GuestView::load_u16_acquire(std::uint64_t gpa) const {
  if (gpa % 2 != 0) return make_error(Errc::invalid_argument, fmt::format("ring index at {:#x} is misaligned", gpa));
  auto p = mem_->range(gpa, 2);
  if (!p) return std::move(p).error();
  return std::atomic_ref<std::uint16_t>(*reinterpret_cast<std::uint16_t*>(*p)).load(std::memory_order_acquire);
}

Status GuestView::store_u16_release(std::uint64_t gpa, std::uint16_t v) const {
  if (gpa % 2 != 0) return make_error(Errc::invalid_argument, fmt::format("ring index at {:#x} is misaligned", gpa));
  auto p = mem_->range(gpa, 2);
  if (!p) return std::move(p).error();
  std::atomic_ref<std::uint16_t>(*reinterpret_cast<std::uint16_t*>(*p)).store(v, std::memory_order_release);
  const bool logged = log_ != nullptr && log_->mark(gpa, 2);
  journal::write(gpa, 2, journal::Source::backend, log_ != nullptr, logged);
  return {};
}

}  // namespace vrdma::vhost
