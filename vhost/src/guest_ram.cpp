#include "vrdma/vhost/guest_ram.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace vrdma::vhost {

std::vector<RamRegion> GuestRam::vm_layout(std::uint64_t mib) {
  const std::uint64_t M = 1u << 20;
  const std::uint64_t total = std::max<std::uint64_t>(mib, 8) * M;
  const std::uint64_t low = 640u << 10;
  const std::uint64_t mid = (total - low) * 3 / 4 / M * M;
  const std::uint64_t high = total - low - mid;
  return {{0, low, 0}, {1 * M, mid, 2 * M}, {std::uint64_t{4} << 30, high, 3 * M + mid}};
}

Result<GuestRam> GuestRam::create(const std::vector<RamRegion>& layout, Sealing sealing) {
  GuestRam g;
  g.layout_ = layout;
  for (const auto& r : layout) {
    if (r.size == 0 || r.fd_offset % 4096 != 0 || r.size % 4096 != 0 || r.gpa % 4096 != 0)
      return make_error(Errc::invalid_argument, "guest RAM regions must be non-empty and page-aligned");
    g.fd_size_ = std::max(g.fd_size_, r.fd_offset + r.size);
  }
  g.fd_ = UniqueFd(::memfd_create("vrdma-guest-ram", MFD_CLOEXEC | (sealing == Sealing::none ? 0u : MFD_ALLOW_SEALING)));
  if (!g.fd_) return errno_error(errno, "memfd_create for guest RAM");
  if (::ftruncate(g.fd_.get(), static_cast<off_t>(g.fd_size_)) != 0) return errno_error(errno, "ftruncate guest RAM");
  if (sealing == Sealing::sealed && ::fcntl(g.fd_.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0)
    return errno_error(errno, "sealing guest RAM");
  for (const auto& r : layout) {
    void* p = ::mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd_.get(), static_cast<off_t>(r.fd_offset));
    if (p == MAP_FAILED) return errno_error(errno, "mmap guest RAM region");
    g.maps_.emplace_back(p, r.size);
    g.next_.push_back(0);
  }
  return g;
}

Result<GuestRam> GuestRam::create_like(const GuestRam& src) {
  auto g = create(src.layout_);
  if (!g) return std::move(g).error();
  g->next_ = src.next_;
  return g;
}

std::uint8_t* GuestRam::host(std::uint64_t gpa, std::uint64_t len) const {
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const auto& r = layout_[i];
    if (gpa >= r.gpa && gpa - r.gpa < r.size && len <= r.size - (gpa - r.gpa))
      return static_cast<std::uint8_t*>(maps_[i].data()) + (gpa - r.gpa);
  }
  return nullptr;
}

std::vector<MemRegion> GuestRam::table() const {
  std::vector<MemRegion> t;
  for (std::size_t i = 0; i < layout_.size(); ++i)
    t.push_back({layout_[i].gpa, layout_[i].size, reinterpret_cast<std::uint64_t>(maps_[i].data()), layout_[i].fd_offset});
  return t;
}

Result<std::uint64_t> GuestRam::alloc(std::uint64_t len, std::uint64_t align) {
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const auto& r = layout_[i];
    const std::uint64_t start = (r.gpa + next_[i] + align - 1) / align * align;
    if (start - r.gpa <= r.size && len <= r.size - (start - r.gpa)) {
      next_[i] = start - r.gpa + len;
      return start;
    }
  }
  return make_error(Errc::no_memory, fmt::format("guest RAM has no room for {} more bytes", len));
}

}  // namespace vrdma::vhost
