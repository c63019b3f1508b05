// Memory regions over guest pages, in place. A region whose pages are contiguous in one guest
// memory region is registered straight over that mapping; scattered pages are mapped a second
// time, contiguously, from the guest memory fds (the same physical pages, never a copy), so
// every engine — soft or a NIC through ibv_reg_mr — sees one virtually contiguous range.
#include <sys/mman.h>

#include <fmt/format.h>

#include "vrdma/device/model.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/vhost/write_journal.hpp"

namespace vrdma::device {

void MrObserver::on_write(std::uint64_t addr, std::uint64_t len) noexcept {
  auto log = log_->log.load(std::memory_order_acquire);
  if ((!log && !vhost::journal::enabled()) || len == 0) return;
  const auto base = reinterpret_cast<std::uint64_t>(base_);
  if (addr < base) return;
  std::uint64_t off = off0_ + (addr - base);  // offset from the start of pages_[0]
  const std::uint64_t psize = std::uint64_t{1} << shift_;
  while (len > 0) {
    const std::uint64_t page = off >> shift_;
    if (page >= pages_.size()) return;
    const std::uint64_t in = off & (psize - 1);
    const std::uint64_t n = std::min(len, psize - in);
    const bool logged = log && log->mark(pages_[page] + in, n);
    vhost::journal::write(pages_[page] + in, n, vhost::journal::Source::engine, log != nullptr, logged);
    off += n;
    len -= n;
  }
}

void RegionObserver::on_write(std::uint64_t addr, std::uint64_t len) noexcept {
  auto log = log_->log.load(std::memory_order_acquire);
  if ((!log && !vhost::journal::enabled()) || len == 0 || addr < base_ || addr - base_ >= size_) return;
  const std::uint64_t gpa = gpa_ + (addr - base_);
  len = std::min(len, size_ - (addr - base_));
  const bool logged = log && log->mark(gpa, len);
  vhost::journal::write(gpa, len, vhost::journal::Source::engine, log != nullptr, logged);
}

Status DeviceModel::map_dma_mr(const vhost::GuestView& g, DmaMrObj& mr, bool keep_name) {
  mr.parts.clear();  // their keys go back to the engine before they are asked for again
  auto pit = pds.find(mr.pd);
  if (pit == pds.end()) return make_error(Errc::not_found, fmt::format("no PD {}", mr.pd));
  const auto& regions = g.memory().regions();
  if (regions.empty()) return make_error(Errc::bad_state, "the guest has no memory table yet");
  std::vector<DmaMrObj::Part> parts;
  for (const auto& reg : regions) {
    nicdrv::MrOptions mo;
    mo.iova = reg->gpa();
    if (engine_reports_writes) mo.observer = std::make_shared<RegionObserver>(log, reg->host(), reg->gpa(), reg->size());
    if (keep_name && parts.empty() && !engine_rebuilds()) mo.requested_key = mr.guest_lkey;
    auto eng = pit->second.eng->reg_mr(reg->host(), reg->size(), static_cast<nicdrv::Access>(mr.access), mo);
    if (!eng)
      return vhost::prefixed(fmt::format("registering guest memory [{:#x}, +{:#x}) for a DMA memory region: ", reg->gpa(),
                                  reg->size()),
                      eng.error());
    parts.push_back({reg->gpa(), reg->size(), reg, std::move(*eng)});
  }
  const auto first = parts.front().eng->lkey();
  if (!keep_name) {
    // After a move onto a NIC, a key it hands out may be a moved region's name in the guest.
    if (guest_name_taken(first, false))
      return make_error(Errc::busy, fmt::format("the NIC handed out memory key {:#x}, which the guest already uses "
                                                "for a region that moved here; try again", first));
    mr.guest_lkey = first;
  }
  mr.parts = std::move(parts);
  // The guest's name stays reserved while the engine calls the region otherwise (a NIC).
  if (first != mr.guest_lkey)
    lkey_to_engine[mr.guest_lkey] = first;
  else
    lkey_to_engine.erase(mr.guest_lkey);
  return {};
}

std::uint32_t DeviceModel::dma_engine_lkey(const DmaMrObj& mr, std::uint64_t addr) const {
  if (mr.parts.empty()) return mr.guest_lkey;  // the memory table could not be registered: refused
  for (const auto& p : mr.parts)
    if (addr >= p.gpa && addr - p.gpa < p.size) return p.eng->lkey();
  // Outside guest memory: the first part's key, whose bounds the engine checks (a local
  // protection error).
  return mr.parts.front().eng->lkey();
}

Result<MrObj> DeviceModel::map_mr(const vhost::GuestView& g, const vd::RegMrReq& r,
                                      const std::vector<std::uint64_t>* saved_pages) {
  const auto& lim = opts.limits;
  if (r.page_shift < 12 || r.page_shift > 30)
    return make_error(Errc::invalid_argument, fmt::format("page_shift {} is outside 12..30", r.page_shift));
  if (r.length == 0) return make_error(Errc::invalid_argument, "a memory region of 0 bytes");
  if (r.iova + r.length < r.iova) return make_error(Errc::invalid_argument, "iova + length wraps the address space");
  if ((r.access & ~0xfu) != 0) return make_error(Errc::invalid_argument, fmt::format("unknown access bits {:#x}", r.access));
  if (r.npages == 0 || r.npages > lim.max_mr_pages)
    return make_error(Errc::limit_exceeded, fmt::format("{} pages is outside 1..{} (the device's max_mr_pages)", r.npages,
                                                       lim.max_mr_pages));
  const std::uint64_t psize = std::uint64_t{1} << r.page_shift;
  const std::uint64_t off0 = r.iova & (psize - 1);
  if (std::uint64_t{r.npages} * psize < off0 + r.length)
    return make_error(Errc::invalid_argument,
                      fmt::format("{} pages of {} bytes cannot hold {} bytes starting {} bytes into the first page",
                                  r.npages, psize, r.length, off0));
  if (std::uint64_t{r.npages} * psize > off0 + r.length + psize)
    return make_error(Errc::invalid_argument, fmt::format("the page list has more pages ({}) than {} bytes need",
                                                         r.npages, r.length));
  std::vector<std::uint64_t> pages;
  if (saved_pages != nullptr) {
    if (saved_pages->size() != r.npages) return make_error(Errc::invalid_argument, "page list length mismatch");
    pages = *saved_pages;
  } else {
    pages.resize(r.npages);
    VRDMA_TRY(g.read(r.pages_gpa, pages.data(), pages.size() * sizeof(std::uint64_t)));
  }

  // Every page: aligned and wholly inside one mapped region. Group pages into runs that are
  // contiguous in one region.
  struct Run {
    std::size_t first, count;
    const vhost::MappedRegion* region;
    std::uint64_t gpa;
  };
  std::vector<Run> runs;
  std::vector<std::shared_ptr<const vhost::MappedRegion>> keep;
  const auto& regions = g.memory().regions();
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const std::uint64_t p = pages[i];
    if (p % psize != 0) return make_error(Errc::invalid_argument, fmt::format("page {} at {:#x} is not {}-aligned", i, p, psize));
    const vhost::MappedRegion* reg = nullptr;
    for (const auto& rr : regions)
      if (p >= rr->gpa() && p - rr->gpa() < rr->size() && rr->size() - (p - rr->gpa()) >= psize) {
        reg = rr.get();
        if (keep.empty() || keep.back().get() != reg) keep.push_back(rr);
        break;
      }
    if (reg == nullptr)
      return make_error(Errc::invalid_argument, fmt::format("page {} [{:#x}, +{:#x}) is not inside guest memory", i, p, psize));
    if (!runs.empty() && runs.back().region == reg && runs.back().gpa + runs.back().count * psize == p)
      ++runs.back().count;
    else
      runs.push_back({i, 1, reg, p});
  }

  MrObj mr;
  const std::uint64_t total = std::uint64_t{r.npages} * psize;
  if (runs.size() > 1) {
    if (total > (std::uint64_t{1} << 46)) return make_error(Errc::limit_exceeded, "memory region too large to map");
    void* win = ::mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (win == MAP_FAILED) return errno_error(errno, "reserving address space for a memory region");
    mr.window = MmapArea(win, total);
    for (const auto& run : runs) {
      if (run.region->fd() < 0)
        return make_error(Errc::not_supported, "guest memory region has no fd to map a scattered memory region from");
      auto* at = static_cast<std::uint8_t*>(win) + run.first * psize;
      const auto fd_off = run.region->fd_offset() + (run.gpa - run.region->gpa());
      void* p = ::mmap(at, run.count * psize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, run.region->fd(),
                       static_cast<off_t>(fd_off));
      if (p == MAP_FAILED) return errno_error(errno, "mapping guest pages for a memory region");
    }
    // The engine's thread reads and writes through this alias: a guest file shrunk under it
    // fails the device like a fault in the guest memory mapping itself.
    mr.window_guard = vhost::GuardedMapping(win, total, "an RDMA memory region's mapping", runs.front().region->fault_sink());
  }
  for (auto& k : keep) mr.regions.push_back(std::move(k));
  const std::uint8_t* base = nullptr;
  if (mr.window.data() != nullptr) {
    base = static_cast<const std::uint8_t*>(mr.window.data());
  } else {
    auto span = g.memory().at(pages[0]);
    if (!span) return span.error();
    base = span->ptr;
  }
  // The engine reports host addresses; base + off0 is the region's first byte as it sees it.
  mr.observer = std::make_shared<MrObserver>(log, base + off0, off0, r.page_shift, std::move(pages));
  return mr;
}

Status DeviceModel::register_mr(const vhost::GuestView& g, const vd::RegMrReq& r, std::uint32_t requested_key,
                                     MrObj& out, const std::vector<std::uint64_t>* saved_pages) {
  auto pit = pds.find(r.pd);
  if (pit == pds.end()) return make_error(Errc::not_found, fmt::format("no PD {}", r.pd));
  auto mr = map_mr(g, r, saved_pages);
  if (!mr) return std::move(mr).error();
  nicdrv::MrOptions mo;
  if (engine_reports_writes) mo.observer = mr->observer;  // a NIC's DMA: mark_dma_writable()
  mo.iova = r.iova;
  mo.requested_key = requested_key;
  const auto off0 = r.iova & ((std::uint64_t{1} << r.page_shift) - 1);
  std::uint8_t* base = static_cast<std::uint8_t*>(mr->window.data());
  if (base == nullptr) {
    auto span = g.memory().at(mr->observer->pages()[0]);
    if (!span) return std::move(span).error();
    base = span->ptr;
  }
  auto eng = pit->second.eng->reg_mr(base + off0, r.length, static_cast<nicdrv::Access>(r.access), mo);
  if (!eng) return std::move(eng).error();
  mr->eng = std::move(*eng);
  mr->pd = r.pd;
  mr->page_shift = r.page_shift;
  mr->iova = r.iova;
  mr->length = r.length;
  mr->access = r.access;
  out = std::move(*mr);
  return {};
}

}  // namespace vrdma::device
