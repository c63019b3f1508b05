// Requester (IBA 9.4, 9.7.1): turns send work requests into packets, segmenting at the path
// MTU, and retransmits from a PSN when the completer asks (go-back-N).
#include <algorithm>

#include "soft/engine.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::nicdrv::soft {
namespace {

using wire::Opcode;

std::uint32_t packets_for(std::uint32_t len, std::uint32_t mtu) { return len == 0 ? 1 : (len + mtu - 1) / mtu; }

// Opcode of packet k of n for SEND/WRITE (IBA table 38).
Opcode seg_opcode(WrOpcode op, std::uint32_t k, std::uint32_t n) {
  bool first = k == 0, last = k + 1 == n;
  switch (op) {
    case WrOpcode::send:
      return first && last ? Opcode::rc_send_only : first ? Opcode::rc_send_first : last ? Opcode::rc_send_last : Opcode::rc_send_middle;
    case WrOpcode::send_with_imm:
      return first && last ? Opcode::rc_send_only_imm
             : first       ? Opcode::rc_send_first
             : last        ? Opcode::rc_send_last_imm
                           : Opcode::rc_send_middle;
    case WrOpcode::send_with_inv:
      return first && last ? Opcode::rc_send_only_inv
             : first       ? Opcode::rc_send_first
             : last        ? Opcode::rc_send_last_inv
                           : Opcode::rc_send_middle;
    case WrOpcode::rdma_write:
      return first && last ? Opcode::rc_write_only : first ? Opcode::rc_write_first : last ? Opcode::rc_write_last : Opcode::rc_write_middle;
    case WrOpcode::rdma_write_with_imm:
      return first && last ? Opcode::rc_write_only_imm
             : first       ? Opcode::rc_write_first
             : last        ? Opcode::rc_write_last_imm
                           : Opcode::rc_write_middle;
    default:
      return Opcode::rc_send_only;
  }
}

}  // namespace

// Copies payload bytes [offset, offset+len) of a WQE into dst.
static WcStatus wqe_payload(SoftDevice& d, const SoftQp& qp, const SendWqe& w, std::uint32_t offset, std::uint8_t* dst,
                            std::uint32_t len) {
  if (w.is_inline) {
    std::memcpy(dst, w.inline_data.data() + offset, len);
    return WcStatus::success;
  }
  return d.gather(qp, w.sge.data(), w.num_sge, offset, dst, len);
}

static void send_ud(SoftDevice& d, SoftQp& qp, SendWqe& w) {
  if (w.length > qp.pmtu() || w.length > mtu_bytes(d.active_mtu())) {
    d.complete_send(qp, w, WcStatus::loc_len_err);
    return;
  }
  wire::Headers h;
  h.bth.opcode = w.opcode == WrOpcode::send_with_imm ? Opcode::ud_send_only_imm : Opcode::ud_send_only;
  h.bth.solicited = w.solicited;
  h.bth.dest_qp = w.ud_qpn;
  h.bth.psn = qp.send_psn;
  // IBA 10.2.5: a Q_Key with the high bit set means "use the QP's own Q_Key".
  h.deth.qkey = (w.ud_qkey & 0x80000000u) != 0 ? qp.attr.qkey : w.ud_qkey;
  h.deth.src_qp = qp.qp_num();
  h.imm = w.imm;
  std::uint8_t* p = d.pkt_begin(w.ud_dst_ip_be, h, w.length);
  WcStatus s = wqe_payload(d, qp, w, 0, p, w.length);
  if (s != WcStatus::success) {
    d.pkt_abort();
    d.complete_send(qp, w, s);
    return;
  }
  d.pkt_end();
  qp.send_psn = wire::psn_add(qp.send_psn, 1);
  d.complete_send(qp, w, WcStatus::success);
}

void SoftDevice::request_read(SoftQp& qp, SendWqe& w, std::uint32_t from) {
  const std::uint32_t mtu = qp.pmtu();
  from = std::max(from, w.resp_pkts);
  if (from >= w.npkts) return;  // all of it is here
  const std::uint32_t to = w.next_had(from);
  const auto off = static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{from} * mtu, w.length));
  wire::Headers h;
  h.bth.dest_qp = qp.attr.dest_qp_num;
  h.bth.psn = wire::psn_add(w.first_psn, from);
  h.bth.opcode = Opcode::rc_read_request;
  h.bth.ack_req = false;
  h.reth.va = w.remote_addr + off;
  h.reth.rkey = w.rkey;
  h.reth.dma_len = static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{to} * mtu, w.length)) - off;
  send_packet(qp.dst_ip(), h, {});
  if (from != 0 || w.req_end != 0) ++st.read_rereads;
  w.req_from = from;
  w.req_end = to;
  w.req_seq = ++qp.read_requests;
  w.req_heard = false;
}

WcStatus SoftDevice::local_op(SoftQp& qp, const SendWqe& w) {
  if (w.opcode == WrOpcode::local_inv) {
    // Any region of the QP's PD that may be invalidated (a fast-registration one, or one made
    // with MrOptions::remote_invalidate), valid or not (IBA 10.6.4.4).
    auto it = mrs.find(w.imm);
    if (it == mrs.end() || !it->second->remote_invalidate() || it->second->pd() != qp.pd.get()) {
      log::debug("soft {}: QP {}: LOCAL_INV of key {:#x}, which names no region of the QP's PD that may be invalidated",
                 name_, qp.qp_num(), w.imm);
      return WcStatus::loc_qp_op_err;
    }
    it->second->invalidate();
    ++st.local_invalidations;
    return WcStatus::success;
  }
  auto it = fast_mrs.find(w.reg.index);
  SoftMr* const found = it == fast_mrs.end() ? nullptr : it->second;
  const char* why = nullptr;
  if (found == nullptr)
    why = "the region is gone";
  else if (found->valid())
    why = "the region is valid (LOCAL_INV it first)";
  else if (found->pd() != qp.pd.get())
    why = "the region is of another PD";
  else if (auto other = mrs.find(w.reg.key); other != mrs.end() && other->second != found)
    why = "the new key is another region's";
  if (why != nullptr) {
    log::debug("soft {}: QP {}: REG_MR with key {:#x} refused: {}", name_, qp.qp_num(), w.reg.key, why);
    return WcStatus::loc_qp_op_err;
  }
  SoftMr& mr = *found;
  mrs.erase(mr.lkey());
  // The region starts at iova's offset into its first page of the memory at addr.
  mr.assign(w.reg.addr, w.reg.length, w.reg.iova, w.reg.access, w.reg.key);
  mrs[w.reg.key] = &mr;
  ++st.fast_registrations;
  return WcStatus::success;
}

bool SoftDevice::requester_run(SoftQp& qp, std::size_t budget) {
  if (is_datagram(qp.type())) {
    for (; budget > 0 && qp.sq_next != qp.sq_tail && qp.state() == QpState::rts; --budget) {
      SendWqe& w = qp.wqe(qp.sq_next);
      ++qp.sq_next;
      send_ud(*this, qp, w);
    }
    retire_completed(qp);
    return budget == 0 && qp.sq_next != qp.sq_tail;
  }
  if (qp.rnr_wait) return false;
  // An ACK for packets sent before a go-back-N may have overtaken the retransmission point.
  if (wire::psn_lt(qp.send_psn, qp.una_psn)) seek(qp, qp.una_psn);
  const std::uint32_t mtu = qp.pmtu();
  // A request that ends where it stands, without a packet: no PSNs, its completion in order.
  auto complete_here = [&](SendWqe& w, WcStatus s) {
    ++qp.sq_next;
    w.started = true;
    w.npkts = 0;
    w.first_psn = qp.next_new_psn;
    complete_send(qp, w, s);
  };
  while (budget > 0 && qp.sq_next != qp.sq_tail) {
    SendWqe& w = qp.wqe(qp.sq_next);
    if (!w.started) {
      // SQD: finish what is in flight, start nothing new (IBA 10.3.1 "SQ drain").
      if (qp.state() == QpState::sqd) break;
      if (is_rd_atomic(w.opcode) && qp.rd_atomic_outstanding >= qp.attr.max_rd_atomic) break;
      // Fence: wait for every earlier READ/atomic to complete.
      if (w.fence && qp.rd_atomic_outstanding > 0) break;
      if (is_local_op(w.opcode)) {
        // LOCAL_INV and REG_MR run now, in order, and complete when every earlier request has
        // (retire_completed); fenced, they wait for that first (IBA 10.8.3.3).
        if (w.fence && qp.sq_head != qp.sq_next) break;
        const WcStatus s = local_op(qp, w);
        complete_here(w, s);
        if (s != WcStatus::success) return false;
        --budget;
        continue;
      }
      if ((w.opcode == WrOpcode::atomic_cmp_and_swp || w.opcode == WrOpcode::atomic_fetch_and_add) && w.length != 8) {
        // The atomic result is 8 bytes; any other local length is a local length error.
        complete_here(w, WcStatus::loc_len_err);
        continue;
      }
      w.started = true;
      w.first_psn = qp.next_new_psn;
      w.npkts = w.opcode == WrOpcode::rdma_read ? packets_for(w.length, mtu)
                : is_rd_atomic(w.opcode)        ? 1
                                                : packets_for(w.length, mtu);
      qp.next_new_psn = wire::psn_add(qp.next_new_psn, w.npkts);
      if (is_rd_atomic(w.opcode)) ++qp.rd_atomic_outstanding;
    }
    // Window: bound the unacknowledged packets in flight.
    if (static_cast<std::uint32_t>(wire::psn_diff(qp.send_psn, qp.una_psn)) >= qp.cwnd) break;
    std::uint32_t k = static_cast<std::uint32_t>(wire::psn_diff(qp.send_psn, w.first_psn));
    if (k >= w.npkts) {  // nothing left of this one (already sent in full)
      ++qp.sq_next;
      continue;
    }
    wire::Headers h;
    h.bth.dest_qp = qp.attr.dest_qp_num;
    h.bth.psn = qp.send_psn;
    if (w.opcode == WrOpcode::rdma_read) {
      // One request for the data from packet k up to the next packet already received (a
      // retransmission restarts mid-message, 9.7.5.1.4, and asks only for what is missing).
      request_read(qp, w, k);
      qp.send_psn = wire::psn_add(w.first_psn, w.npkts);
      ++qp.sq_next;
      --budget;
    } else if (w.opcode == WrOpcode::atomic_cmp_and_swp || w.opcode == WrOpcode::atomic_fetch_and_add) {
      h.bth.opcode = w.opcode == WrOpcode::atomic_cmp_and_swp ? Opcode::rc_compare_swap : Opcode::rc_fetch_add;
      h.atomic.va = w.remote_addr;
      h.atomic.rkey = w.rkey;
      h.atomic.swap_add = w.opcode == WrOpcode::atomic_cmp_and_swp ? w.swap : w.compare_add;
      h.atomic.compare = w.opcode == WrOpcode::atomic_cmp_and_swp ? w.compare_add : 0;
      send_packet(qp.dst_ip(), h, {});
      qp.send_psn = wire::psn_add(qp.send_psn, 1);
      ++qp.sq_next;
      --budget;
    } else {
      std::uint32_t off = k * mtu;
      std::uint32_t len = std::min(mtu, w.length - std::min(off, w.length));
      h.bth.opcode = seg_opcode(w.opcode, k, w.npkts);
      const auto& oi = wire::info(h.bth.opcode);
      bool last = (oi.flags & wire::kIsLast) != 0;
      h.bth.solicited = last && w.solicited;
      // Ask for an ACK at message ends, every 32 packets, and at half and all of a smaller
      // congestion window, so long messages free the window.
      const auto in_flight = static_cast<std::uint32_t>(wire::psn_diff(qp.send_psn, qp.una_psn)) + 1;
      h.bth.ack_req = last || (k % 32) == 31 || in_flight == qp.cwnd || in_flight == qp.cwnd / 2 || qp.ack_next;
      qp.ack_next = false;
      // Sample the round trip on a first transmission that asks for an ACK.
      if (h.bth.ack_req && qp.rtt_sent == TimePoint{} && !qp.retx_pending && !wire::psn_lt(qp.send_psn, qp.sent_high)) {
        qp.rtt_psn = qp.send_psn;
        qp.rtt_sent = Clock::now();
      }
      if ((oi.flags & wire::kHasReth) != 0) {
        h.reth.va = w.remote_addr;
        h.reth.rkey = w.rkey;
        h.reth.dma_len = w.length;
      }
      h.imm = w.imm;
      h.ieth = w.imm;  // SEND_WITH_INV keeps its R_Key where SEND_WITH_IMM keeps ImmDt
      std::uint8_t* p = pkt_begin(qp.dst_ip(), h, len, len == mtu);
      WcStatus s = wqe_payload(*this, qp, w, off, p, len);
      if (s != WcStatus::success) {
        // Local protection/length error: complete in error, QP to ERR (IBA 10.8.3.1 class B).
        pkt_abort();
        w.status = s;
        w.done = true;
        complete_send(qp, w, s);
        move_to_error(qp);
        return false;
      }
      pkt_end();
      qp.send_psn = wire::psn_add(qp.send_psn, 1);
      if (k + 1 == w.npkts) ++qp.sq_next;
      --budget;
    }
    if (!wire::psn_lt(qp.send_psn, qp.sent_high)) qp.sent_high = qp.send_psn;
    if (qp.retx_deadline == TimePoint{}) {
      qp.retx_deadline = retx_interval(qp);
      arm_probe(qp);
      rearm(qp);
    }
  }
  return budget == 0 && qp.sq_next != qp.sq_tail;
}

}  // namespace vrdma::nicdrv::soft
