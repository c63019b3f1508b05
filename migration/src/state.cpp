// Device state for migration: every object with its handle, keys and QPN, ring positions, each
// QP's engine state, and completions the engine produced that are not yet in the guest's rings.
// Saved with the rings stopped (engine quiesced); loaded into an empty device over the guest's
// memory, where every field is checked as the commands check it (the blob comes from the
// frontend: QEMU's migration stream or a libpvverbs process).
#include <chrono>
#include <cstddef>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>

#include "device_state_impl.hpp"
#include "vrdma/common/bytes.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::migration {
namespace {

constexpr std::uint32_t kMagic = 0x53445256;        // "VRDS"


struct SavedRing {
  std::uint64_t gpa;
  std::uint32_t depth, stride, consumed, produced;
};
SavedRing save_ring(const WorkRing& r) { return {r.gpa, r.depth, r.stride, r.consumed, r.produced}; }

Error bad(const std::string& what) {
  return make_error(Errc::invalid_argument, "device state rejected: " + what);
}

}  // namespace

Result<std::vector<std::uint8_t>> DeviceState::Impl::save_state() {
  if (!d.paused && !(d.pds.empty() && d.cqs.empty()))
    return make_error(Errc::bad_state, "the device state can be saved only after its rings are stopped (GET_VRING_BASE)");
  // On a NIC the QPs are drained and stopped first (rebuild.cpp); a second save reuses that.
  if (d.engine_rebuilds() && stopped_for_rebuild.empty())
    if (auto s = stop_for_rebuild(); !s.ok()) return s.error();
  ByteWriter w;
  w.put(kMagic, DeviceState::kStateVersion, d.next_handle_, static_cast<std::uint32_t>(d.pds.size()));
  for (const auto& [h, pd] : d.pds) w.put(h);
  w.put(static_cast<std::uint32_t>(d.mrs.size()));
  for (const auto& [h, mr] : d.mrs) {
    const auto& pages = mr.observer->pages();
    w.put(h, mr.pd, mr.access, mr.page_shift, mr.iova, mr.length, mr.guest_lkey, mr.guest_rkey,
          static_cast<std::uint32_t>(pages.size()));
    for (auto p : pages) w.put(p);
  }
  w.put(static_cast<std::uint32_t>(d.cqs.size()));
  for (auto& [h, cq] : d.cqs) {
    // Completions still in the engine travel in the blob.
    std::array<nicdrv::WorkCompletion, 64> wcs;
    for (;;) {
      auto n = cq.eng->poll(wcs);
      if (!n) return make_error(Errc::io_error, fmt::format("CQ {}: {}", h, n.error().message));
      for (std::size_t i = 0; i < *n; ++i) {
        // qp_of_completion counts a receive's (a re-point after the load re-posts the others).
        cq.backlog.push_back(d.guest_cqe(wcs[i], d.qp_of_completion(wcs[i])));
      }
      if (*n < wcs.size()) break;
    }
    w.put(h, cq.depth, cq.ring_gpa, cq.produced, static_cast<std::uint8_t>(cq.armed),
          static_cast<std::uint8_t>(cq.solicited_only), static_cast<std::uint32_t>(cq.backlog.size()));
    for (const auto& c : cq.backlog) w.put(c);
  }
  w.put(static_cast<std::uint32_t>(d.ahs.size()));
  for (const auto& [h, ah] : d.ahs) {
    w.put(h, ah.pd, ah.wire);
  }
  // Version 6: the SRQs, before the QPs made on them.
  w.put(static_cast<std::uint32_t>(d.srqs.size()));
  for (const auto& [h, s] : d.srqs) {
    // A soft engine's SRQ exports its receives; a NIC's cannot, the device kept them (rebuild.cpp).
    auto blob = d.engine_rebuilds() ? srq_record(s) : s.eng->export_state();
    if (!blob) return make_error(Errc::io_error, fmt::format("SRQ {}: {}", h, blob.error().message));
    w.put(h, s.pd, s.max_sge, save_ring(s.ring), s.status_gpa);
    w.bytes(*blob);
  }
  w.put(static_cast<std::uint32_t>(d.qps.size()));
  for (const auto& [h, qp] : d.qps) {
    auto blob = d.engine_rebuilds() ? rebuild_record(h, qp) : qp.eng->export_state();
    if (!blob) return make_error(blob.error().code == make_error_code(Errc::not_supported) ? Errc::not_supported : Errc::io_error,
                                 fmt::format("QP {}: {}", h, blob.error().message));
    w.put(h, qp.pd, qp.send_cq, qp.recv_cq, static_cast<std::uint8_t>(qp.type),
          static_cast<std::uint8_t>(qp.sq_sig_all), static_cast<std::uint8_t>(qp.fatal_reported), qp.max_send_sge,
          qp.max_recv_sge, qp.max_inline, save_ring(qp.sq), save_ring(qp.rq), qp.status_gpa, qp.guest_qpn, qp.srq);
    w.bytes(*blob);
  }
  // Version 2: beside a soft engine's QP state, what the device keeps of its own (a NIC's
  // records carry it).
  const std::uint32_t extras = d.engine_rebuilds() ? 0 : static_cast<std::uint32_t>(d.qps.size());
  w.put(extras);
  if (extras != 0)
    for (const auto& [h, qp] : d.qps) {
      w.put(h, qp.rq_done, qp.guest_dest_qpn, static_cast<std::uint32_t>(qp.remote_rkeys.size()));
      for (const auto& [guest, nic] : qp.remote_rkeys) {
        w.put(guest, nic);
      }
    }
  // Version 3: the DMA memory regions.
  w.put(static_cast<std::uint32_t>(d.dma_mrs.size()));
  for (const auto& [h, mr] : d.dma_mrs) {
    w.put(h, mr.pd, mr.access, mr.guest_lkey);
  }
  // Version 4: the fast-registration regions: their key and, while valid, their registration
  // (the engine's state is final with the rings stopped; the pages are the device's last REG_MR's).
  w.put(static_cast<std::uint32_t>(d.fast_mrs.size()));
  for (const auto& [h, mr] : d.fast_mrs) {
    const auto layout = mr.observer->layout();
    bool registered = mr.eng->valid();
    if (registered && (layout == nullptr || mr.last.iova != mr.eng->addr() || mr.last.length != mr.eng->length())) {
      // A REG_MR the engine refused when it ran left the region on other pages than the
      // device mapped last: those pages are not known here.
      log::warn("virtio-rdma: fast region {} (key {:#x}) is registered over pages the device no longer knows; it moves "
                "invalid", h, mr.eng->lkey());
      registered = false;
    }
    w.put(h, mr.pd, mr.max_pages, mr.eng->lkey(), static_cast<std::uint8_t>(registered ? 1 : 0));
    if (!registered) continue;
    const auto& pages = layout->pages();
    w.put(mr.last.iova, mr.last.length, static_cast<std::uint32_t>(mr.eng->access()), mr.last.page_shift,
          static_cast<std::uint32_t>(pages.size()));
    for (auto p : pages) w.put(p);
  }
  // Version 5: the doorbell rings, and the CQs and QPs made with each; version 6: the SRQs too.
  w.put(static_cast<std::uint32_t>(d.db_rings.size()));
  for (const auto& [n, ring] : d.db_rings) w.put(n, ring.gpa, ring.depth, ring.consumed);
  auto put_tags = [&w](const auto& objects) {
    std::uint32_t tagged = 0;
    for (const auto& [h, o] : objects) tagged += o.db_ring != 0 ? 1 : 0;
    w.put(tagged);
    for (const auto& [h, o] : objects)
      if (o.db_ring != 0) w.put(h, o.db_ring);
  };
  put_tags(d.cqs);
  put_tags(d.qps);
  put_tags(d.srqs);
  log::info("virtio-rdma: device state saved: {} PDs, {} MRs, {} CQs, {} AHs, {} SRQs, {} QPs, {} bytes", d.pds.size(),
            d.mr_count(), d.cqs.size(), d.ahs.size(), d.srqs.size(), d.qps.size(), w.out.size());
  return std::move(w.out);
}

Status DeviceState::Impl::load_state(std::span<const std::uint8_t> blob) {
  if (!d.pds.empty() || !d.cqs.empty() || !d.qps.empty())
    return make_error(Errc::bad_state, "device state can be loaded only into a device with no objects");
  if (d.host == nullptr) return make_error(Errc::bad_state, "device state arrived without a frontend session");
  const GuestView g = d.view();
  const auto& lim = d.opts.limits;
  ByteReader r(blob);
  std::uint32_t magic = 0, version = 0, next = 0, n = 0;
  if (!r.get(magic) || magic != kMagic) return bad("not a virtio RDMA device state (magic)");
  if (!r.get(version) || !DeviceState::state_version_readable(version))
    return bad(fmt::format("version {} (this vrdmad reads versions {} to {})", version, DeviceState::kOldestStateVersion,
                           DeviceState::kStateVersion));
  if (!r.get(next)) return bad("truncated");
  // Loading happens with the engine quiesced: nothing moves until every ring runs.
  d.pause();
  adopted = 0;
  auto fail = [this](Error e) {
    pre.clear();
    d.reset();
    return e;
  };
  std::uint32_t max_handle = 0;
  auto fresh = [&](std::uint32_t h, bool taken) {
    max_handle = std::max(max_handle, h);
    return h != vd::kNoHandle && !taken;
  };
  if (!r.get(n) || n > lim.max_pd) return fail(bad("PD count"));
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t h = 0;
    if (!r.get(h) || !fresh(h, d.pds.count(h) != 0)) return fail(bad("PD handle"));
    if (auto it = pre.pds.find(h); it != pre.pds.end()) {
      d.pds[h] = PdObj{std::move(it->second), 0, {}};
      pre.pds.erase(it);
      ++adopted;
      continue;
    }
    auto pd = d.engine->alloc_pd();
    if (!pd) return fail(pd.error());
    d.pds[h] = PdObj{std::move(*pd), 0, {}};
  }
  using SteadyClock = std::chrono::steady_clock;
  const auto ms_since = [](SteadyClock::time_point t) {
    return std::chrono::duration<double, std::milli>(SteadyClock::now() - t).count();
  };
  auto t = SteadyClock::now();
  double mr_ms = 0, cq_ms = 0, qp_ms = 0;
  if (!r.get(n) || n > lim.max_mr) return fail(bad("MR count"));
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t h = 0, lkey = 0, rkey = 0, npages = 0;
    vd::RegMrReq q{};
    if (!r.get(h) || !r.get(q.pd) || !r.get(q.access) || !r.get(q.page_shift) || !r.get(q.iova) || !r.get(q.length) ||
        !r.get(lkey) || !r.get(rkey) || !r.get(npages))
      return fail(bad("truncated MR"));
    if (!fresh(h, d.mrs.count(h) != 0) || npages > lim.max_mr_pages || (lkey != rkey && rkey != 0))
      return fail(bad(fmt::format("MR {} (pages {}, lkey {:#x}, rkey {:#x})", h, npages, lkey, rkey)));
    std::vector<std::uint64_t> pages(npages);
    for (auto& p : pages)
      if (!r.get(p)) return fail(bad("truncated page list"));
    q.npages = npages;
    if (d.st.registered_bytes + q.length > lim.max_registered_bytes) return fail(bad("registered bytes over the limit"));
    MrObj mr;
    // A NIC picks the keys itself: the guest's stay, translated (rebuild.cpp).
    if (auto s = d.register_mr(g, q, d.engine_rebuilds() ? 0 : lkey, mr, &pages); !s.ok())
      return fail(prefixed(fmt::format("MR {}: ", h), s.error()));
    if (!d.engine_rebuilds() && mr.eng->lkey() != lkey)
      return fail(make_error(Errc::not_supported, "the engine cannot keep the MR's key"));
    mr.guest_lkey = lkey;
    mr.guest_rkey = rkey;
    if (mr.eng->lkey() != lkey) d.lkey_to_engine[lkey] = mr.eng->lkey();
    if (rkey != 0 && mr.eng->rkey() != rkey) d.rkey_to_engine[rkey] = mr.eng->rkey();
    d.st.registered_bytes += q.length;
    ++d.pds[q.pd].users;
    d.mrs.emplace(h, std::move(mr));
  }
  mr_ms = ms_since(t);
  t = SteadyClock::now();
  if (!r.get(n) || n > lim.max_cq) return fail(bad("CQ count"));
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t h = 0, depth = 0, produced = 0, backlog = 0;
    std::uint64_t ring = 0;
    std::uint8_t armed = 0, sol = 0;
    if (!r.get(h) || !r.get(depth) || !r.get(ring) || !r.get(produced) || !r.get(armed) || !r.get(sol) || !r.get(backlog))
      return fail(bad("truncated CQ"));
    if (!fresh(h, d.cqs.count(h) != 0) || depth == 0 || (depth & (depth - 1)) != 0 || depth > lim.max_cqe ||
        backlog > lim.max_cqe || ring % 4096 != 0 ||
        !g.memory().range(ring, vd::kCqeOffset + std::uint64_t{depth} * sizeof(vd::Cqe)))
      return fail(bad(fmt::format("CQ {} (depth {}, ring {:#x})", h, depth, ring)));
    std::shared_ptr<nicdrv::CompletionQueue> made;
    if (auto it = pre.cqs.find(h); it != pre.cqs.end()) {
      if (it->second.depth == depth) {
        made = std::move(it->second.eng);
        ++adopted;
      }
      pre.cqs.erase(it);
    }
    if (auto s = d.add_cq(g, h, depth, ring, false, std::move(made)); !s.ok()) return fail(s.error());
    auto& cq = d.cqs[h];
    cq.produced = produced;
    cq.armed = armed != 0;
    cq.solicited_only = sol != 0;
    for (std::uint32_t k = 0; k < backlog; ++k) {
      vd::Cqe c{};
      if (!r.get(c)) return fail(bad("truncated CQ backlog"));
      cq.backlog.push_back(c);
    }
  }
  cq_ms = ms_since(t);
  if (!r.get(n) || n > lim.max_ah) return fail(bad("AH count"));
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t h = 0, pd = 0;
    vd::AhWire wire{};
    if (!r.get(h) || !r.get(pd) || !r.get(wire)) return fail(bad("truncated AH"));
    auto pit = d.pds.find(pd);
    if (!fresh(h, d.ahs.count(h) != 0) || pit == d.pds.end()) return fail(bad(fmt::format("AH {}", h)));
    auto ah = pit->second.eng->create_ah(d.engine_ah(wire));
    if (!ah) return fail(ah.error());
    d.ahs[h] = AhObj{pd, wire, std::move(*ah)};
    ++pit->second.users;
  }
  const auto ring_ok = [&](const SavedRing& s, std::uint32_t stride) {
    return s.depth != 0 && (s.depth & (s.depth - 1)) == 0 && s.depth <= lim.max_qp_wr && s.stride == stride &&
           s.produced - s.consumed <= s.depth && g.memory().range(s.gpa, std::uint64_t{s.depth} * s.stride).ok();
  };
  if (version >= 6) {
    if (!r.get(n) || n > lim.max_srq) return fail(bad("SRQ count"));
    for (std::uint32_t i = 0; i < n; ++i) {
      std::uint32_t h = 0;
      SrqObj s;
      SavedRing ring{};
      std::vector<std::uint8_t> eng_blob;
      if (!r.get(h) || !r.get(s.pd) || !r.get(s.max_sge) || !r.get(ring) || !r.get(s.status_gpa) ||
          !r.bytes(eng_blob, 1u << 24))
        return fail(bad("truncated SRQ"));
      auto pit = d.pds.find(s.pd);
      if (!fresh(h, d.srqs.count(h) != 0) || pit == d.pds.end() || s.max_sge == 0 || s.max_sge > lim.max_sge ||
          !ring_ok(ring, vd::recv_stride(s.max_sge)) || !g.memory().range(s.status_gpa, sizeof(vd::QpStatus)))
        return fail(bad(fmt::format("SRQ {}", h)));
      s.ring = WorkRing{ring.gpa, ring.depth, ring.stride, ring.consumed, ring.produced};
      auto eng = pit->second.eng->create_srq(ring.depth, s.max_sge);
      if (!eng) return fail(prefixed(fmt::format("SRQ {}: ", h), eng.error()));
      s.eng = std::move(*eng);
      // A NIC's SRQ: the receives the source held are posted again (rebuild.cpp).
      if (auto imported = d.engine_rebuilds() ? rebuild_srq(h, s, eng_blob) : s.eng->import_state(eng_blob); !imported.ok())
        return fail(prefixed(fmt::format("SRQ {}: ", h), imported.error()));
      ++pit->second.users;
      if (s.ring.produced != s.ring.consumed) d.pending_srq.insert(h);
      d.srqs.emplace(h, std::move(s));
    }
  }
  t = SteadyClock::now();
  if (!r.get(n) || n > lim.max_qp) return fail(bad("QP count"));
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t h = 0, qpn = 0, srq = vd::kNoHandle;
    std::uint8_t type = 0, sig = 0, fatal = 0;
    QpObj qp;
    SavedRing sq{}, rq{};
    std::vector<std::uint8_t> eng_blob;
    if (!r.get(h) || !r.get(qp.pd) || !r.get(qp.send_cq) || !r.get(qp.recv_cq) || !r.get(type) || !r.get(sig) ||
        !r.get(fatal) || !r.get(qp.max_send_sge) || !r.get(qp.max_recv_sge) || !r.get(qp.max_inline) || !r.get(sq) ||
        !r.get(rq) || !r.get(qp.status_gpa) || !r.get(qpn) || (version >= 6 && !r.get(srq)) ||
        !r.bytes(eng_blob, 1u << 24))
      return fail(bad("truncated QP"));
    auto pit = d.pds.find(qp.pd);
    auto scq = d.cqs.find(qp.send_cq);
    auto rcq = d.cqs.find(qp.recv_cq);
    // A QP on an SRQ (of its PD) has no receive ring.
    SrqObj* on_srq = nullptr;
    if (srq != vd::kNoHandle) {
      auto sit = d.srqs.find(srq);
      if (sit == d.srqs.end() || sit->second.pd != qp.pd || rq.gpa != 0 || rq.depth != 0 || rq.stride != 0 ||
          rq.consumed != 0 || rq.produced != 0)
        return fail(bad(fmt::format("QP {} on SRQ {}", h, srq)));
      on_srq = &sit->second;
    }
    if (!fresh(h, d.qps.count(h) != 0) || pit == d.pds.end() || scq == d.cqs.end() || rcq == d.cqs.end() ||
        !qp_shape_ok(lim, type, qp.max_send_sge, qp.max_recv_sge, qp.max_inline) ||
        !ring_ok(sq, vd::send_stride(qp.max_send_sge, qp.max_inline)) ||
        (on_srq == nullptr && !ring_ok(rq, vd::recv_stride(qp.max_recv_sge))) ||
        !g.memory().range(qp.status_gpa, sizeof(vd::QpStatus)))
      return fail(bad(fmt::format("QP {}", h)));
    qp.srq = srq;
    qp.type = static_cast<nicdrv::QpType>(type);
    qp.sq_sig_all = sig != 0;
    qp.fatal_reported = fatal != 0;
    qp.sq = WorkRing{sq.gpa, sq.depth, sq.stride, sq.consumed, sq.produced};
    qp.rq = WorkRing{rq.gpa, rq.depth, rq.stride, rq.consumed, rq.produced};
    nicdrv::QpInitAttr ia;
    ia.type = qp.type;
    ia.send_cq = scq->second.eng.get();
    ia.recv_cq = rcq->second.eng.get();
    ia.srq = on_srq != nullptr ? on_srq->eng.get() : nullptr;
    ia.cap = nicdrv::QpCap{sq.depth, rq.depth, qp.max_send_sge, qp.max_recv_sge, qp.max_inline};
    ia.sq_sig_all = qp.sq_sig_all;
    nicdrv::QpOptions qo;
    qo.requested_qpn = qpn;
    qp.guest_qpn = qpn;
    if (d.engine_rebuilds()) {  // a NIC's QP: re-created from its record (rebuild.cpp)
      if (auto s = rebuild_qp(h, qp, *pit->second.eng, ia, eng_blob); !s.ok())
        return fail(prefixed(fmt::format("QP {}: ", h), s.error()));
    } else {
      Result<std::shared_ptr<nicdrv::QueuePair>> eng = make_error(Errc::not_found, "not pre-created");
      if (auto p = take_precreated_qp(h, qp, pit->second.eng.get(), ia, qpn)) eng = std::move(p);
      if (!eng) {
        eng = pit->second.eng->create_qp(ia, qo);
        // The guest re-created QPs after the layout went: a pre-created one may hold this QPN.
        if (!eng && !pre.qps.empty()) {
          pre.qps.clear();
          eng = pit->second.eng->create_qp(ia, qo);
        }
      }
      if (!eng) return fail(prefixed(fmt::format("QP {}: ", h), eng.error()));
      if (auto s = (*eng)->import_state(eng_blob); !s.ok()) return fail(prefixed(fmt::format("QP {}: ", h), s.error()));
      qp.eng = std::move(*eng);
      d.qp_by_engine_qpn[qp.eng->qp_num()] = h;
      qp.rq_done = qp.rq.consumed;  // a version 1 state does not say (version 2 does, below)
    }
    ++pit->second.users;
    ++scq->second.users;
    ++rcq->second.users;
    if (on_srq != nullptr) ++on_srq->users;
    if (qp.sq.produced != qp.sq.consumed) d.pending_sq.insert(h);
    if (qp.rq.produced != qp.rq.consumed) d.pending_rq.insert(h);
    d.qps.emplace(h, std::move(qp));
  }
  if (version >= 2) {
    if (!r.get(n) || n > d.qps.size() || (n != 0 && d.engine_rebuilds())) return fail(bad("QP extras count"));
    std::unordered_set<std::uint32_t> seen;
    for (std::uint32_t i = 0; i < n; ++i) {
      std::uint32_t h = 0, rq_done = 0, dest = 0, keys = 0;
      if (!r.get(h) || !r.get(rq_done) || !r.get(dest) || !r.get(keys)) return fail(bad("truncated QP extras"));
      auto it = d.qps.find(h);
      if (it == d.qps.end() || !seen.insert(h).second || dest >> 24 != 0 || keys > notice::kMaxRkeys)
        return fail(bad(fmt::format("QP extras of QP {}", h)));
      auto& qp = it->second;
      // Receives still posted to the engine: at most what the guest posted and the device took
      // (a QP on an SRQ only counts the receives it completed).
      if (qp.srq == vd::kNoHandle && qp.rq.consumed - rq_done > qp.rq.depth)
        return fail(bad(fmt::format("QP {}: receives completed", h)));
      qp.rq_done = rq_done;
      qp.guest_dest_qpn = dest;
      for (std::uint32_t k = 0; k < keys; ++k) {
        std::uint32_t guest = 0, nic = 0;
        if (!r.get(guest) || !r.get(nic)) return fail(bad("truncated QP extras"));
        qp.remote_rkeys[guest] = nic;
      }
    }
  }
  if (version >= 3) {
    if (!r.get(n) || n > d.pds.size() || d.mrs.size() + n > lim.max_mr) return fail(bad("DMA MR count"));
    std::unordered_set<std::uint32_t> names;  // the regions' lkeys as the guest knows them
    for (const auto& [h, mr] : d.mrs) names.insert(mr.guest_lkey);
    for (std::uint32_t i = 0; i < n; ++i) {
      std::uint32_t h = 0;
      DmaMrObj mr;
      if (!r.get(h) || !r.get(mr.pd) || !r.get(mr.access) || !r.get(mr.guest_lkey)) return fail(bad("truncated DMA MR"));
      if (!fresh(h, d.mrs.count(h) != 0 || d.dma_mrs.count(h) != 0) || d.pds.count(mr.pd) == 0 || d.dma_mr_of_pd(mr.pd) ||
          (mr.access & ~VIRTIO_RDMA_ACCESS_LOCAL_WRITE) != 0 || mr.guest_lkey == 0 || !names.insert(mr.guest_lkey).second)
        return fail(bad(fmt::format("DMA MR {} (PD {}, access {:#x}, lkey {:#x})", h, mr.pd, mr.access, mr.guest_lkey)));
      if (auto s = d.map_dma_mr(g, mr, true); !s.ok()) return fail(prefixed(fmt::format("DMA MR {}: ", h), s.error()));
      if (!d.engine_rebuilds() && mr.parts.front().eng->lkey() != mr.guest_lkey)
        return fail(make_error(Errc::not_supported, "the engine cannot keep the DMA MR's key"));
      d.add_dma_mr(h, std::move(mr));
    }
  }
  if (version >= 4) {
    if (!r.get(n) || d.mr_count() + n > lim.max_mr) return fail(bad("fast MR count"));
    for (std::uint32_t i = 0; i < n; ++i) {
      std::uint32_t h = 0, pd = 0, max_pages = 0, key = 0;
      std::uint8_t registered = 0;
      if (!r.get(h) || !r.get(pd) || !r.get(max_pages) || !r.get(key) || !r.get(registered))
        return fail(bad("truncated fast MR"));
      if (!fresh(h, d.mrs.count(h) != 0 || d.dma_mrs.count(h) != 0 || d.fast_mrs.count(h) != 0) ||
          d.pds.count(pd) == 0 || registered > 1 || key == 0)
        return fail(bad(fmt::format("fast MR {} (PD {}, key {:#x})", h, pd, key)));
      auto mr = d.new_fast_mr(pd, max_pages);
      if (!mr) return fail(prefixed(fmt::format("fast MR {}: ", h), mr.error()));
      nicdrv::MrOptions mo;
      mo.requested_key = key;
      if (d.engine_reports_writes) mo.observer = mr->observer;
      if (registered != 0) {
        device::PageLayout l;
        if (!r.get(l.iova) || !r.get(l.length) || !r.get(l.access) || !r.get(l.page_shift) || !r.get(l.npages))
          return fail(bad("truncated fast MR registration"));
        if (l.npages == 0 || l.npages > max_pages) return fail(bad(fmt::format("fast MR {}: {} pages", h, l.npages)));
        std::vector<std::uint64_t> pages(l.npages);
        for (auto& p : pages)
          if (!r.get(p)) return fail(bad("truncated fast MR page list"));
        auto first = d.map_fast(g, *mr, l, std::move(pages));
        if (!first) return fail(prefixed(fmt::format("fast MR {}: ", h), first.error()));
        mo.registered = nicdrv::MrOptions::Registered{*first, l.iova, l.length, static_cast<nicdrv::Access>(l.access)};
      }
      auto eng = d.pds[pd].eng->alloc_mr(max_pages, mo);
      if (!eng) return fail(prefixed(fmt::format("fast MR {}: ", h), eng.error()));
      mr->eng = std::move(*eng);
      d.add_fast_mr(h, std::move(*mr));
    }
  }
  if (version >= 5) {
    if (!r.get(n) || n > vd::kMaxDbRings) return fail(bad("doorbell ring count"));
    for (std::uint32_t i = 0; i < n; ++i) {
      std::uint32_t number = 0;
      device::DbRingObj ring;
      if (!r.get(number) || !r.get(ring.gpa) || !r.get(ring.depth) || !r.get(ring.consumed))
        return fail(bad("truncated doorbell ring"));
      if (number == 0 || number > 0xffff || d.db_rings.contains(number))
        return fail(bad(fmt::format("doorbell ring number {}", number)));
      if (auto why = device::DeviceModel::db_ring_layout_error(g, ring.gpa, ring.depth))
        return fail(bad(fmt::format("doorbell ring {}: {}", number, *why)));
      d.db_rings.emplace(number, ring);
    }
    // Not polled here (yet): their processes notify again.
    d.set_db_rings_polled(g, false);
    auto get_tags = [&](auto& objects, std::string_view kind) -> Status {
      std::uint32_t tagged = 0;
      if (!r.get(tagged) || tagged > objects.size()) return bad(fmt::format("{} doorbell ring count", kind));
      for (std::uint32_t i = 0; i < tagged; ++i) {
        std::uint32_t h = 0, number = 0;
        if (!r.get(h) || !r.get(number)) return bad(fmt::format("truncated {} doorbell ring", kind));
        auto o = objects.find(h);
        if (o == objects.end() || o->second.db_ring != 0 || !d.db_rings.contains(number))
          return bad(fmt::format("{} {} of doorbell ring {}", kind, h, number));
        o->second.db_ring = number;
        d.count_db_ring_user(number, +1);
      }
      return {};
    };
    if (auto s = get_tags(d.cqs, "CQ"); !s.ok()) return fail(s.error());
    if (auto s = get_tags(d.qps, "QP"); !s.ok()) return fail(s.error());
    if (version >= 6)
      if (auto s = get_tags(d.srqs, "SRQ"); !s.ok()) return fail(s.error());
  }
  if (!r.at_end()) return fail(bad("trailing bytes"));
  if (auto s = finish_rebuilds(); !s.ok()) return fail(s.error());
  d.next_handle_ = std::max(next, max_handle + 1);
  qp_ms = ms_since(t);
  const std::uint32_t unused = pre.count();
  pre.clear();
  log::info("virtio-rdma: device state loaded: {} PDs, {} MRs ({:.1f} ms), {} CQs ({:.1f} ms), {} AHs, {} SRQs, {} QPs "
            "({:.1f} ms), {} objects pre-created during pre-copy ({} left unused); resuming when the rings run",
            d.pds.size(), d.mr_count(), mr_ms, d.cqs.size(), cq_ms, d.ahs.size(), d.srqs.size(), d.qps.size(), qp_ms,
            adopted, unused);
  return {};
}

}  // namespace vrdma::migration
