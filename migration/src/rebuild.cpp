// Moving QPs whose state a NIC keeps. A NIC cannot export a QP (VerbsQp::export_state is
// not_supported) nor create one with a chosen QPN or memory key, so a move onto a NIC works
// the way the verbs API allows:
//   save (source): every QP in RTS goes to SQD and the NIC finishes what was posted (bounded
//     wait); then every QP goes to ERR, which stops its responder, and its PSNs are read
//     (ibv_query_qp). The receives the NIC then flushes are dropped and posted again at the
//     destination; what they had not received the peer sends again from the saved PSN.
//   load (destination): each QP is created anew (the NIC picks its QPN), taken through INIT,
//     RTR and RTS with the saved path, PSNs and limits; regions are registered again (the NIC
//     picks their keys). The guest keeps its QPNs and keys: the device translates them in work
//     requests, completions and QP commands.
// Which peers survive (docs/migration.md "On a NIC"): QPs connected to other QPs of the same
// device (both ends move together) carry on; a peer elsewhere still sends to the old QPN, which
// the new NIC does not know, so its retries run out and both ends see an error.
#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "device_state_impl.hpp"
#include "vrdma/common/bytes.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::migration {


namespace {
using rebuild::Record;
using rebuild::decode;
using rebuild::encode;
using M = nicdrv::QpAttrMask;
using nicdrv::QpState;
using Clock = std::chrono::steady_clock;

}  // namespace

// ---- save ----------------------------------------------------------------------------------

Record DeviceState::Impl::record_of(const QpObj& qp, const nicdrv::QpAttr& b, const nicdrv::QpAttr& a) {
  Record r;
  const auto before = b.qp_state;
  r.state = static_cast<std::uint8_t>(before == QpState::sqd ? QpState::rts : before);
  r.type = static_cast<std::uint8_t>(qp.type);
  // A QP never connected (RESET, INIT) or a UD QP may report no path MTU: 1024 stands in.
  r.path_mtu = static_cast<std::uint8_t>(b.path_mtu);
  if (r.path_mtu < 1 || r.path_mtu > 5) r.path_mtu = static_cast<std::uint8_t>(nicdrv::Mtu::mtu1024);
  r.qkey = b.qkey;
  r.rq_psn = a.rq_psn & 0xffffff;
  r.sq_psn = a.sq_psn & 0xffffff;
  r.dest_qp_num = qp.local_peer ? d.guest_qpn_of(b.dest_qp_num) : b.dest_qp_num;
  r.access = static_cast<std::uint32_t>(b.qp_access_flags) & 0xf;
  r.pkey_index = b.pkey_index;
  r.port = b.port_num == 0 ? 1 : b.port_num;
  r.max_rd_atomic = b.max_rd_atomic;
  r.max_dest_rd_atomic = b.max_dest_rd_atomic;
  r.min_rnr_timer = static_cast<std::uint8_t>(b.min_rnr_timer & 31);
  r.timeout = static_cast<std::uint8_t>(b.timeout & 31);
  r.retry_cnt = static_cast<std::uint8_t>(b.retry_cnt & 7);
  r.rnr_retry = static_cast<std::uint8_t>(b.rnr_retry & 7);
  r.dgid = b.ah_attr.dgid.raw;
  if (auto g = d.engine->query_gid(b.ah_attr.sgid_index, r.port); g.ok()) r.sgid = g->gid.raw;
  r.hop_limit = b.ah_attr.hop_limit;
  r.traffic_class = b.ah_attr.traffic_class;
  r.sl = b.ah_attr.sl;
  r.flow_label = b.ah_attr.flow_label & 0xfffff;
  r.local_peer = qp.local_peer ? 1 : 0;
  r.guest_dest_qpn = qp.local_peer ? 0 : qp.guest_dest_qpn;
  r.remote_rkeys.assign(qp.remote_rkeys.begin(), qp.remote_rkeys.end());
  return r;
}

Status DeviceState::Impl::collect_after_stop(const std::unordered_map<std::uint32_t, std::uint32_t>& expect_flush,
                                            const std::unordered_set<std::uint32_t>& stopped) {
  std::unordered_map<std::uint32_t, std::uint32_t> flushed;
  std::size_t waiting = expect_flush.size();
  auto last = Clock::now();
  const auto quiet = std::chrono::milliseconds(20);
  const auto flush_deadline = Clock::now() + std::chrono::milliseconds(opts.drain_timeout_ms);
  std::array<nicdrv::WorkCompletion, 64> wcs;
  while (waiting > 0 && Clock::now() - last < quiet && Clock::now() < flush_deadline) {
    for (auto& [ch, cq] : d.cqs) {
      for (;;) {
        auto n = cq.eng->poll(wcs);
        if (!n) return make_error(Errc::io_error, fmt::format("CQ {}: {}", ch, n.error().message));
        if (*n > 0) last = Clock::now();
        for (std::size_t i = 0; i < *n; ++i) {
          const auto& wc = wcs[i];
          auto q = d.qp_by_engine_qpn.find(wc.qp_num);
          const bool recv = static_cast<std::uint8_t>(wc.opcode) >= 128;
          if (q == d.qp_by_engine_qpn.end()) continue;  // a QP that is gone
          auto& qp = d.qps[q->second];
          if (wc.status == nicdrv::WcStatus::wr_flush_err && stopped.count(q->second) != 0) {
            auto e = expect_flush.find(q->second);
            if (recv && e != expect_flush.end() && ++flushed[q->second] == e->second) --waiting;
            // An SRQ's receive stays held (posted again at the destination, or here if the move fails).
            if (recv && qp.srq != 0) srq_flushed.emplace_back(qp.srq, wc.wr_id);
            continue;  // flushed by our own stop
          }
          if (recv) ++qp.rq_done;
          cq.backlog.push_back(d.guest_cqe(wc, &qp));
        }
        if (*n < wcs.size()) break;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return {};
}

Status DeviceState::Impl::stop_for_rebuild() {
  stopped_for_rebuild.clear();
  srq_flushed.clear();
  if (d.qps.empty()) return {};
  const auto t0 = Clock::now();
  std::unordered_map<std::uint32_t, nicdrv::QpAttr> attrs;
  for (auto& [h, qp] : d.qps) {
    auto a = qp.eng->query();
    if (!a) return prefixed(fmt::format("QP {}: ", h), a.error());
    attrs[h] = *a;
  }
  // 0. Peer backends that listen for notices hold and drain their side (peer.cpp); an abandoned
  //    stop lets them go again.
  auto peers = pause_peers(attrs);
  bool keep_peers = false;
  struct ReleaseOnExit {
    Impl& self;
    std::vector<PausedPeer>& p;
    bool& keep;
    ~ReleaseOnExit() {
      if (!keep) self.release_peers(p);
    }
  } release_on_exit{*this, peers, keep_peers};
  // 1. The NIC finishes every send already posted: RTS -> SQD, then wait until it has drained.
  std::vector<std::uint32_t> draining;
  auto back_to_rts = [&] {
    for (auto h : draining) {
      nicdrv::QpAttr a;
      a.qp_state = QpState::rts;
      if (auto s = d.qps[h].eng->modify(a, M::state); !s.ok())
        log::error("virtio-rdma: QP {} stays in SQD after an abandoned stop: {}", h, s.error().message);
    }
  };
  for (auto& [h, qp] : d.qps) {
    if (attrs[h].qp_state != QpState::rts) continue;
    nicdrv::QpAttr a;
    a.qp_state = QpState::sqd;
    if (auto s = qp.eng->modify(a, M::state); !s.ok()) {
      back_to_rts();
      return prefixed(fmt::format("QP {} cannot drain its send queue (RTS -> SQD): ", h), s.error());
    }
    draining.push_back(h);
  }
  const auto deadline = t0 + std::chrono::milliseconds(opts.drain_timeout_ms);
  for (std::size_t left = draining.size(); left > 0;) {
    left = 0;
    for (auto h : draining) {
      auto a = d.qps[h].eng->query();
      if (a && a->qp_state == QpState::sqd && a->sq_draining != 0) ++left;
    }
    if (left == 0) break;
    if (Clock::now() > deadline) {
      back_to_rts();
      return make_error(Errc::timeout,
                        fmt::format("{} QPs still had sends in flight after {} ms (their peers do not acknowledge them); "
                                    "the stop is abandoned and the guest carries on here",
                                    left, opts.drain_timeout_ms));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // 2. ERR stops each responder at a packet boundary; then the PSNs are final.
  std::unordered_map<std::uint32_t, std::uint32_t> expect_flush;
  std::unordered_set<std::uint32_t> stopped;
  for (auto& [h, qp] : d.qps) {
    const auto before = attrs[h].qp_state;
    if (before != QpState::err && before != QpState::reset) {
      nicdrv::QpAttr a;
      a.qp_state = QpState::err;
      if (auto s = qp.eng->modify(a, M::state); !s.ok())
        return prefixed(fmt::format("QP {} cannot be stopped (-> ERR): ", h), s.error());
      if (qp.srq == 0 && qp.rq.consumed != qp.rq_done) expect_flush[h] = qp.rq.consumed - qp.rq_done;
    }
    auto a = qp.eng->query();
    if (!a) return prefixed(fmt::format("QP {}: ", h), a.error());
    auto r = record_of(qp, attrs[h], *a);
    for (const auto& p : peers)
      if (p.handle == h) {
        r.notice_token = p.token;
        r.notice_addr = p.to;
        r.notice_port = opts.notice_port;
      }
    stopped_for_rebuild[h] = encode(r);
    stopped.insert(h);
  }
  keep_peers = true;  // from here their re-point comes with the records
  // 3. What completed before the stop goes into the CQ backlogs, as at any save; what the NIC
  //    flushes now is dropped (those receives are posted again at the destination). A NIC need
  //    not flush at all (Linux rxe 6.1 leaves them): the receives still posted are those the
  //    guest posted and saw no completion for, counted once the CQs have been quiet a while.
  if (auto s = collect_after_stop(expect_flush, stopped); !s.ok()) return s;
  for (auto& [h, rec] : stopped_for_rebuild) {
    const auto& qp = d.qps[h];
    if (qp.srq != 0) continue;
    auto r = decode(rec);
    if (!r) return std::move(r).error();
    r->recv_outstanding = qp.rq.consumed - qp.rq_done;
    rec = encode(*r);
  }
  d.mark_dma_writable();  // what the NIC wrote until it stopped
  log::info("virtio-rdma: {} QPs stopped on {} for re-creation ({} drained their sends, {} peers paused) in {:.1f} ms",
            d.qps.size(), d.engine->name(), draining.size(), peers.size(),
            std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  return {};
}

Result<std::vector<std::uint8_t>> DeviceState::Impl::rebuild_record(std::uint32_t handle, const QpObj&) {
  auto it = stopped_for_rebuild.find(handle);
  if (it == stopped_for_rebuild.end())
    return make_error(Errc::bad_state, fmt::format("QP {} was not stopped for re-creation", handle));
  return it->second;
}

// ---- SRQs ----------------------------------------------------------------------------------
// A NIC cannot give back the receives posted to an SRQ; the device kept each one it posted
// until its completion (SrqObj::held, datapath.cpp). The record carries them, oldest first, and
// the destination posts them again before what the SRQ's ring holds. A receive a QP was filling
// at the stop is among them (the NIC flushes it or leaves it, never completes it): the peer sends
// that message again from the saved PSN.

Result<std::vector<std::uint8_t>> DeviceState::Impl::srq_record(const SrqObj& s) const {
  rebuild::SrqRecord r;
  r.max_sge = s.max_sge;
  for (const auto& h : s.held) {
    rebuild::SrqReceive x;
    x.wr_id = h.wr_id;
    for (std::uint32_t i = 0; i < h.nsge; ++i) x.sges.push_back({h.sge[i].addr, h.sge[i].length, h.sge[i].lkey});
    r.receives.push_back(std::move(x));
  }
  return rebuild::encode_srq(r);
}

Status DeviceState::Impl::post_held(SrqObj& s, SrqObj::Held h) {
  std::array<nicdrv::Sge, 16> sg;
  for (std::uint32_t i = 0; i < h.nsge; ++i)
    sg[i] = nicdrv::Sge{h.sge[i].addr, h.sge[i].length, d.engine_lkey(h.sge[i].lkey, h.sge[i].addr)};
  h.tag = s.next_tag++;
  const nicdrv::RecvWr w{h.tag, std::span<const nicdrv::Sge>(sg.data(), h.nsge)};
  if (auto r = s.eng->post_recv(std::span(&w, 1)); !r.ok()) return r;
  s.held.push_back(h);
  return {};
}

Status DeviceState::Impl::rebuild_srq(std::uint32_t handle, SrqObj& s, std::span<const std::uint8_t> blob) {
  auto r = rebuild::decode_srq(blob);
  if (!r) return std::move(r).error();
  if (r->max_sge != s.max_sge || r->receives.size() > s.ring.depth)
    return make_error(Errc::invalid_argument,
                      fmt::format("SRQ record: {} receives of up to {} SGEs for an SRQ of {} of {}", r->receives.size(),
                                  r->max_sge, s.ring.depth, s.max_sge));
  s.held.clear();
  for (const auto& x : r->receives) {
    SrqObj::Held h;
    h.wr_id = x.wr_id;
    h.nsge = static_cast<std::uint32_t>(x.sges.size());
    for (std::uint32_t i = 0; i < h.nsge; ++i) h.sge[i] = vd::WireSge{x.sges[i].addr, x.sges[i].length, x.sges[i].lkey};
    if (auto p = post_held(s, h); !p.ok()) return prefixed("a held receive could not be posted again: ", p.error());
  }
  if (!r->receives.empty())
    log::info("virtio-rdma: SRQ {}: {} receives the source's NIC held posted again", handle, r->receives.size());
  return {};
}

// ---- load ----------------------------------------------------------------------------------

Status DeviceState::Impl::rebuild_qp(std::uint32_t handle, QpObj& qp, nicdrv::ProtectionDomain& pd,
                                    const nicdrv::QpInitAttr& ia, std::span<const std::uint8_t> record) {
  auto r = decode(record);
  if (!r) return std::move(r).error();
  if (auto s = receives_fit(qp, *r); !s.ok()) return s;
  // The NIC picks the QPN (the QP built during pre-copy, if any, comes first); one that is
  // already a guest's name for another QP is set aside.
  std::vector<std::shared_ptr<nicdrv::QueuePair>> set_aside;
  std::shared_ptr<nicdrv::QueuePair> eng;
  auto built = take_precreated_qp(handle, qp, &pd, ia, std::nullopt);
  for (int tries = 0; tries < 8 && !eng; ++tries) {
    const bool was_built = built != nullptr;
    std::shared_ptr<nicdrv::QueuePair> q = std::move(built);
    if (!q) {
      auto made = pd.create_qp(ia);
      if (!made) return std::move(made).error();
      q = std::move(*made);
    }
    const auto n = q->qp_num();
    if (n != qp.guest_qpn && (d.guest_name_taken(n, true) || d.qp_by_engine_qpn.count(n) != 0)) {
      if (was_built) --adopted;  // not used after all
      set_aside.push_back(std::move(q));
    } else {
      eng = std::move(q);
    }
  }
  if (!eng) return make_error(Errc::busy, "the NIC kept handing out QPNs the guest already uses");
  if (qp.eng) d.forget_names(handle);
  qp.eng = std::move(eng);
  const auto n = qp.eng->qp_num();
  d.qp_by_engine_qpn[n] = handle;
  if (n != qp.guest_qpn) {
    d.qpn_to_guest[n] = qp.guest_qpn;
    d.qpn_to_engine[qp.guest_qpn] = n;
  }
  adopt_record(handle, qp, *r, record);
  return {};
}

Status DeviceState::Impl::reset_for_rebuild(std::uint32_t handle, QpObj& qp, std::span<const std::uint8_t> record) {
  auto r = decode(record);
  if (!r) return std::move(r).error();
  if (auto s = receives_fit(qp, *r); !s.ok()) return s;
  nicdrv::QpAttr a;
  a.qp_state = QpState::reset;
  if (auto s = qp.eng->modify(a, M::state); !s.ok())
    return prefixed(fmt::format("QP {} cannot be reset (ERR -> RESET): ", handle), s.error());
  adopt_record(handle, qp, *r, record);
  return {};
}

Status DeviceState::Impl::receives_fit(const QpObj& qp, const Record& r) const {
  if (r.type != static_cast<std::uint8_t>(qp.type)) return make_error(Errc::invalid_argument, "re-creation record: QP type differs");
  // Receives to post again: they must fit in the ring with what the guest posted since.
  if ((qp.srq != 0 && r.recv_outstanding != 0) ||
      std::uint64_t{qp.rq.produced - qp.rq.consumed} + r.recv_outstanding > qp.rq.depth)
    return make_error(Errc::invalid_argument, fmt::format("re-creation record: {} receives to post again do not fit the ring",
                                                          r.recv_outstanding));
  return {};
}

void DeviceState::Impl::adopt_record(std::uint32_t handle, QpObj& qp, const Record& r, std::span<const std::uint8_t> record) {
  qp.rq.consumed -= r.recv_outstanding;  // posted again when the rings run
  qp.rq_done = qp.rq.consumed;
  qp.local_peer = r.local_peer != 0;
  qp.guest_dest_qpn = r.guest_dest_qpn;
  qp.remote_rkeys.clear();
  for (const auto& [guest, nic] : r.remote_rkeys) qp.remote_rkeys[guest] = nic;
  rebuilds.push_back({handle, std::vector<std::uint8_t>(record.begin(), record.end())});
}

// Once every QP exists (a QP connected inside the device needs its peer's new QPN).
Status DeviceState::Impl::finish_rebuilds() {
  auto gids = d.engine->gid_table();
  for (const auto& pr : rebuilds) {
    auto it = d.qps.find(pr.handle);
    if (it == d.qps.end()) continue;
    auto& qp = it->second;
    auto r = decode(pr.record);
    if (!r) return std::move(r).error();
    const auto target = static_cast<QpState>(r->state);
    auto step = [&](nicdrv::QpAttr a, M mask, const char* what) -> Status {
      if (auto s = qp.eng->modify(a, mask); !s.ok())
        return prefixed(fmt::format("QP {} (QPN {:#x}, now {:#x}): re-creating it, {}: ", pr.handle, qp.guest_qpn,
                                    qp.eng->qp_num(), what),
                        s.error());
      return {};
    };
    const bool rc = qp.type == nicdrv::QpType::rc;
    if (target == QpState::reset) continue;
    nicdrv::QpAttr a;
    a.pkey_index = r->pkey_index;
    a.port_num = r->port;
    a.qkey = r->qkey;
    a.qp_access_flags = static_cast<nicdrv::Access>(r->access);
    a.qp_state = QpState::init;
    if (auto s = step(a, M::state | M::pkey_index | M::port | (rc ? M::access_flags : M::qkey), "RESET -> INIT"); !s.ok())
      return s;
    if (target == QpState::err) {
      a.qp_state = QpState::err;
      if (auto s = step(a, M::state, "-> ERR"); !s.ok()) return s;
      continue;
    }
    if (target == QpState::init) continue;
    a.qp_state = QpState::rtr;
    M mask = M::state;
    if (rc) {
      nicdrv::Gid sgid;
      sgid.raw = r->sgid;
      std::optional<std::uint32_t> sgid_index;
      if (gids)
        for (const auto& e : *gids)
          if (e.gid == sgid) sgid_index = e.index;
      if (!sgid_index)
        return make_error(Errc::not_found,
                          fmt::format("QP {}: {} has no GID {} (the guest's address): give the guest's address to this "
                                      "host's RDMA interface before the guest arrives",
                                      pr.handle, d.engine->name(), sgid.str()));
      a.ah_attr.dgid.raw = r->dgid;
      a.ah_attr.sgid_index = static_cast<std::uint8_t>(*sgid_index);
      a.ah_attr.hop_limit = r->hop_limit;
      a.ah_attr.traffic_class = r->traffic_class;
      a.ah_attr.sl = r->sl;
      a.ah_attr.flow_label = r->flow_label;
      a.ah_attr.port_num = r->port;
      a.path_mtu = static_cast<nicdrv::Mtu>(r->path_mtu);
      a.dest_qp_num = r->dest_qp_num;
      if (qp.local_peer)
        if (auto e = d.qpn_to_engine.find(r->dest_qp_num); e != d.qpn_to_engine.end()) a.dest_qp_num = e->second;
      // A peer backend paused for this QP: it re-creates its side toward the new QPN and says
      // which QPN it has now (peer.cpp); one that does not answer keeps the old one.
      if (r->notice_token != 0)
        if (auto peer_qpn = repoint_peer(pr.handle, qp, *r)) {
          if (qp.guest_dest_qpn == 0) qp.guest_dest_qpn = r->dest_qp_num;
          a.dest_qp_num = *peer_qpn;
        }
      a.rq_psn = r->rq_psn;
      a.max_dest_rd_atomic = r->max_dest_rd_atomic;
      a.min_rnr_timer = r->min_rnr_timer;
      mask = mask | M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic | M::min_rnr_timer;
    }
    if (auto s = step(a, mask, "INIT -> RTR"); !s.ok()) return s;
    if (target == QpState::rtr) continue;
    a.qp_state = QpState::rts;
    a.sq_psn = r->sq_psn;
    mask = M::state | M::sq_psn;
    if (rc) {
      a.timeout = r->timeout;
      a.retry_cnt = r->retry_cnt;
      a.rnr_retry = r->rnr_retry;
      a.max_rd_atomic = r->max_rd_atomic;
      mask = mask | M::timeout | M::retry_cnt | M::rnr_retry | M::max_qp_rd_atomic;
    }
    if (auto s = step(a, mask, "RTR -> RTS"); !s.ok()) return s;
    if (qp.rq.produced != qp.rq.consumed) d.pending_rq.insert(pr.handle);
    if (qp.sq.produced != qp.sq.consumed) d.pending_sq.insert(pr.handle);
  }
  if (!rebuilds.empty())
    log::info("virtio-rdma: {} QPs re-created on {} with their saved PSNs; {} keep their QPN by translation", rebuilds.size(),
              d.engine->name(), d.qpn_to_engine.size());
  rebuilds.clear();
  return {};
}

// ---- a move that failed after the stop -----------------------------------------------------------

void DeviceState::Impl::rebuild_here() {
  auto stopped = std::move(stopped_for_rebuild);
  stopped_for_rebuild.clear();
  const GuestView g = d.view();
  std::size_t lost = 0;
  // SRQ receives the NIC flushed at the stop are no longer in its SRQ: post them again.
  for (const auto& [sh, tag] : srq_flushed) {
    auto sit = d.srqs.find(sh);
    if (sit == d.srqs.end()) continue;
    auto& held = sit->second.held;
    auto it = std::find_if(held.begin(), held.end(), [t = tag](const SrqObj::Held& x) { return x.tag == t; });
    if (it == held.end()) continue;
    const SrqObj::Held h = *it;
    held.erase(it);
    if (auto s = post_held(sit->second, h); !s.ok())
      log::error("virtio-rdma: SRQ {}: a receive the stop flushed could not be posted again (wr_id {:#x}): {}", sh, h.wr_id,
                 s.error().message);
  }
  srq_flushed.clear();
  for (auto& [h, record] : stopped) {
    auto it = d.qps.find(h);
    if (it == d.qps.end()) continue;
    auto& qp = it->second;
    auto s = rebuild_qp(h, qp, *d.pds[qp.pd].eng, d.init_attr_of(qp), record);
    if (!s.ok()) {
      ++lost;
      log::error("virtio-rdma: QP {} stays stopped after the move failed: {}", h, s.error().message);
      d.queue_event(vd::EventType::qp_fatal, h, static_cast<std::uint32_t>(nicdrv::WcStatus::fatal_err));
    }
  }
  if (auto s = finish_rebuilds(); !s.ok()) {
    log::error("virtio-rdma: after the failed move: {}", s.error().message);
    ++lost;
  }
  for (auto& [h, qp] : d.qps) d.write_status(g, qp.status_gpa, qp.sq.consumed, qp.rq.consumed, static_cast<std::uint32_t>(qp.eng->state()));
  log::info("virtio-rdma: the move did not happen; {} QPs re-created here on {} ({} could not be); peers elsewhere see "
            "what they would after a move",
            stopped.size() - lost, d.engine->name(), lost);
}

}  // namespace vrdma::migration
