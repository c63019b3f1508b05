// Memory regions over guest pages, in place. A region whose pages are contiguous in one guest
// memory region is registered straight over that mapping; scattered pages are mapped a second
// time, contiguously, from the guest memory fds (the same physical pages, never a copy), so
// every engine — soft or a NIC through ibv_reg_mr — sees one virtually contiguous range.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <span>

#include <fmt/format.h>

#include "vrdma/device/model.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/vhost/write_journal.hpp"

namespace vrdma::device {

void MrObserver::mark(std::uint64_t addr, std::uint64_t len) const noexcept {
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

namespace {

// The layout is one the device can map: pages of 4 KiB .. 1 << max_shift, 1..max_pages of them
// (`limit` names that bound), exactly as many as hold `length` bytes from iova's offset in the
// first, known access bits.
Status check_layout(const PageLayout& l, std::uint32_t max_pages, std::uint32_t max_shift, std::string_view limit) {
  if (l.page_shift < 12 || l.page_shift > max_shift)
    return make_error(Errc::invalid_argument, fmt::format("page_shift {} is outside 12..{}", l.page_shift, max_shift));
  if (l.length == 0) return make_error(Errc::invalid_argument, "a memory region of 0 bytes");
  if (l.iova + l.length < l.iova) return make_error(Errc::invalid_argument, "iova + length wraps the address space");
  if ((l.access & ~0xfu) != 0) return make_error(Errc::invalid_argument, fmt::format("unknown access bits {:#x}", l.access));
  if (l.npages == 0 || l.npages > max_pages)
    return make_error(Errc::limit_exceeded, fmt::format("{} pages is outside 1..{} ({})", l.npages, max_pages, limit));
  const std::uint64_t psize = std::uint64_t{1} << l.page_shift;
  const std::uint64_t off0 = l.iova & (psize - 1);
  if (std::uint64_t{l.npages} * psize < off0 + l.length)
    return make_error(Errc::invalid_argument,
                      fmt::format("{} pages of {} bytes cannot hold {} bytes starting {} bytes into the first page",
                                  l.npages, psize, l.length, off0));
  if (std::uint64_t{l.npages} * psize > off0 + l.length + psize)
    return make_error(Errc::invalid_argument, fmt::format("the page list has more pages ({}) than {} bytes need",
                                                         l.npages, l.length));
  return {};
}

// Pages of a registration grouped into runs contiguous in one guest memory region.
struct PageRuns {
  struct Run {
    std::size_t first, count;
    const vhost::MappedRegion* region;
    std::uint64_t gpa;
  };
  std::vector<Run> runs;
  std::vector<std::shared_ptr<const vhost::MappedRegion>> keep;  // the regions the runs are in
};

// Every page: aligned and wholly inside one mapped region.
Result<PageRuns> runs_of(const vhost::GuestView& g, std::span<const std::uint64_t> pages, std::uint64_t psize) {
  PageRuns out;
  const auto& regions = g.memory().regions();
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const std::uint64_t p = pages[i];
    if (p % psize != 0) return make_error(Errc::invalid_argument, fmt::format("page {} at {:#x} is not {}-aligned", i, p, psize));
    const vhost::MappedRegion* reg = nullptr;
    for (const auto& rr : regions)
      if (p >= rr->gpa() && p - rr->gpa() < rr->size() && rr->size() - (p - rr->gpa()) >= psize) {
        reg = rr.get();
        if (out.keep.empty() || out.keep.back().get() != reg) out.keep.push_back(rr);
        break;
      }
    if (reg == nullptr)
      return make_error(Errc::invalid_argument, fmt::format("page {} [{:#x}, +{:#x}) is not inside guest memory", i, p, psize));
    if (!out.runs.empty() && out.runs.back().region == reg && out.runs.back().gpa + out.runs.back().count * psize == p)
      ++out.runs.back().count;
    else
      out.runs.push_back({i, 1, reg, p});
  }
  return out;
}

// The runs mapped one after the other at `win` (reserved for all their pages) from the guest
// memory fds: the same physical pages, never a copy.
Status map_runs(const PageRuns& pr, void* win, std::uint64_t psize) {
  for (const auto& run : pr.runs) {
    if (run.region->fd() < 0)
      return make_error(Errc::not_supported, "guest memory region has no fd to map a scattered memory region from");
    auto* at = static_cast<std::uint8_t*>(win) + run.first * psize;
    const auto fd_off = run.region->fd_offset() + (run.gpa - run.region->gpa());
    void* p = ::mmap(at, run.count * psize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, run.region->fd(),
                     static_cast<off_t>(fd_off));
    if (p == MAP_FAILED) return errno_error(errno, "mapping guest pages for a memory region");
  }
  return {};
}

}  // namespace

Result<MrObj> DeviceModel::map_mr(const vhost::GuestView& g, const vd::RegMrReq& r,
                                      const std::vector<std::uint64_t>* saved_pages) {
  VRDMA_TRY(check_layout({r.iova, r.length, r.npages, r.page_shift, r.access}, opts.limits.max_mr_pages, 30,
                         "the device's max_mr_pages"));
  const std::uint64_t psize = std::uint64_t{1} << r.page_shift;
  const std::uint64_t off0 = r.iova & (psize - 1);
  std::vector<std::uint64_t> pages;
  if (saved_pages != nullptr) {
    if (saved_pages->size() != r.npages) return make_error(Errc::invalid_argument, "page list length mismatch");
    pages = *saved_pages;
  } else {
    pages.resize(r.npages);
    VRDMA_TRY(g.read(r.pages_gpa, pages.data(), pages.size() * sizeof(std::uint64_t)));
  }
  auto runs = runs_of(g, pages, psize);
  if (!runs) return std::move(runs).error();

  MrObj mr;
  const std::uint64_t total = std::uint64_t{r.npages} * psize;
  if (runs->runs.size() > 1) {
    if (total > (std::uint64_t{1} << 46)) return make_error(Errc::limit_exceeded, "memory region too large to map");
    void* win = ::mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (win == MAP_FAILED) return errno_error(errno, "reserving address space for a memory region");
    mr.window = MmapArea(win, total);
    VRDMA_TRY(map_runs(*runs, win, psize));
    // The engine's thread reads and writes through this alias: a guest file shrunk under it
    // fails the device like a fault in the guest memory mapping itself.
    mr.window_guard = vhost::GuardedMapping(win, total, "an RDMA memory region's mapping", runs->runs.front().region->fault_sink());
  }
  auto& keep = runs->keep;
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

Result<FastMrObj> DeviceModel::new_fast_mr(std::uint32_t pd, std::uint32_t max_pages) {
  if (pds.count(pd) == 0) return make_error(Errc::not_found, fmt::format("no PD {}", pd));
  if (fast_mrs_allowed() == 0)
    return make_error(Errc::not_supported, "this device has no fast registration (its engine cannot give a region "
                                           "new pages by a work request); register memory with REG_MR");
  if (max_pages == 0 || max_pages > fast_mrs_allowed())
    return make_error(Errc::invalid_argument, fmt::format("a fast region of {} pages: the device allows 1..{} "
                                                          "(max_fast_reg_pages)", max_pages, fast_mrs_allowed()));
  // Address space only (PROT_NONE, no memory behind it) until a REG_MR maps scattered pages.
  const std::size_t span = std::size_t{max_pages} << vd::kFastRegMaxPageShift;
  if (fast_window_bytes + span > kMaxFastWindowBytes)
    return make_error(Errc::limit_exceeded, fmt::format("the guest's fast regions already hold {} GiB of the backend's "
                                                        "address space, the most it gives them is {} GiB; deregister "
                                                        "some", fast_window_bytes >> 30, kMaxFastWindowBytes >> 30));
  FastMrObj mr;
  mr.pd = pd;
  mr.max_pages = max_pages;
  void* win = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (win == MAP_FAILED)
    return errno_error(errno, fmt::format("reserving {} MiB of address space for a fast-registration region", span >> 20));
  mr.window = MmapArea(win, span);
  return mr;
}

Result<std::uint8_t*> DeviceModel::map_fast(const vhost::GuestView& g, FastMrObj& mr, const PageLayout& l,
                                            std::vector<std::uint64_t> pages) {
  VRDMA_TRY(check_layout(l, mr.max_pages, vd::kFastRegMaxPageShift, "the max_pages the region was allocated with"));
  if (pages.size() != l.npages) return make_error(Errc::invalid_argument, "page list length mismatch");
  const std::uint64_t psize = std::uint64_t{1} << l.page_shift;
  auto runs = runs_of(g, pages, psize);
  if (!runs) return std::move(runs).error();
  std::uint8_t* base = nullptr;
  if (runs->runs.size() == 1) {
    auto span = g.memory().at(pages[0]);
    if (!span) return std::move(span).error();
    base = span->ptr;
  } else {
    // The window holds max_pages pages of the largest page size: these fit (checked above).
    base = static_cast<std::uint8_t*>(mr.window.data());
    VRDMA_TRY(map_runs(*runs, base, psize));
    if (!mr.window_guard.active())
      mr.window_guard = vhost::GuardedMapping(base, mr.window.size(), "a fast-registration region's mapping",
                                              runs->runs.front().region->fault_sink());
  }
  for (auto& k : runs->keep)
    if (std::find(mr.regions.begin(), mr.regions.end(), k) == mr.regions.end()) mr.regions.push_back(std::move(k));
  const std::uint64_t off0 = l.iova & (psize - 1);
  mr.observer->set(std::make_shared<const MrObserver>(log, base + off0, off0, l.page_shift, std::move(pages)));
  mr.last = l;
  return base + off0;
}

Status DeviceModel::fast_register(const vhost::GuestView& g, std::uint32_t pd, const vd::RegMrWqe& w,
                                  nicdrv::SendWr& wr) {
  auto it = fast_mrs.find(w.mr);
  if (it == fast_mrs.end() || it->second.pd != pd)
    return make_error(Errc::invalid_argument,
                      fmt::format("MR {} is no region for fast registration (ALLOC_MR) in the QP's PD {}", w.mr, pd));
  auto& mr = it->second;
  if (w.num_sge != 0 || (w.flags & ~(vd::kSendFence | vd::kSendSignaled)) != 0)
    return make_error(Errc::invalid_argument, fmt::format("a REG_MR WQE carries no SGEs, inline data or address vector "
                                                          "(num_sge {}, flags {:#x})", w.num_sge, w.flags));
  const PageLayout l{w.iova, w.length, w.npages, w.page_shift, w.access};
  VRDMA_TRY(check_layout(l, mr.max_pages, vd::kFastRegMaxPageShift, "the max_pages the region was allocated with"));
  std::vector<std::uint64_t> pages(w.npages);
  VRDMA_TRY(g.read(w.pages_gpa, pages.data(), pages.size() * sizeof(std::uint64_t)));
  auto first = map_fast(g, mr, l, std::move(pages));
  if (!first) return std::move(first).error();
  wr.reg.mr = mr.eng.get();
  wr.reg.addr = *first;
  wr.reg.iova = w.iova;
  wr.reg.length = w.length;
  wr.reg.page_shift = static_cast<std::uint8_t>(w.page_shift);
  wr.reg.access = static_cast<nicdrv::Access>(w.access);
  wr.reg.key = w.key;
  return {};
}

}  // namespace vrdma::device
