// Doorbells and work requests: the guest writes WQEs into its rings and rings a doorbell; the
// device reads each WQE once, checks it, and hands the engine a work request whose scatter/
// gather entries point straight at the guest's registered memory (the engine checks lkeys and
// bounds against the region, which covers only guest pages). A WQE the device cannot accept
// completes with an error; a full engine queue leaves the rest in the ring for later.
#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include "vrdma/device/model.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::device {

namespace {
constexpr std::size_t kBatch = 32;

// Grows `v` to at least `n` elements and never shrinks it: the data path's scratch memory.
template <class T>
void grow(std::vector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}
}

void DeviceModel::doorbells(vhost::Queue& q) {
  while (auto chain = q.pop()) {
    vhost::ChainReader r(q.memory(), *chain);
    std::array<vd::Doorbell, 64> dbs;
    while (r.remaining() >= sizeof(vd::Doorbell)) {
      const auto n = std::min<std::uint64_t>(dbs.size(), r.remaining() / sizeof(vd::Doorbell));
      if (!r.read(dbs.data(), n * sizeof(vd::Doorbell)).ok()) break;
      for (std::size_t i = 0; i < n; ++i) {
        ++st.doorbells;
        ring_doorbell(q.memory(), dbs[i]);
      }
    }
    if (!q.push(*chain, 0).ok()) return;
  }
  // A notification of this queue is also how a process says it wrote into its doorbell ring.
  if (!db_rings.empty()) ring_doorbell_rings(q.memory());
  if (!events.empty() && host != nullptr && host->queue_running(vd::kEventQueue)) host->run_queue(vd::kEventQueue);
}

void DeviceModel::ring_doorbell(const vhost::GuestView& g, const vd::Doorbell& db, std::uint32_t from) {
  auto bad = [&](std::string why) {
    ++st.doorbell_errors;
    if (should_log_refusal(Refused::doorbell))
      log::warn("virtio-rdma: doorbell{} ignored: {}", from != 0 ? fmt::format(" from doorbell ring {}", from) : "", why);
  };
  // A ring's records name only the objects made with that ring (another process's are not its to ring).
  auto foreign = [&](std::string_view kind, std::uint32_t owner) {
    if (from == 0 || owner == from) return false;
    bad(fmt::format("{} {} was not created with this ring", kind, db.handle));
    return true;
  };
  switch (static_cast<vd::DoorbellKind>(db.kind)) {
    case vd::DoorbellKind::sq:
    case vd::DoorbellKind::rq: {
      auto it = qps.find(db.handle);
      if (it == qps.end()) return bad(fmt::format("no QP {}", db.handle));
      auto& qp = it->second;
      if (foreign("QP", qp.db_ring)) return;
      const bool sq = db.kind == static_cast<std::uint16_t>(vd::DoorbellKind::sq);
      WorkRing& ring = sq ? qp.sq : qp.rq;
      if (!sq && qp.srq != vd::kNoHandle) return bad(fmt::format("QP {} receives through an SRQ; it has no receive ring", db.handle));
      if (db.value - ring.consumed > ring.depth)
        return bad(fmt::format("QP {} {} producer {} is more than the ring's {} entries ahead of the device ({})",
                               db.handle, sq ? "send" : "receive", db.value, ring.depth, ring.consumed));
      ring.produced = db.value;
      if (polling) hot_cqs.insert(sq ? qp.send_cq : qp.recv_cq);
      if (sq)
        post_sq(g, db.handle, qp);
      else
        post_rq(g, db.handle, qp);
      return;
    }
    case vd::DoorbellKind::srq: {
      auto it = srqs.find(db.handle);
      if (it == srqs.end()) return bad(fmt::format("no SRQ {}", db.handle));
      auto& s = it->second;
      if (foreign("SRQ", s.db_ring)) return;
      if (db.value - s.ring.consumed > s.ring.depth)
        return bad(fmt::format("SRQ {} producer {} is more than {} entries ahead of the device ({})", db.handle, db.value,
                               s.ring.depth, s.ring.consumed));
      s.ring.produced = db.value;
      post_srq(g, db.handle, s);
      return;
    }
    case vd::DoorbellKind::cq_arm: {
      auto it = cqs.find(db.handle);
      if (it == cqs.end()) return bad(fmt::format("no CQ {}", db.handle));
      if (foreign("CQ", it->second.db_ring)) return;
      it->second.armed = true;
      it->second.solicited_only = db.value == 1;
      // Completions that arrived before the arm but after the driver's last poll would be
      // missed: if the ring holds unpolled CQEs, a plain arm fires at once.
      auto consumer = g.read_obj<std::uint32_t>(it->second.ring_gpa + offsetof(vd::CqControl, consumer));
      if (db.value == 0 && consumer && *consumer != it->second.produced && !it->second.event_queued) {
        it->second.armed = false;
        it->second.event_queued = true;
        queue_event(vd::EventType::cq_completion, db.handle);
      }
      drain_cq(db.handle);
      return;
    }
  }
  bad(fmt::format("unknown doorbell kind {}", db.kind));
}

void DeviceModel::write_status(const vhost::GuestView& g, std::uint64_t gpa, std::uint32_t sq, std::uint32_t rq,
                                    std::uint32_t state) {
  vd::QpStatus s{};
  s.sq_consumed = sq;
  s.rq_consumed = rq;
  s.state = state;
  (void)g.write(gpa, &s, offsetof(vd::QpStatus, reserved));
}

void DeviceModel::error_cqe(const vhost::GuestView& g, std::uint32_t cq_handle, std::uint64_t wr_id, std::uint32_t qp_num,
                                 bool recv, nicdrv::WcStatus status) {
  if (status != nicdrv::WcStatus::wr_flush_err) ++st.wqe_errors;
  auto it = cqs.find(cq_handle);
  if (it == cqs.end()) return;
  vd::Cqe c{};
  c.wr_id = wr_id;
  c.qp_num = qp_num;
  c.status = static_cast<std::uint8_t>(status);
  c.opcode = recv ? 128 : 0;
  if (!write_cqe(cq_handle, it->second, g, c))
    log::warn("virtio-rdma: CQ {} is full; the {} completion of work request {:#x} is lost", cq_handle,
              nicdrv::to_string(status), wr_id);
}

namespace {
constexpr std::size_t kMaxInlineAhs = 1024;
}  // namespace

Result<nicdrv::AddressHandle*> DeviceModel::inline_ah(std::uint32_t pd, const vd::AhWire& av) {
  auto pit = pds.find(pd);
  if (pit == pds.end()) return make_error(Errc::not_found, fmt::format("no PD {}", pd));
  auto& cache = pit->second.inline_ahs;
  std::string key(reinterpret_cast<const char*>(&av), sizeof av);
  if (auto it = cache.find(key); it != cache.end()) return it->second.get();
  auto ah = pit->second.eng->create_ah(engine_ah(av));
  if (!ah) return std::move(ah).error();
  return cache.emplace(std::move(key), std::move(*ah)).first->second.get();
}

void DeviceModel::post_sq(const vhost::GuestView& g, std::uint32_t handle, QpObj& qp) {
  if (paused) return;
  if (qp.send_held) {  // paused for a moving peer (migration/src/peer.cpp)
    if (qp.sq.consumed != qp.sq.produced) pending_sq.insert(handle);
    return;
  }
  // The engines take the address at post time: between batches no AH of the cache is referenced,
  // so a full cache is emptied here (a batch adds at most kBatch).
  if (auto p = pds.find(qp.pd); p != pds.end() && p->second.inline_ahs.size() >= kMaxInlineAhs)
    p->second.inline_ahs.clear();
  std::array<nicdrv::SendWr, kBatch> wrs;
  std::array<std::uint64_t, kBatch> slot_idx{};
  grow(send_sge_scratch, kBatch * qp.max_send_sge);
  grow(inline_scratch, kBatch * std::max<std::uint32_t>(qp.max_inline, 1));
  std::vector<nicdrv::Sge>& sges = send_sge_scratch;
  std::vector<std::uint8_t>& inl = inline_scratch;
  bool engine_full = false;
  while (qp.sq.consumed != qp.sq.produced && !engine_full) {
    std::size_t n = 0;
    std::uint32_t idx = qp.sq.consumed;
    while (n < kBatch && idx != qp.sq.produced) {
      const std::uint64_t gpa = qp.sq.gpa + std::uint64_t{idx & (qp.sq.depth - 1)} * qp.sq.stride;
      auto w = g.read_obj<vd::SendWqe>(gpa);
      auto reject = [&](std::string why) {
        if (should_log_refusal(Refused::wqe)) log::warn("virtio-rdma: QP {} send WQE {} refused: {}", handle, idx, why);
        error_cqe(g, qp.send_cq, w ? w->wr_id : 0, qp.guest_qpn, false);
      };
      if (!w) {
        reject("its ring slot is outside guest memory");
      } else if (w->opcode > 6 && !fast_reg_opcode(w->opcode)) {
        reject(fmt::format("opcode {} is not a work request opcode", w->opcode));
      } else if (w->opcode > 6 && fast_mrs_allowed() == 0) {
        reject(fmt::format("opcode {} is fast registration's, which this device does not offer", w->opcode));
      } else if (w->opcode == vd::kWrRegMr) {
        // Its 64 bytes are a RegMrWqe: no SGEs, remote address or payload.
        vd::RegMrWqe reg;
        std::memcpy(&reg, &*w, sizeof reg);
        nicdrv::SendWr& wr = wrs[n];
        wr = nicdrv::SendWr{};
        wr.wr_id = reg.wr_id;
        wr.opcode = nicdrv::WrOpcode::reg_mr;
        wr.flags = nicdrv::send_flags_from_wire(reg.flags);
        if (auto s = fast_register(g, qp.pd, reg, wr); !s.ok()) {
          reject("REG_MR: " + s.error().message);
        } else {
          slot_idx[n] = idx;
          ++n;
        }
      } else if ((w->flags & vd::kSendInline) != 0 && w->inline_len > qp.max_inline) {
        reject(fmt::format("{} inline bytes exceed the QP's {}", w->inline_len, qp.max_inline));
      } else if ((w->flags & vd::kSendInline) == 0 && w->num_sge > qp.max_send_sge) {
        reject(fmt::format("{} SGEs exceed the QP's {}", w->num_sge, qp.max_send_sge));
      } else {
        nicdrv::SendWr& wr = wrs[n];
        wr = nicdrv::SendWr{};
        wr.wr_id = w->wr_id;
        wr.opcode = static_cast<nicdrv::WrOpcode>(w->opcode);
        wr.flags = nicdrv::send_flags_from_wire(w->flags);
        wr.imm_data = w->imm_data;
        wr.rdma.remote_addr = w->remote_addr;
        wr.rdma.rkey = w->rkey;
        if (qp.local_peer && !rkey_to_engine.empty())  // a moved region of this device (migration/src/rebuild.cpp)
          if (auto k = rkey_to_engine.find(w->rkey); k != rkey_to_engine.end()) wr.rdma.rkey = k->second;
        if (!qp.remote_rkeys.empty())  // the peer's regions after it moved onto a NIC (migration/src/peer.cpp)
          if (auto k = qp.remote_rkeys.find(w->rkey); k != qp.remote_rkeys.end()) wr.rdma.rkey = k->second;
        wr.atomic.remote_addr = w->remote_addr;
        wr.atomic.rkey = wr.rdma.rkey;
        wr.atomic.compare_add = w->compare_add;
        wr.atomic.swap = w->swap;
        bool ok = true;
        if (w->opcode == vd::kWrLocalInv || w->opcode == vd::kWrSendWithInv) {
          wr.invalidate_rkey = w->imm_data;  // ours to invalidate, or the peer's
          wr.imm_data = 0;
        }
        // Where the SGEs or inline bytes start: after the inline address vector when there is one.
        const bool inline_av = (w->flags & vd::kSendInlineAv) != 0;
        const std::uint64_t body = sizeof(vd::SendWqe) + (inline_av ? vd::kInlineAvSize : 0);
        const std::uint64_t payload =
            (w->flags & vd::kSendInline) != 0 ? w->inline_len : std::uint64_t{w->num_sge} * sizeof(vd::WireSge);
        if (inline_av && (!nicdrv::is_datagram(qp.type) || body + payload > qp.sq.stride)) {
          reject(nicdrv::is_datagram(qp.type)
                     ? fmt::format("its address vector and {} bytes of SGEs or inline data exceed the ring's {}-byte "
                                   "stride", payload, qp.sq.stride)
                     : std::string("an inline address vector on a connected QP"));
          ok = false;
        } else if (inline_av) {
          auto av = g.read_obj<vd::AhWire>(gpa + sizeof(vd::SendWqe));
          auto ah = av ? inline_ah(qp.pd, *av) : Result<nicdrv::AddressHandle*>(av.error());
          if (!ah) {
            reject("its address vector: " + ah.error().message);
            ok = false;
          } else {
            wr.ud.ah = *ah;
          }
        } else if (nicdrv::is_datagram(qp.type)) {
          auto ah = ahs.find(w->ah);
          if (ah == ahs.end() || ah->second.pd != qp.pd) {
            reject(fmt::format("AH {} does not exist in the QP's PD {}", w->ah, qp.pd));
            ok = false;
          } else {
            wr.ud.ah = ah->second.eng.get();
          }
        }
        if (ok && nicdrv::is_datagram(qp.type)) {  // the AH came from its handle or the WQE
          wr.ud.remote_qpn = w->remote_qpn;
          wr.ud.remote_qkey = w->remote_qkey;
        }
        if (ok && (w->flags & vd::kSendInline) != 0) {
          // Inline payload lives in the WQE itself: the engine copies it at post time.
          std::uint8_t* dst = inl.data() + n * std::max<std::uint32_t>(qp.max_inline, 1);
          if (w->inline_len > 0 && !g.read(gpa + body, dst, w->inline_len).ok()) {
            reject("its inline data is outside guest memory");
            ok = false;
          } else {
            nicdrv::Sge& s = sges[n * qp.max_send_sge];
            s = nicdrv::Sge{reinterpret_cast<std::uint64_t>(dst), w->inline_len, 0};
            wr.sg_list = std::span<const nicdrv::Sge>(&s, w->inline_len > 0 ? 1 : 0);
          }
        } else if (ok && w->num_sge > 0) {
          std::array<vd::WireSge, 16> ws;
          if (w->num_sge > ws.size() || !g.read(gpa + body, ws.data(), w->num_sge * sizeof(vd::WireSge)).ok()) {
            reject("its SGEs are outside guest memory");
            ok = false;
          } else {
            for (std::size_t k = 0; k < w->num_sge; ++k)
              sges[n * qp.max_send_sge + k] = nicdrv::Sge{ws[k].addr, ws[k].length, engine_lkey(ws[k].lkey, ws[k].addr)};
            wr.sg_list = std::span<const nicdrv::Sge>(&sges[n * qp.max_send_sge], w->num_sge);
          }
        }
        if (ok) {
          slot_idx[n] = idx;
          ++n;
        }
      }
      ++idx;
    }
    std::size_t posted = n;
    if (n > 0) {
      std::size_t bad = n;
      auto s = qp.eng->post_send(std::span<const nicdrv::SendWr>(wrs.data(), n), &bad);
      if (!s.ok()) {
        posted = bad;
        if (s.error().is(Errc::would_block) || s.error().is(Errc::bad_state)) {
          // Engine queue full (or QP not yet able to send): the rest waits in the ring.
          engine_full = true;
          idx = static_cast<std::uint32_t>(slot_idx[bad]);
          pending_sq.insert(handle);
        } else {
          if (should_log_refusal(Refused::wqe))
            log::warn("virtio-rdma: QP {} send WQE {} refused by the engine: {}", handle, slot_idx[bad], s.error().message);
          error_cqe(g, qp.send_cq, wrs[bad].wr_id, qp.guest_qpn, false);
          idx = static_cast<std::uint32_t>(slot_idx[bad] + 1);  // continue after the bad one
        }
      }
    }
    st.send_wqes += posted;
    qp.sq.consumed = idx;
  }
  if (qp.sq.consumed == qp.sq.produced) pending_sq.erase(handle);
  write_status(g, qp.status_gpa, qp.sq.consumed, qp.rq.consumed, static_cast<std::uint32_t>(qp.eng->state()));
}

namespace {

// Reads receive WQEs [consumed, produced) of `ring` and posts them with `post`; shared by QP
// receive rings and SRQs. `take(wqe, guest SGEs)` sees each WQE that goes to `post` and gives
// the wr_id the engine gets for it.
template <class Post, class Reject, class Key, class Take>
void post_recv_ring(const vhost::GuestView& g, WorkRing& ring, std::uint32_t max_sge, std::vector<nicdrv::Sge>& sges,
                    Post&& post, Reject&& reject, bool& full, std::uint64_t& count, Key&& key, Take&& take) {
  std::array<nicdrv::RecvWr, kBatch> wrs;
  std::array<std::uint32_t, kBatch> slot{};
  grow(sges, kBatch * max_sge);
  full = false;
  while (ring.consumed != ring.produced && !full) {
    std::size_t n = 0;
    std::uint32_t idx = ring.consumed;
    while (n < kBatch && idx != ring.produced) {
      const std::uint64_t gpa = ring.gpa + std::uint64_t{idx & (ring.depth - 1)} * ring.stride;
      auto w = g.read_obj<vd::RecvWqe>(gpa);
      std::array<vd::WireSge, 16> ws;
      if (!w) {
        reject(0, idx, "its ring slot is outside guest memory");
      } else if (w->num_sge > max_sge || w->num_sge > ws.size()) {
        reject(w->wr_id, idx, fmt::format("{} SGEs exceed the queue's {}", w->num_sge, max_sge));
      } else if (w->num_sge > 0 && !g.read(gpa + sizeof(vd::RecvWqe), ws.data(), w->num_sge * sizeof(vd::WireSge)).ok()) {
        reject(w->wr_id, idx, "its SGEs are outside guest memory");
      } else {
        for (std::size_t k = 0; k < w->num_sge; ++k) sges[n * max_sge + k] = nicdrv::Sge{ws[k].addr, ws[k].length, key(ws[k].lkey, ws[k].addr)};
        wrs[n] = nicdrv::RecvWr{take(*w, std::span<const vd::WireSge>(ws.data(), w->num_sge)),
                                std::span<const nicdrv::Sge>(&sges[n * max_sge], w->num_sge)};
        slot[n++] = idx;
      }
      ++idx;
    }
    if (n > 0) {
      std::size_t bad = n;
      auto s = post(std::span<const nicdrv::RecvWr>(wrs.data(), n), &bad);
      if (!s.ok()) {
        if (s.error().is(Errc::would_block) || s.error().is(Errc::bad_state)) {
          full = true;
          idx = slot[bad];
        } else {
          reject(wrs[bad].wr_id, slot[bad], "refused by the engine: " + s.error().message);
          idx = slot[bad] + 1;
        }
        n = bad;
      }
    }
    count += n;
    ring.consumed = idx;
  }
}

}  // namespace

void DeviceModel::post_rq(const vhost::GuestView& g, std::uint32_t handle, QpObj& qp) {
  if (paused) return;
  bool full = false;
  // Receives posted to a QP in ERR complete with a flush error (IBA 10.8.3.1). A NIC may leave
  // them posted instead (Linux rxe 6.1, siw), and a guest's doorbell can reach the NIC after
  // the peer's error did: flush them here, behind what the NIC flushed already.
  const auto state = qp.eng->state();
  const bool flush_here = !engine_reports_writes && state == nicdrv::QpState::err;
  if (flush_here && qp.rq.consumed != qp.rq.produced) drain_cq(qp.recv_cq);
  post_recv_ring(
      g, qp.rq, qp.max_recv_sge, recv_sge_scratch,
      [&](std::span<const nicdrv::RecvWr> w, std::size_t* bad) -> Status {
        if (!flush_here) return qp.eng->post_recv(w, bad);
        for (const auto& r : w) error_cqe(g, qp.recv_cq, r.wr_id, qp.guest_qpn, true, nicdrv::WcStatus::wr_flush_err);
        return {};
      },
      [&](std::uint64_t wr_id, std::uint32_t idx, const std::string& why) {
        if (should_log_refusal(Refused::wqe)) log::warn("virtio-rdma: QP {} receive WQE {} refused: {}", handle, idx, why);
        error_cqe(g, qp.recv_cq, wr_id, qp.guest_qpn, true);
      },
      full, st.recv_wqes, [this](std::uint32_t k, std::uint64_t a) { return engine_lkey(k, a); },
      [](const vd::RecvWqe& w, std::span<const vd::WireSge>) { return w.wr_id; });
  if (full)
    pending_rq.insert(handle);
  else
    pending_rq.erase(handle);
  write_status(g, qp.status_gpa, qp.sq.consumed, qp.rq.consumed, static_cast<std::uint32_t>(state));
}

void DeviceModel::post_srq(const vhost::GuestView& g, std::uint32_t handle, SrqObj& s) {
  if (paused) return;
  bool full = false;
  // On a NIC the device keeps what it posts (SrqObj::held), under tags of its own.
  const bool hold = engine_rebuilds();
  post_recv_ring(
      g, s.ring, s.max_sge, recv_sge_scratch,
      [&](std::span<const nicdrv::RecvWr> w, std::size_t* bad) {
        std::size_t at = w.size();
        auto r = s.eng->post_recv(w, &at);
        if (bad != nullptr) *bad = at;
        if (hold) {
          // What the engine did not take is not held; the NIC holds at most the SRQ's depth,
          // so older entries are receives it lost (a QP destroyed while filling one).
          for (std::size_t i = r.ok() ? w.size() : at; i < w.size() && !s.held.empty(); ++i) s.held.pop_back();
          while (s.held.size() > s.ring.depth) s.held.pop_front();
        }
        return r;
      },
      [&](std::uint64_t wr_id, std::uint32_t idx, const std::string& why) {
        ++st.wqe_errors;
        if (should_log_refusal(Refused::wqe))
          log::warn("virtio-rdma: SRQ {} WQE {} (wr_id {:#x}) refused and dropped: {}", handle, idx, wr_id, why);
      },
      full, st.recv_wqes, [this](std::uint32_t k, std::uint64_t a) { return engine_lkey(k, a); },
      [&](const vd::RecvWqe& w, std::span<const vd::WireSge> ws) -> std::uint64_t {
        if (!hold) return w.wr_id;
        SrqObj::Held h;
        h.tag = s.next_tag++;
        h.wr_id = w.wr_id;
        h.nsge = static_cast<std::uint32_t>(ws.size());
        std::copy(ws.begin(), ws.end(), h.sge.begin());
        s.held.push_back(h);
        return h.tag;
      });
  if (full)
    pending_srq.insert(handle);
  else
    pending_srq.erase(handle);
  write_status(g, s.status_gpa, 0, s.ring.consumed, 0);
}

void DeviceModel::retry_pending() {
  if (paused || host == nullptr) return;
  const vhost::GuestView g = view();
  std::vector<std::uint32_t>& hs = retry_scratch;
  hs.assign(pending_sq.begin(), pending_sq.end());
  for (auto h : hs)
    if (auto it = qps.find(h); it != qps.end()) post_sq(g, h, it->second);
  hs.assign(pending_rq.begin(), pending_rq.end());
  for (auto h : hs)
    if (auto it = qps.find(h); it != qps.end()) post_rq(g, h, it->second);
  hs.assign(pending_srq.begin(), pending_srq.end());
  for (auto h : hs)
    if (auto it = srqs.find(h); it != srqs.end()) post_srq(g, h, it->second);
}

}  // namespace vrdma::device
