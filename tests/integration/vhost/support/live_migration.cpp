// Frontend-side live migration: the shared dirty log, the driver's write tracking, copy rounds
// and the stop protocol (vhost-user.rst "Migration").
#include "live_migration.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace vrdma::vhost {
namespace {

constexpr std::uint64_t kPage = 4096;

// Linux UAPI that Debian 12's headers (6.1) predate: asynchronous userfaultfd write protection
// (6.7, include/uapi/linux/userfaultfd.h) and the PAGEMAP_SCAN ioctl (6.7,
// include/uapi/linux/fs.h). The kernel checks them at run time.
constexpr std::uint64_t kUffdUserModeOnly = 1;
constexpr std::uint64_t kFeatureWpUnpopulated = 1u << 13;
constexpr std::uint64_t kFeatureWpAsync = 1u << 15;
struct PageRegion {
  std::uint64_t start, end, categories;
};
struct PmScanArg {
  std::uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
      category_anyof_mask, return_mask;
};
constexpr unsigned long kPagemapScan = _IOWR('f', 16, PmScanArg);
constexpr std::uint64_t kPageIsWritten = 1u << 1;
constexpr std::uint64_t kScanWpMatching = 1u << 0;
constexpr std::uint64_t kScanCheckWpAsync = 1u << 1;

}  // namespace

Result<WriteTracker> WriteTracker::start(const GuestRam& ram) {
  WriteTracker t;
  t.ram_ = &ram;
  const long fd = ::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | kUffdUserModeOnly);
  if (fd < 0)
    return make_error(Errc::not_supported,
                      fmt::format("userfaultfd is unavailable ({}); the driver's writes to guest RAM cannot be "
                                  "tracked for migration (needs Linux >= 6.7 with CONFIG_USERFAULTFD)",
                                  std::strerror(errno)));
  t.uffd_ = UniqueFd(static_cast<int>(fd));
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = kFeatureWpAsync | kFeatureWpUnpopulated | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
  if (::ioctl(t.uffd_.get(), UFFDIO_API, &api) != 0 || (api.features & kFeatureWpAsync) == 0)
    return make_error(Errc::not_supported,
                      "the kernel lacks asynchronous userfaultfd write protection on shared memory; the driver's "
                      "writes to guest RAM cannot be tracked for migration (needs Linux >= 6.7)");
  for (const auto& r : ram.layout()) {
    std::uint8_t* p = ram.host(r.gpa, r.size);
    if (p == nullptr) return make_error(Errc::invalid_argument, "guest RAM region is not mapped");
    uffdio_register reg{};
    reg.range = {reinterpret_cast<std::uint64_t>(p), r.size};
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    if (::ioctl(t.uffd_.get(), UFFDIO_REGISTER, &reg) != 0)
      return errno_error(errno, "registering guest RAM for userfaultfd write protection");
    uffdio_writeprotect wp{};
    wp.range = reg.range;
    wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
    if (::ioctl(t.uffd_.get(), UFFDIO_WRITEPROTECT, &wp) != 0)
      return errno_error(errno, "write-protecting guest RAM");
  }
  t.pagemap_ = UniqueFd(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  if (!t.pagemap_) return errno_error(errno, "opening /proc/self/pagemap");
  return t;
}

Status WriteTracker::take(std::vector<std::uint64_t>& pages) {
  if (ram_ == nullptr) return make_error(Errc::bad_state, "write tracker not started");
  PageRegion vec[256];
  for (const auto& r : ram_->layout()) {
    const auto base = reinterpret_cast<std::uint64_t>(ram_->host(r.gpa, r.size));
    std::uint64_t from = base;
    const std::uint64_t end = base + r.size;
    while (from < end) {
      PmScanArg a{};
      a.size = sizeof a;
      a.flags = kScanWpMatching | kScanCheckWpAsync;
      a.start = from;
      a.end = end;
      a.vec = reinterpret_cast<std::uint64_t>(vec);
      a.vec_len = std::size(vec);
      a.category_mask = kPageIsWritten;
      a.return_mask = kPageIsWritten;
      const int n = ::ioctl(pagemap_.get(), kPagemapScan, &a);
      if (n < 0) return errno_error(errno, "PAGEMAP_SCAN of guest RAM");
      for (int i = 0; i < n; ++i)
        for (std::uint64_t p = vec[i].start; p < vec[i].end; p += kPage) pages.push_back((r.gpa + (p - base)) / kPage);
      if (a.walk_end <= from) return make_error(Errc::io_error, "PAGEMAP_SCAN made no progress over guest RAM");
      from = a.walk_end;
    }
  }
  return {};
}

Result<std::unique_ptr<LiveMigration>> LiveMigration::begin(Frontend& src, const GuestRam& src_ram,
                                                            GuestRam& dst_ram) {
  if (!src.protocol_features().has(ProtocolFeature::log_shmfd))
    return make_error(Errc::not_supported,
                      "the source backend did not ack LOG_SHMFD, so it cannot share a dirty log; it cannot be "
                      "migrated live");
  const auto& a = src_ram.layout();
  const auto& b = dst_ram.layout();
  bool same = a.size() == b.size();
  for (std::size_t i = 0; same && i < a.size(); ++i) same = a[i].gpa == b[i].gpa && a[i].size == b[i].size;
  if (!same)
    return make_error(Errc::invalid_argument,
                      "the destination RAM's layout differs from the source's; create it from the source layout");
  std::unique_ptr<LiveMigration> m(new LiveMigration());
  m->src_ = &src;
  m->src_ram_ = &src_ram;
  m->dst_ram_ = &dst_ram;
  std::uint64_t top = 0;
  for (const auto& r : a) top = std::max(top, r.gpa + r.size);
  // One bit per page up to the top of RAM, in whole 64-bit words (taken with one exchange each).
  m->log_bytes_ = (top / kPage + 63) / 64 * 8;
  const std::uint64_t map_bytes = (m->log_bytes_ + kPage - 1) / kPage * kPage;
  m->log_fd_ = UniqueFd(::memfd_create("vrdma-dirty-log", MFD_CLOEXEC));
  if (!m->log_fd_) return errno_error(errno, "memfd_create for the dirty log");
  if (::ftruncate(m->log_fd_.get(), static_cast<off_t>(map_bytes)) != 0) return errno_error(errno, "sizing the dirty log");
  void* p = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->log_fd_.get(), 0);
  if (p == MAP_FAILED) return errno_error(errno, "mapping the dirty log");
  m->log_map_ = MmapArea(p, map_bytes);
  // Track the driver before the backend starts logging: round 1 then copies everything, and every
  // write after it is in one of the two logs.
  auto t = WriteTracker::start(src_ram);
  if (!t) return std::move(t).error();
  m->tracker_ = std::move(*t);
  if (auto st = src.set_log_base(m->log_fd_.get(), m->log_bytes_); !st.ok())
    return prefixed("the source backend refused the dirty log (SET_LOG_BASE): ", st.error());
  VRDMA_TRY(m->set_logging(true));
  return m;
}

LiveMigration::~LiveMigration() = default;

Status LiveMigration::set_logging(bool on) {
  VirtioFeatures f = src_->features();
  if (on) f.set(VirtioFeature::log_all);
  else f.clear(VirtioFeature::log_all);
  if (auto st = src_->set_features(f); !st.ok())
    return prefixed(on ? "the source backend refused LOG_ALL: " : "the source backend refused LOG_ALL off: ",
                    st.error());
  if (!src_->protocol_features().has(ProtocolFeature::reply_ack)) {
    // No ack for SET_FEATURES: a request with a reply proves the backend has applied it (it
    // handles messages in order), as QEMU does after switching logging on.
    auto r = src_->request(make_request(Request::get_features));
    if (!r) return prefixed("waiting for the source backend to switch logging: ", r.error());
  }
  logging_ = on;
  return {};
}

Result<LiveMigration::Round> LiveMigration::round(bool all) {
  Round r;
  std::vector<std::uint64_t> pages;
  // The backend's log: each word exchanged with zero, so a bit set after the exchange stays for
  // the next round. The backend ORs single bytes atomically; x86 keeps the two coherent.
  auto* words = static_cast<std::uint64_t*>(log_map_.data());
  for (std::uint64_t w = 0; w < log_bytes_ / 8; ++w) {
    std::uint64_t v = std::atomic_ref<std::uint64_t>(words[w]).exchange(0, std::memory_order_acq_rel);
    while (v != 0) {
      const auto bit = static_cast<std::uint64_t>(__builtin_ctzll(v));
      v &= v - 1;
      const std::uint64_t page = w * 64 + bit;
      if (src_ram_->host(page * kPage, kPage) == nullptr) {
        ++r.outside;
        continue;
      }
      ++r.log_pages;
      pages.push_back(page);
    }
  }
  const std::size_t from_log = pages.size();
  VRDMA_TRY(tracker_.take(pages));
  r.driver_pages = pages.size() - from_log;
  if (all) {
    pages.clear();
    for (const auto& reg : src_ram_->layout())
      for (std::uint64_t off = 0; off < reg.size; off += kPage) pages.push_back((reg.gpa + off) / kPage);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  for (const std::uint64_t page : pages) {
    const std::uint8_t* s = src_ram_->host(page * kPage, kPage);
    std::uint8_t* d = dst_ram_->host(page * kPage, kPage);
    if (s == nullptr || d == nullptr)
      return make_error(Errc::bad_state, fmt::format("page {:#x} is in no RAM region of both sides", page * kPage));
    std::memcpy(d, s, kPage);
  }
  r.copied = pages.size();
  rounds_.push_back(r);
  return r;
}

Result<LiveMigration::Round> LiveMigration::precopy() {
  if (!logging_) return make_error(Errc::bad_state, "migration was cancelled or already stopped the source");
  const bool all = first_;
  first_ = false;
  return round(all);
}

Result<std::vector<std::uint32_t>> LiveMigration::stop_and_copy(std::uint16_t num_queues) {
  if (!logging_) return make_error(Errc::bad_state, "migration was cancelled or already stopped the source");
  std::vector<std::uint32_t> bases;
  for (std::uint16_t q = 0; q < num_queues; ++q) {
    auto b = src_->get_vring_base(q);
    if (!b) return prefixed(fmt::format("stopping queue {} on the source (GET_VRING_BASE): ", q), b.error());
    bases.push_back(*b);
  }
  // The source writes nothing more: what the logs hold now is the last of it.
  const bool all = first_;
  first_ = false;
  auto r = round(all);
  if (!r) return std::move(r).error();
  logging_ = false;
  return bases;
}

Status LiveMigration::cancel() {
  if (!logging_) return {};
  return set_logging(false);
}

}  // namespace vrdma::vhost
