// Completer (IBA 9.7.5.2, 9.9): ACKs, NAKs, READ and atomic responses; the local ACK timeout
// and the RNR timer; completions in posting order; the error flush (IBA 10.3.1, 11.6.2).
#include <algorithm>

#include "soft/engine.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::nicdrv::soft {
namespace {

using wire::Opcode;

WcOpcode wc_opcode(WrOpcode op) {
  switch (op) {
    case WrOpcode::send:
    case WrOpcode::send_with_imm:
    case WrOpcode::send_with_inv: return WcOpcode::send;
    case WrOpcode::rdma_write:
    case WrOpcode::rdma_write_with_imm: return WcOpcode::rdma_write;
    case WrOpcode::rdma_read: return WcOpcode::rdma_read;
    case WrOpcode::atomic_cmp_and_swp: return WcOpcode::comp_swap;
    case WrOpcode::atomic_fetch_and_add: return WcOpcode::fetch_add;
    case WrOpcode::local_inv: return WcOpcode::local_inv;
    case WrOpcode::reg_mr: return WcOpcode::reg_mr;
  }
  return WcOpcode::send;
}

}  // namespace

void SoftDevice::retire_completed(SoftQp& qp) {
  while (qp.sq_head != qp.sq_tail) {
    SendWqe& w = qp.wqe(qp.sq_head);
    if (!w.started || !w.done) break;
    if (is_rd_atomic(w.opcode) && w.npkts > 0 && qp.rd_atomic_outstanding > 0) --qp.rd_atomic_outstanding;
    if (w.signaled || w.status != WcStatus::success) {
      WorkCompletion wc;
      wc.wr_id = w.wr_id;
      wc.status = w.status;
      wc.opcode = wc_opcode(w.opcode);
      wc.qp_num = qp.qp_num();
      wc.byte_len = w.opcode == WrOpcode::rdma_read ? w.length : is_rd_atomic(w.opcode) ? 8 : w.length;
      qp.scq->push(wc, false);
    }
    ++qp.sq_head;
    if (qp.sq_next < qp.sq_head) qp.sq_next = qp.sq_head;
  }
}

void SoftDevice::complete_send(SoftQp& qp, SendWqe& w, WcStatus status) {
  w.started = true;
  w.done = true;
  w.status = status;
  // ERR before the error completion can be polled: a poller in another thread (vrdmad raises
  // the QP's fatal event when it finds an error completion of a QP in ERR) must never see the
  // completion with the QP still in RTS. The flush of what follows runs later, in the loop.
  if (status != WcStatus::success && qp.type() == QpType::rc) move_to_error(qp);
  retire_completed(qp);
}

void SoftDevice::move_to_error(SoftQp& qp) {
  if (qp.state() != QpState::err) {
    log::debug("soft {}: QP {} moves to ERR", name_, qp.qp_num());
    qp.set_state(QpState::err);
  }
  qp.retx_deadline = qp.probe_deadline = {};
  qp.rnr_wait = false;
  qp.flush_pending = true;
  mark_active(qp);
}

void SoftDevice::flush_queues(SoftQp& qp) {
  qp.flush_pending = false;
  // Send queue: whatever has not completed is flushed, in order (IBA 10.3.1).
  while (qp.sq_head != qp.sq_tail) {
    SendWqe& w = qp.wqe(qp.sq_head);
    if (!(w.done && w.status != WcStatus::success)) w.status = WcStatus::wr_flush_err;
    w.started = w.done = true;
    retire_completed(qp);
  }
  qp.sq_next = qp.sq_head;
  qp.rd_atomic_outstanding = 0;
  auto flush_recv = [&](const RecvWqe& r) {
    WorkCompletion wc;
    wc.wr_id = r.wr_id;
    wc.status = WcStatus::wr_flush_err;
    wc.opcode = WcOpcode::recv;
    wc.qp_num = qp.qp_num();
    qp.rcq->push(wc, false);
  };
  if (qp.have_recv) {
    flush_recv(qp.cur_recv);
    qp.have_recv = false;
  }
  for (const auto& r : qp.rq) flush_recv(r);
  qp.rq.clear();
  qp.drop_reads();
  qp.in_send = qp.in_write = false;
}

bool SoftDevice::seek(SoftQp& qp, std::uint32_t psn) {
  for (std::uint64_t i = qp.sq_head; i != qp.sq_tail; ++i) {
    SendWqe& w = qp.wqe(i);
    if (!w.started) break;
    if (w.done || w.npkts == 0) continue;
    std::int32_t k = wire::psn_diff(psn, w.first_psn);
    if (k < 0) psn = w.first_psn, k = 0;
    if (static_cast<std::uint32_t>(k) < w.npkts) {
      // READ: data already received stays; ask from the first packet missing (never below it:
      // a responder may refuse a re-read starting below an earlier one).
      if (w.opcode == WrOpcode::rdma_read) psn = wire::psn_add(w.first_psn, w.resp_pkts);
      qp.sq_next = i;
      qp.send_psn = psn;
      mark_active(qp);
      return true;
    }
  }
  // Nothing outstanding at or after psn: carry on with requests not yet started.
  std::uint64_t i = qp.sq_head;
  while (i != qp.sq_tail && qp.wqe(i).started) ++i;
  qp.sq_next = i;
  qp.send_psn = qp.next_new_psn;
  return false;
}

void SoftDevice::go_back_n(SoftQp& qp, std::uint32_t psn) {
  if (seek(qp, psn)) {
    log::debug("soft {}: QP {} go-back-N to PSN {:#x} (una {:#x}, next {:#x})", name_, qp.qp_num(), qp.send_psn,
               qp.una_psn, qp.next_new_psn);
    ++st.retransmits;
    qp.retx_pending = true;
    qp.rtt_sent = {};  // no round trip is sampled across a retransmission
  }
}

void SoftDevice::window_on_loss(SoftQp& qp, bool timeout) {
  qp.ssthresh = std::max(qp.cwnd / 2, kMinSendWindowPkts);
  qp.cwnd = timeout ? kMinSendWindowPkts : qp.ssthresh;
  qp.cwnd_acked = 0;
}

void SoftDevice::arm_probe(SoftQp& qp) {
  qp.probe_deadline = {};
  if (qp.srtt == Clock::duration{} || qp.probed) return;
  const auto wait = std::max<Clock::duration>(4 * qp.srtt, std::chrono::microseconds(500));
  const TimePoint t = Clock::now() + wait;
  if (qp.retx_deadline != TimePoint{} && t >= qp.retx_deadline) return;  // the timer comes first anyway
  qp.probe_deadline = t;
}

// The window grows with what was acknowledged: by that much below ssthresh, by one per window
// above it, up to kSendWindowPkts.
static void window_on_ack(SoftQp& qp, std::uint32_t acked) {
  if (qp.cwnd >= kSendWindowPkts) return;
  if (qp.cwnd < qp.ssthresh) {
    qp.cwnd = std::min(qp.cwnd + acked, qp.ssthresh);
    return;
  }
  qp.cwnd_acked += acked;
  while (qp.cwnd_acked >= qp.cwnd && qp.cwnd < kSendWindowPkts) qp.cwnd_acked -= qp.cwnd++;
  if (qp.cwnd >= kSendWindowPkts) qp.cwnd_acked = 0;
}

// Progress: everything before `una` is acknowledged; the retry budget and the timer restart.
static void advance_una(SoftDevice& d, SoftQp& qp, std::uint32_t una) {
  if (!wire::psn_lt(qp.una_psn, una)) return;
  window_on_ack(qp, static_cast<std::uint32_t>(wire::psn_diff(una, qp.una_psn)));
  qp.una_psn = una;
  qp.retry_left = qp.attr.retry_cnt;
  qp.retx_pending = false;
  if (qp.rtt_sent != TimePoint{} && wire::psn_lt(qp.rtt_psn, una)) {
    const auto sample = Clock::now() - qp.rtt_sent;
    qp.srtt = qp.srtt == Clock::duration{} ? sample : (7 * qp.srtt + sample) / 8;
    qp.rtt_sent = {};
  }
  qp.probed = false;
  const bool out = wire::psn_lt(qp.una_psn, qp.next_new_psn);
  qp.retx_deadline = out ? d.retx_interval(qp) : TimePoint{};
  if (out) d.arm_probe(qp);
  else qp.probe_deadline = {};
  d.rearm(qp);
}

// Cumulative acknowledgement of every PSN up to and including `psn` (IBA 9.7.5.2.1).
static void ack_to(SoftDevice& d, SoftQp& qp, std::uint32_t psn) {
  // Ignore ACKs for PSNs never sent or older than what is already acknowledged.
  if (!wire::psn_lt(psn, qp.next_new_psn)) return;
  if (wire::psn_lt(psn, wire::psn_add(qp.una_psn, wire::kPsnMask))) return;
  std::uint32_t una = wire::psn_add(psn, 1);
  for (std::uint64_t i = qp.sq_head; i != qp.sq_tail; ++i) {
    SendWqe& w = qp.wqe(i);
    if (!w.started) break;
    if (w.done) {
      // A READ or atomic past psn may be done already (its responses came): everything up to
      // its end is acknowledged, never less (an ACK naming an earlier PSN, such as Linux rxe's
      // answer to a duplicate SEND sent before a READ, must not pull the point back behind it).
      if (w.npkts > 0 && wire::psn_lt(una, wire::psn_add(w.first_psn, w.npkts))) una = wire::psn_add(w.first_psn, w.npkts);
      continue;
    }
    std::uint32_t last = wire::psn_add(w.first_psn, w.npkts - 1);
    if (is_rd_atomic(w.opcode)) {
      if (wire::psn_le(w.first_psn, psn)) {
        // A later PSN is acknowledged but this response is missing: an implied NAK (9.7.5.2.3).
        std::uint32_t missing = wire::psn_add(w.first_psn, w.resp_pkts);
        una = missing;
        if (!qp.retx_pending) {
          d.window_on_loss(qp, false);
          d.go_back_n(qp, missing);
        }
      }
      break;
    }
    if (wire::psn_le(last, psn)) {
      w.done = true;
      w.status = WcStatus::success;
      continue;
    }
    break;
  }
  advance_una(d, qp, una);
  d.retire_completed(qp);
  if (qp.sq_next != qp.sq_tail) d.mark_active(qp);
}

// True if a READ/atomic posted before w still waits for its response: then a response for w
// means that one's response was lost (responses come in request order), an implied NAK.
// An earlier SEND or WRITE still unacknowledged is no such sign: the response acknowledges it
// (9.7.5.2.1; its own ACK was lost or is late).
static bool earlier_response_missing(SoftQp& qp, const SendWqe& w) {
  for (std::uint64_t i = qp.sq_head; i != qp.sq_tail && &qp.wqe(i) != &w; ++i)
    if (const SendWqe& e = qp.wqe(i); !e.done && is_rd_atomic(e.opcode)) return true;
  return false;
}

// The WQE whose PSN range holds psn, or nullptr.
static SendWqe* wqe_for_psn(SoftQp& qp, std::uint32_t psn) {
  for (std::uint64_t i = qp.sq_head; i != qp.sq_tail; ++i) {
    SendWqe& w = qp.wqe(i);
    if (!w.started) break;
    std::int32_t k = wire::psn_diff(psn, w.first_psn);
    if (k >= 0 && static_cast<std::uint32_t>(k) < std::max<std::uint32_t>(w.npkts, 1)) return &w;
  }
  return nullptr;
}

// Everything acknowledged up to the first request still missing something: a READ's first missing
// response packet (responses after a lost one are kept), or the first PSN of any other request.
static void advance_una_to_first_missing(SoftDevice& d, SoftQp& qp) {
  std::uint32_t una = qp.una_psn;
  for (std::uint64_t i = qp.sq_head; i != qp.sq_tail; ++i) {
    const SendWqe& w = qp.wqe(i);
    if (!w.started) break;
    if (w.done) {
      if (w.npkts > 0) una = wire::psn_add(w.first_psn, w.npkts);
      continue;
    }
    if (w.opcode == WrOpcode::rdma_read) una = wire::psn_add(w.first_psn, w.resp_pkts);
    break;
  }
  advance_una(d, qp, una);
}

// A READ response (IBA 9.7.5.2). Each packet is placed by its PSN, also after a gap: a lost
// response costs a re-read of the lost packets only (request_read), asked for one gap at a time,
// the lowest first (Linux rxe refuses a re-read that starts below an earlier one), not the rest of
// the message; the same thinking as SACK. What is still missing when the responses stop is asked
// for again when the retransmission timer fires.
void SoftDevice::read_response(SoftQp& qp, const wire::Packet& pkt) {
  const auto& h = pkt.hdr;
  SendWqe* w = wqe_for_psn(qp, h.bth.psn);
  if (w == nullptr || w->done || w->opcode != WrOpcode::rdma_read) return;  // stale duplicate
  const auto i = static_cast<std::uint32_t>(wire::psn_diff(h.bth.psn, w->first_psn));
  if (w->has(i)) return;  // a duplicate (a re-read crossed a late packet)
  const std::uint32_t mtu = qp.pmtu();
  const std::uint64_t off = std::uint64_t{i} * mtu;
  const auto len = static_cast<std::uint32_t>(pkt.payload.size());
  const bool final = i + 1 == w->npkts;
  const bool last = h.bth.opcode == Opcode::rc_read_response_last || h.bth.opcode == Opcode::rc_read_response_only;
  const bool size_ok = final ? (off + len == w->length && len <= mtu) : len == mtu;
  // Past the highest packet seen, the stream of the last request goes on: only the READ's last
  // packet may say "last" (a re-read of a gap ends with a last packet below the highest seen).
  if (!size_ok || (i >= w->resp_high && last != final)) {
    if (len > mtu) ++st.rx_longer_than_mtu;
    complete_send(qp, *w, WcStatus::bad_resp_err);
    return;
  }
  WcStatus s = scatter(*qp.pd, w->sge.data(), w->num_sge, static_cast<std::uint32_t>(off), pkt.payload.data(), len);
  if (s != WcStatus::success) {
    complete_send(qp, *w, s);
    return;
  }
  if (i == w->resp_pkts) {
    ++w->resp_pkts;
    while (w->resp_pkts < w->resp_high && w->has(w->resp_pkts)) ++w->resp_pkts;
  } else {
    if (w->got.empty()) w->got.assign((w->npkts + 63) / 64, 0);
    w->got[i / 64] |= std::uint64_t{1} << (i % 64);
  }
  w->resp_high = std::max(w->resp_high, i + 1);
  const bool oldest = !earlier_response_missing(qp, *w);
  if (oldest) {
    // Responses implicitly acknowledge everything before the READ (9.7.5.2.1); and the responder
    // is answering: the timer and the retry budget restart.
    ack_to(*this, qp, wire::psn_add(w->first_psn, wire::kPsnMask));
    qp.retry_left = qp.attr.retry_cnt;
    qp.retx_deadline = retx_interval(qp);
    qp.probed = false;
    arm_probe(qp);
    rearm(qp);
  }
  if (w->resp_pkts == w->npkts) {
    w->done = true;
    w->status = WcStatus::success;
    advance_una_to_first_missing(*this, qp);
    retire_completed(qp);
    mark_active(qp);  // a READ slot freed: more READs/atomics may start
    return;
  }
  if (oldest) advance_una_to_first_missing(*this, qp);
  // A gap below the highest packet: ask for it when the last request for this READ is answered
  // (its end reached) or when that request's own stream skipped the gap (a packet of it was lost).
  const std::uint32_t gap = w->resp_pkts;
  if (gap < w->resp_high &&
      (gap >= w->req_end || (i > gap && i >= w->req_from && i < w->req_end)))
    request_read(qp, *w, gap);
  // A responder answers READ requests in the order they came (9.5): the first packet of w's last
  // request to arrive means every request sent before it was answered in full; another READ still
  // missing part of what its own last request asked for, sent before, lost that part (an implied
  // NAK). Once per request, not per packet: an earlier request answered stays answered.
  if (!w->req_heard && i >= w->req_from && i < w->req_end) {
    w->req_heard = true;
    const std::uint64_t seq = w->req_seq;
    for (std::uint64_t k = qp.sq_head; k != qp.sq_next && k != qp.sq_tail; ++k) {
      SendWqe& u = qp.wqe(k);
      if (&u == w || u.done || u.opcode != WrOpcode::rdma_read || u.req_seq == 0 || u.req_seq >= seq) continue;
      if (u.resp_pkts < u.req_end) request_read(qp, u, u.resp_pkts);
    }
  }
}

void SoftDevice::completer_packet(SoftQp& qp, const wire::Packet& pkt) {
  const auto& h = pkt.hdr;
  const std::uint32_t psn = h.bth.psn;
  switch (h.bth.opcode) {
    case Opcode::rc_acknowledge: {
      switch (h.aeth.type()) {
        case wire::AckType::ack:
          ack_to(*this, qp, psn);
          return;
        case wire::AckType::rnr_nak: {
          ++st.rnr_naks_received;
          ack_to(*this, qp, wire::psn_add(psn, wire::kPsnMask));
          SendWqe* w = wqe_for_psn(qp, psn);
          if (w == nullptr || w->done) return;
          if (qp.rnr_left == 0) {
            complete_send(qp, *w, WcStatus::rnr_retry_exc_err);
            return;
          }
          if (qp.rnr_left != 7) --qp.rnr_left;  // 7 means retry forever (IBA 9.7.5.2.8)
          qp.rnr_wait = true;
          qp.rnr_psn = psn;
          qp.rnr_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(rnr_timer(h.aeth.value()));
          qp.retx_deadline = {};
          rearm(qp);
          return;
        }
        case wire::AckType::nak: {
          ack_to(*this, qp, wire::psn_add(psn, wire::kPsnMask));
          auto code = static_cast<wire::NakCode>(h.aeth.value());
          if (code == wire::NakCode::psn_seq_error) {
            ++st.seq_naks_received;
            window_on_loss(qp, false);
            go_back_n(qp, psn);
            return;
          }
          SendWqe* w = wqe_for_psn(qp, psn);
          if (w == nullptr || w->done) return;
          WcStatus s = code == wire::NakCode::invalid_request       ? WcStatus::rem_inv_req_err
                       : code == wire::NakCode::remote_access_error ? WcStatus::rem_access_err
                       : code == wire::NakCode::remote_op_error     ? WcStatus::rem_op_err
                                                                    : WcStatus::rem_inv_rd_req_err;
          // The NAKed request and everything before it in the queue: complete in order.
          for (std::uint64_t i = qp.sq_head; i != qp.sq_tail && &qp.wqe(i) != w; ++i) {
            SendWqe& e = qp.wqe(i);
            if (!e.done) e.status = WcStatus::wr_flush_err, e.done = true;
          }
          complete_send(qp, *w, s);
          return;
        }
        case wire::AckType::reserved:
          return;
      }
      return;
    }
    case Opcode::rc_read_response_first:
    case Opcode::rc_read_response_middle:
    case Opcode::rc_read_response_last:
    case Opcode::rc_read_response_only:
      read_response(qp, pkt);
      return;
    case Opcode::rc_atomic_acknowledge: {
      SendWqe* w = wqe_for_psn(qp, psn);
      if (w == nullptr || w->done ||
          (w->opcode != WrOpcode::atomic_cmp_and_swp && w->opcode != WrOpcode::atomic_fetch_and_add))
        return;
      ack_to(*this, qp, wire::psn_add(psn, wire::kPsnMask));
      if (earlier_response_missing(qp, *w)) return;
      std::uint64_t orig = h.atomic_ack;  // host order
      WcStatus s = scatter(*qp.pd, w->sge.data(), w->num_sge, 0, reinterpret_cast<const std::uint8_t*>(&orig), 8);
      if (s != WcStatus::success) {
        complete_send(qp, *w, s);
        return;
      }
      w->resp_pkts = 1;
      w->done = true;
      w->status = WcStatus::success;
      advance_una(*this, qp, wire::psn_add(psn, 1));
      retire_completed(qp);
      mark_active(qp);
      return;
    }
    default:
      return;
  }
}

void SoftDevice::timers_run(SoftQp& qp, TimePoint now) {
  if (qp.type() != QpType::rc || (qp.state() != QpState::rts && qp.state() != QpState::sqd)) return;
  if (qp.rnr_wait && now >= qp.rnr_deadline) {
    qp.rnr_wait = false;
    qp.retx_pending = false;
    go_back_n(qp, qp.rnr_psn);
    qp.retx_deadline = retx_interval(qp);
  }
  if (qp.probe_deadline != TimePoint{} && now >= qp.probe_deadline) {
    qp.probe_deadline = {};
    if (wire::psn_lt(qp.una_psn, qp.next_new_psn) && !qp.probed && !qp.rnr_wait) {
      // Send the newest packet again, asking for an ACK: if only ACKs were lost (or are late) it
      // costs one duplicate, which the responder acknowledges; if the tail was lost, it arrives
      // past a gap and the responder NAKs the first missing PSN (go-back-N from there).
      qp.probed = true;
      ++st.tail_probes;
      if (seek(qp, wire::psn_add(qp.send_psn, wire::kPsnMask))) qp.ack_next = true;
    }
  }
  if (qp.retx_deadline != TimePoint{} && now >= qp.retx_deadline) {
    if (!wire::psn_lt(qp.una_psn, qp.next_new_psn)) {
      qp.retx_deadline = {};
      return;
    }
    ++st.timeouts;
    log::debug("soft {}: QP {} local ACK timeout, una {:#x} send {:#x} next {:#x}, {} retries left", name_, qp.qp_num(),
               qp.una_psn, qp.send_psn, qp.next_new_psn, qp.retry_left);
    if (qp.retry_left == 0) {
      SendWqe* w = wqe_for_psn(qp, qp.una_psn);
      if (w == nullptr && qp.sq_head != qp.sq_tail) w = &qp.wqe(qp.sq_head);
      log::debug("soft {}: QP {} retry count exceeded at PSN {}", name_, qp.qp_num(), qp.una_psn);
      if (w != nullptr) complete_send(qp, *w, WcStatus::retry_exc_err);
      else move_to_error(qp);
      return;
    }
    --qp.retry_left;
    qp.retx_pending = false;
    window_on_loss(qp, true);
    go_back_n(qp, qp.una_psn);
    qp.retx_deadline = retx_interval(qp);
  }
}

}  // namespace vrdma::nicdrv::soft
