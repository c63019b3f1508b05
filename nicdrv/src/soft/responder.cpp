// Responder (IBA 9.7.4, 9.7.5.1): executes incoming requests in PSN order, checks every
// remote access against the MR's bounds and rights, answers with ACK/NAK/RNR NAK, streams READ
// responses and replays READ and atomic responses for duplicates.
#include <algorithm>

#include "soft/engine.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::nicdrv::soft {
namespace {

using wire::Opcode;

void queue_ack(SoftDevice& d, SoftQp& qp, std::uint32_t psn) {
  qp.ack_psn = psn;
  if (!qp.ack_pending) {
    qp.ack_pending = true;
    d.acks.push_back(&qp);
  }
}

// Takes the next receive WQE from the SRQ or the QP's RQ.
bool take_recv(SoftQp& qp, RecvWqe& out) {
  auto& q = qp.srq ? qp.srq->queue : qp.rq;
  if (q.empty()) return false;
  out = q.front();
  q.pop_front();
  return true;
}

bool recv_available(const SoftQp& qp) { return qp.srq ? !qp.srq->queue.empty() : !qp.rq.empty(); }

// SEND with Invalidate (IBA 9.4.1.3, 10.6.6): the region `rkey` names, in the QP's PD, made
// to allow it (MrOptions::remote_invalidate), becomes invalid. False when there is none such.
bool remote_invalidate(SoftDevice& d, const SoftQp& qp, std::uint32_t rkey) {
  SoftMr* mr = d.find_mr(rkey);
  if (mr == nullptr || mr->pd() != qp.pd.get() || !mr->remote_invalidate()) return false;
  mr->invalidate();
  return true;
}

// MR for a remote access by rkey, checked for PD, rights and bounds; nullptr if any fails.
SoftMr* remote_mr(SoftDevice& d, const SoftQp& qp, std::uint32_t rkey, std::uint64_t va, std::uint64_t len, Access need) {
  if (!has(qp.attr.qp_access_flags, need)) return nullptr;
  SoftMr* mr = d.find_mr(rkey);
  if (mr == nullptr || mr->pd() != qp.pd.get() || !has(mr->access(), need)) return nullptr;
  if (mr->at(va, len) == nullptr) return nullptr;
  return mr;
}

}  // namespace

// Class C/B errors at the responder: NAK the request and move the QP to ERR (IBA 9.7.5.1.3, 10.8.3).
static void responder_fatal(SoftDevice& d, SoftQp& qp, wire::NakCode code, std::uint32_t psn) {
  d.send_ack(qp, wire::AckType::nak, static_cast<std::uint8_t>(code), psn);
  d.move_to_error(qp);
}

static void recv_complete(SoftQp& qp, const RecvWqe& r, WcStatus status, WcOpcode op, std::uint32_t len,
                          bool with_imm, std::uint32_t imm, bool solicited,
                          std::optional<std::uint32_t> invalidated = std::nullopt) {
  WorkCompletion wc;
  wc.wr_id = r.wr_id;
  wc.status = status;
  wc.opcode = op;
  wc.byte_len = len;
  wc.qp_num = qp.qp_num();
  wc.src_qp = qp.attr.dest_qp_num;
  if (with_imm) {
    wc.imm_data = imm;
    wc.wc_flags = WcFlags::with_imm;
  }
  if (invalidated) {
    wc.invalidated_rkey = *invalidated;
    wc.wc_flags = wc.wc_flags | WcFlags::with_inv;
  }
  qp.rcq->push(wc, solicited);
}

static void handle_duplicate(SoftDevice& d, SoftQp& qp, const wire::Packet& pkt) {
  const auto& h = pkt.hdr;
  const std::uint32_t psn = h.bth.psn;
  if (h.bth.opcode == Opcode::rc_read_request) {
    // A READ asked for again from the requested PSN (9.7.5.1.4): the data is read again from
    // memory. The request may ask for part of the READ only (a requester that kept the responses
    // after a lost one asks for the lost ones); it must lie inside the READ, or it is dropped.
    const std::uint32_t mtu = qp.pmtu();
    for (const auto& r : qp.rd_res) {
      if (!r.valid || r.atomic) continue;
      if (!wire::psn_le(r.first_psn, psn) || !wire::psn_le(psn, r.last_psn)) continue;
      const auto k = static_cast<std::uint32_t>(wire::psn_diff(psn, r.first_psn));
      const std::uint32_t npkts = static_cast<std::uint32_t>(wire::psn_diff(r.last_psn, r.first_psn)) + 1;
      const std::uint64_t off = std::uint64_t{k} * mtu;
      if (h.reth.rkey != r.rkey || h.reth.va != r.va + off || off + h.reth.dma_len > r.length) return;
      const std::uint32_t end =
          h.reth.dma_len == 0 ? k + 1 : static_cast<std::uint32_t>((off + h.reth.dma_len + mtu - 1) / mtu);
      auto it = std::find_if(qp.read_jobs.begin(), qp.read_jobs.end(),
                             [&](const ReadJob& j) { return j.first_psn == r.first_psn; });
      if (it != qp.read_jobs.end() && end == it->npkts) {
        // The READ is still streaming and the request runs to its end: start it over from there.
        it->next_psn = psn;
      } else if (qp.read_replays.size() < kMaxReadReplays) {
        qp.read_replays.push_back({ReadJob{r.first_psn, psn, std::min(end, npkts), r.va, r.rkey, r.length, qp.msn},
                                   qp.read_jobs_done + qp.read_jobs.size()});
      } else {
        return;  // more re-reads than we keep: the requester's timer asks again
      }
      d.mark_active(qp);
      return;
    }
    return;  // too old to replay: the requester will time out
  }
  if (h.bth.opcode == Opcode::rc_compare_swap || h.bth.opcode == Opcode::rc_fetch_add) {
    for (const auto& r : qp.rd_res) {
      if (r.valid && r.atomic && r.first_psn == psn) {
        // Never execute an atomic twice: answer with the saved original value (9.7.5.1.4).
        wire::Headers a;
        a.bth.opcode = Opcode::rc_atomic_acknowledge;
        a.bth.dest_qp = qp.attr.dest_qp_num;
        a.bth.psn = psn;
        a.aeth = wire::Aeth::make(wire::AckType::ack, wire::kCreditInvalid, qp.msn);
        a.atomic_ack = r.orig;
        d.send_packet(qp.dst_ip(), a, {});
        return;
      }
    }
    return;
  }
  // SEND/WRITE duplicate: acknowledge what we have (coalesced).
  queue_ack(d, qp, wire::psn_add(qp.e_psn, wire::kPsnMask));
}

void SoftDevice::responder_packet(SoftQp& qp, const wire::Packet& pkt, std::uint32_t) {
  const auto& h = pkt.hdr;
  const std::uint32_t psn = h.bth.psn;
  const std::int32_t diff = wire::psn_diff(psn, qp.e_psn);
  if (diff > 0) {
    // A gap: NAK once with the PSN we expect (9.7.5.1.1), then wait for the retransmission.
    if (!qp.nak_sent) {
      send_ack(qp, wire::AckType::nak, static_cast<std::uint8_t>(wire::NakCode::psn_seq_error), qp.e_psn);
      qp.nak_sent = true;
      ++st.seq_naks_sent;
      log::debug("soft {}: QP {} PSN sequence error: got {:#x}, expecting {:#x}; NAK sent", name(), qp.qp_num(), psn,
                 qp.e_psn);
    }
    return;
  }
  if (diff < 0) {
    ++st.duplicates_received;
    log::debug("soft {}: QP {} duplicate {} PSN {:#x} (expecting {:#x})", name(), qp.qp_num(),
               wire::info(pkt.hdr.bth.opcode).name, psn, qp.e_psn);
    handle_duplicate(*this, qp, pkt);
    return;
  }
  qp.nak_sent = false;
  const auto& oi = wire::info(h.bth.opcode);
  const bool first = (oi.flags & wire::kIsFirst) != 0, last = (oi.flags & wire::kIsLast) != 0;
  const auto len = static_cast<std::uint32_t>(pkt.payload.size());
  const std::uint32_t mtu = qp.pmtu();

  // Opcode sequence (9.7.4.1.2): a message's middle/last only after its first; nothing else between.
  if (first ? (qp.in_send || qp.in_write)
            : (((oi.flags & wire::kIsSend) != 0 && !qp.in_send) || ((oi.flags & wire::kIsWrite) != 0 && !qp.in_write))) {
    responder_fatal(*this, qp, wire::NakCode::invalid_request, psn);
    return;
  }
  // Segment sizes: every packet but the last carries exactly one path MTU.
  if ((oi.flags & wire::kHasPayload) != 0 && (last ? len > mtu : len != mtu)) {
    if (len > mtu) {
      ++st.rx_longer_than_mtu;
      log::info("soft {}: QP {} got a {}-byte {} packet, longer than its path MTU ({}): its peer uses a larger path "
                "MTU; refused (NAK Invalid Request)",
                name(), qp.qp_num(), len, oi.name, mtu);
    }
    responder_fatal(*this, qp, wire::NakCode::invalid_request, psn);
    return;
  }

  if ((oi.flags & wire::kIsSend) != 0) {
    if (first) {
      if (!take_recv(qp, qp.cur_recv)) {
        // Receiver not ready: RNR NAK with our timer; the PSN does not advance (9.7.5.2.8).
        send_ack(qp, wire::AckType::rnr_nak, qp.attr.min_rnr_timer, psn);
        ++st.rnr_naks_sent;
        return;
      }
      qp.have_recv = true;
      qp.recv_offset = 0;
    }
    WcStatus s = scatter(*qp.pd, qp.cur_recv.sge.data(), qp.cur_recv.num_sge, qp.recv_offset, pkt.payload.data(), len);
    if (s != WcStatus::success) {
      recv_complete(qp, qp.cur_recv, s, WcOpcode::recv, 0, false, 0, false);
      qp.have_recv = false;
      responder_fatal(*this, qp, s == WcStatus::loc_len_err ? wire::NakCode::invalid_request : wire::NakCode::remote_op_error,
                      psn);
      return;
    }
    qp.recv_offset += len;
    qp.in_send = !last;
    if (last) {
      bool imm = (oi.flags & wire::kHasImm) != 0;
      std::optional<std::uint32_t> invalidated;
      if ((oi.flags & wire::kHasIeth) != 0) {
        if (!remote_invalidate(*this, qp, h.ieth)) {
          // Class J (rxe does the same): the receive completes in error, the requester hears
          // NAK Invalid Request, and the QP goes to ERR.
          log::warn("soft RoCE: QP {:#x}: a SEND with Invalidate names R_Key {:#x}, which is no region of this QP's PD "
                    "that allows remote invalidation; the QP goes to the error state",
                    qp.qp_num(), h.ieth);
          recv_complete(qp, qp.cur_recv, WcStatus::rem_inv_req_err, WcOpcode::recv, qp.recv_offset, false, 0, false);
          qp.have_recv = false;
          responder_fatal(*this, qp, wire::NakCode::invalid_request, psn);
          return;
        }
        invalidated = h.ieth;
        ++st.remote_invalidations;
      }
      recv_complete(qp, qp.cur_recv, WcStatus::success, WcOpcode::recv, qp.recv_offset, imm, h.imm, h.bth.solicited,
                    invalidated);
      qp.have_recv = false;
      qp.msn = (qp.msn + 1) & 0xffffff;
    }
  } else if ((oi.flags & wire::kIsWrite) != 0) {
    bool imm = (oi.flags & wire::kHasImm) != 0;
    if (imm && !recv_available(qp)) {
      send_ack(qp, wire::AckType::rnr_nak, qp.attr.min_rnr_timer, psn);
      ++st.rnr_naks_sent;
      return;
    }
    if (first) {
      if (h.reth.dma_len > 0 && remote_mr(*this, qp, h.reth.rkey, h.reth.va, h.reth.dma_len, Access::remote_write) == nullptr) {
        responder_fatal(*this, qp, wire::NakCode::remote_access_error, psn);
        return;
      }
      qp.write_va = h.reth.va;
      qp.write_rkey = h.reth.rkey;
      qp.write_left = h.reth.dma_len;
      qp.write_total = h.reth.dma_len;
    }
    if (len > qp.write_left || (last && len != qp.write_left)) {
      responder_fatal(*this, qp, wire::NakCode::invalid_request, psn);
      return;
    }
    if (len > 0) {
      SoftMr* mr = remote_mr(*this, qp, qp.write_rkey, qp.write_va, len, Access::remote_write);
      if (mr == nullptr) {  // deregistered mid-message
        responder_fatal(*this, qp, wire::NakCode::remote_access_error, psn);
        return;
      }
      mr->write(mr->at(qp.write_va, len), pkt.payload.data(), len);
    }
    qp.write_va += len;
    qp.write_left -= len;
    qp.in_write = !last;
    if (last) {
      if (imm) {
        RecvWqe r;
        take_recv(qp, r);
        recv_complete(qp, r, WcStatus::success, WcOpcode::recv_rdma_with_imm, qp.write_total, true, h.imm,
                      h.bth.solicited);
      }
      qp.msn = (qp.msn + 1) & 0xffffff;
    }
  } else if (((oi.flags & wire::kIsRead) != 0 || (oi.flags & wire::kIsAtomic) != 0) && qp.rd_res.empty()) {
    responder_fatal(*this, qp, wire::NakCode::invalid_request, psn);  // no responder resources
    return;
  } else if (h.bth.opcode == Opcode::rc_read_request) {
    if (qp.read_jobs.size() >= qp.attr.max_dest_rd_atomic) {
      responder_fatal(*this, qp, wire::NakCode::invalid_request, psn);
      return;
    }
    if (h.reth.dma_len > 0 && remote_mr(*this, qp, h.reth.rkey, h.reth.va, h.reth.dma_len, Access::remote_read) == nullptr) {
      responder_fatal(*this, qp, wire::NakCode::remote_access_error, psn);
      return;
    }
    std::uint32_t npkts = h.reth.dma_len == 0 ? 1 : (h.reth.dma_len + mtu - 1) / mtu;
    RdAtomicResource& r = qp.rd_res[qp.rd_res_next];
    qp.rd_res_next = (qp.rd_res_next + 1) % qp.rd_res.size();
    r = RdAtomicResource{true, false, psn, wire::psn_add(psn, npkts - 1), h.reth.va, h.reth.rkey, h.reth.dma_len, 0};
    qp.msn = (qp.msn + 1) & 0xffffff;
    qp.read_jobs.push_back(ReadJob{psn, psn, npkts, h.reth.va, h.reth.rkey, h.reth.dma_len, qp.msn});
    qp.e_psn = wire::psn_add(qp.e_psn, npkts);
    mark_active(qp);
    return;
  } else if (h.bth.opcode == Opcode::rc_compare_swap || h.bth.opcode == Opcode::rc_fetch_add) {
    if ((h.atomic.va & 7) != 0) {  // atomics must be 8-byte aligned (9.4.5)
      responder_fatal(*this, qp, wire::NakCode::invalid_request, psn);
      return;
    }
    SoftMr* mr = remote_mr(*this, qp, h.atomic.rkey, h.atomic.va, 8, Access::remote_atomic);
    if (mr == nullptr) {
      responder_fatal(*this, qp, wire::NakCode::remote_access_error, psn);
      return;
    }
    auto* p = reinterpret_cast<std::uint64_t*>(mr->at(h.atomic.va, 8));
    std::uint64_t orig;
    if (h.bth.opcode == Opcode::rc_compare_swap) {
      orig = h.atomic.compare;
      __atomic_compare_exchange_n(p, &orig, h.atomic.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    } else {
      orig = __atomic_fetch_add(p, h.atomic.swap_add, __ATOMIC_SEQ_CST);
    }
    mr->wrote(reinterpret_cast<std::uint8_t*>(p), 8);
    RdAtomicResource& r = qp.rd_res[qp.rd_res_next];
    qp.rd_res_next = (qp.rd_res_next + 1) % qp.rd_res.size();
    r = RdAtomicResource{true, true, psn, psn, h.atomic.va, h.atomic.rkey, 8, orig};
    qp.msn = (qp.msn + 1) & 0xffffff;
    qp.e_psn = wire::psn_add(qp.e_psn, 1);
    wire::Headers a;
    a.bth.opcode = Opcode::rc_atomic_acknowledge;
    a.bth.dest_qp = qp.attr.dest_qp_num;
    a.bth.psn = psn;
    a.aeth = wire::Aeth::make(wire::AckType::ack, wire::kCreditInvalid, qp.msn);
    a.atomic_ack = orig;
    send_packet(qp.dst_ip(), a, {});
    return;
  } else {
    responder_fatal(*this, qp, wire::NakCode::invalid_request, psn);
    return;
  }
  qp.e_psn = wire::psn_add(qp.e_psn, 1);
  if (h.bth.ack_req) queue_ack(*this, qp, psn);
}

bool SoftDevice::responder_run_reads(SoftQp& qp, std::size_t budget) {
  const std::uint32_t mtu = qp.pmtu();
  // In the order the requests came: a re-read once the READs before it are answered.
  auto pop = [&qp](bool replay) {
    if (replay) {
      qp.read_replays.pop_front();
    } else {
      qp.read_jobs.pop_front();
      ++qp.read_jobs_done;
    }
  };
  while (budget > 0) {
    const bool replay = !qp.read_replays.empty() && qp.read_replays.front().after <= qp.read_jobs_done;
    if (!replay && qp.read_jobs.empty()) break;
    ReadJob& j = replay ? qp.read_replays.front().job : qp.read_jobs.front();
    auto k = static_cast<std::uint32_t>(wire::psn_diff(j.next_psn, j.first_psn));
    if (k >= j.npkts) {
      pop(replay);
      continue;
    }
    std::uint32_t off = k * mtu;
    std::uint32_t len = std::min(mtu, j.length - std::min(off, j.length));
    wire::Headers h;
    // A job that starts at the READ's first packet begins with FIRST (ONLY if it is one packet);
    // one that starts later (a re-read) with MIDDLE; every job ends with LAST.
    const bool first = k == 0, ends = k + 1 == j.npkts;
    h.bth.opcode = first && ends ? Opcode::rc_read_response_only
                   : first       ? Opcode::rc_read_response_first
                   : ends        ? Opcode::rc_read_response_last
                                 : Opcode::rc_read_response_middle;
    h.bth.dest_qp = qp.attr.dest_qp_num;
    h.bth.psn = j.next_psn;
    h.aeth = wire::Aeth::make(wire::AckType::ack, wire::kCreditInvalid, j.msn);
    const std::uint8_t* src = nullptr;
    if (len > 0) {
      SoftMr* mr = remote_mr(*this, qp, j.rkey, j.va + off, len, Access::remote_read);
      if (mr == nullptr) {  // deregistered while the response was streaming
        std::uint32_t p = j.next_psn;
        qp.drop_reads();
        responder_fatal(*this, qp, wire::NakCode::remote_access_error, p);
        return false;
      }
      src = mr->at(j.va + off, len);
    }
    std::uint8_t* dst = pkt_begin(qp.dst_ip(), h, len, len == mtu);
    if (len > 0) std::memcpy(dst, src, len);
    pkt_end();
    j.next_psn = wire::psn_add(j.next_psn, 1);
    --budget;
    if (ends) pop(replay);
  }
  return qp.reads_pending();
}

void SoftDevice::responder_ud_packet(SoftQp& qp, const wire::Packet& pkt, std::uint32_t src_ip_be) {
  const auto& h = pkt.hdr;
  if (h.deth.qkey != qp.attr.qkey) {  // 10.2.5: a Q_Key mismatch is dropped silently
    ++st.rx_dropped_qkey;
    return;
  }
  if (pkt.payload.size() > mtu_bytes(active_mtu())) {  // IBA's length error: dropped silently
    ++st.rx_longer_than_mtu;
    return;
  }
  RecvWqe r;
  if (!take_recv(qp, r)) {  // UD has no RNR: the datagram is dropped
    ++st.rx_dropped_no_recv;
    return;
  }
  // A UD receive starts with 40 bytes of GRH; for RoCEv2 over IPv4 its last 20 bytes hold the
  // IPv4 header (as rxe and ConnectX place it).
  std::uint8_t grh[40] = {};
  std::uint8_t* ip = grh + 20;
  auto total_ip = static_cast<std::uint16_t>(20 + 8 + pkt.payload.size() + 40);
  ip[0] = 0x45;
  ip[2] = static_cast<std::uint8_t>(total_ip >> 8);
  ip[3] = static_cast<std::uint8_t>(total_ip);
  ip[6] = 0x40;
  ip[8] = 64;
  ip[9] = 17;
  std::memcpy(ip + 12, &src_ip_be, 4);
  std::uint32_t me = ip_be();
  std::memcpy(ip + 16, &me, 4);
  auto len = static_cast<std::uint32_t>(pkt.payload.size());
  WcStatus s = scatter(*qp.pd, r.sge.data(), r.num_sge, 0, grh, 40);
  if (s == WcStatus::success) s = scatter(*qp.pd, r.sge.data(), r.num_sge, 40, pkt.payload.data(), len);
  WorkCompletion wc;
  wc.wr_id = r.wr_id;
  wc.status = s;
  wc.opcode = WcOpcode::recv;
  wc.byte_len = s == WcStatus::success ? 40 + len : 0;
  wc.qp_num = qp.qp_num();
  wc.src_qp = h.deth.src_qp;
  wc.sgid = Gid::from_ipv4(src_ip_be);
  wc.wc_flags = WcFlags::grh;
  if (h.bth.opcode == Opcode::ud_send_only_imm) {
    wc.imm_data = h.imm;
    wc.wc_flags = WcFlags::grh | WcFlags::with_imm;
  }
  qp.rcq->push(wc, h.bth.solicited);
}

}  // namespace vrdma::nicdrv::soft
