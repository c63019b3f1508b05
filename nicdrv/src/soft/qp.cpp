// Soft QP: creation, the IBA state machine (attributes applied per transition), posting.
#include <algorithm>

#include <fmt/format.h>

#include "soft/engine.hpp"
#include "vrdma/nicdrv/qp_state.hpp"

namespace vrdma::nicdrv::soft {
namespace {

constexpr std::uint32_t kMaxRdAtomic = 16;
constexpr Access kAllAccess = Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;

bool mask_has(QpAttrMask m, QpAttrMask bit) { return any(m & bit); }

std::string qp_name(const SoftQp& qp) { return "QP " + std::to_string(qp.qp_num()); }

}  // namespace

SoftQp::SoftQp(std::shared_ptr<SoftPd> pd_in, const QpInitAttr& init, std::uint32_t qpn)
    : dev(pd_in->dev()), pd(std::move(pd_in)), qpn_(qpn), type_(init.type), sq_sig_all(init.sq_sig_all),
      cap(init.cap) {
  sq.resize(std::max<std::uint32_t>(cap.max_send_wr, 1));
  for (auto& w : sq) w.inline_data.reserve(cap.max_inline_data);
  rq_max = cap.max_recv_wr;
  attr.cap = cap;
}

SoftQp::~SoftQp() {
  std::lock_guard lk(dev.mu_);
  // An ACK held for the application's answer (engine_loop.cpp) still goes: the peer's last
  // message must not wait for a retransmission to a QP that is gone.
  const QpState s = state();
  if (ack_pending && !dev.quiesced && (s == QpState::rtr || s == QpState::rts || s == QpState::sqd)) {
    ack_pending = false;
    dev.send_ack(*this, wire::AckType::ack, wire::kCreditInvalid, ack_psn);
    dev.tx_flush();
  }
  dev.qps.erase(qpn_);
  std::erase(dev.active, this);
  std::erase(dev.acks, this);
}

Result<QpAttr> SoftQp::query() const {
  std::lock_guard lk(dev.mu_);
  QpAttr a = attr;
  a.qp_state = state();
  a.cur_qp_state = a.qp_state;
  a.sq_psn = next_new_psn;
  a.rq_psn = e_psn;
  a.cap = cap;
  a.sq_draining = state() == QpState::sqd && sq_head != sq_next ? 1 : 0;
  return a;
}

Status SoftQp::modify(const QpAttr& a, QpAttrMask mask) {
  std::lock_guard lk(dev.mu_);
  QpState cur = state();
  if (mask_has(mask, QpAttrMask::cur_state) && a.cur_qp_state != cur)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": cur_qp_state " + std::string(to_string(a.cur_qp_state)) +
                                                  " does not match the QP's state " + std::string(to_string(cur)));
  QpState next = mask_has(mask, QpAttrMask::state) ? a.qp_state : cur;
  VRDMA_TRY(check_qp_transition(type_, cur, next, mask));

  // Value checks before anything changes (ibv_modify_qp is all or nothing).
  if (mask_has(mask, QpAttrMask::port) && a.port_num != 1)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": port " + std::to_string(a.port_num) + " does not exist (soft devices have port 1)");
  if (mask_has(mask, QpAttrMask::pkey_index) && a.pkey_index != 0)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": P_Key index " + std::to_string(a.pkey_index) + " is out of range (table has 1 entry)");
  if (mask_has(mask, QpAttrMask::access_flags) && (a.qp_access_flags & kAllAccess) != a.qp_access_flags)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": unknown access flags");
  if (mask_has(mask, QpAttrMask::path_mtu)) {
    auto m = static_cast<unsigned>(a.path_mtu);
    if (m < 1 || m > 5) return make_error(Errc::invalid_argument, qp_name(*this) + ": path MTU enum out of range");
    if (m > static_cast<unsigned>(dev.active_mtu()))
      return make_error(Errc::invalid_argument, qp_name(*this) + ": path MTU " + std::to_string(mtu_bytes(a.path_mtu)) +
                                                    " exceeds the port's active MTU " + std::to_string(mtu_bytes(dev.active_mtu())) +
                                                    " (raise the interface MTU or use a smaller path MTU)");
  }
  if (mask_has(mask, QpAttrMask::av) && !a.ah_attr.dgid.is_ipv4_mapped())
    return make_error(Errc::invalid_argument, qp_name(*this) + ": destination GID " + a.ah_attr.dgid.str() +
                                                  " is not an IPv4-mapped RoCEv2 GID (::ffff:a.b.c.d)");
  if (mask_has(mask, QpAttrMask::max_dest_rd_atomic) && a.max_dest_rd_atomic > kMaxRdAtomic)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": max_dest_rd_atomic above the device limit 16");
  if (mask_has(mask, QpAttrMask::max_qp_rd_atomic) && a.max_rd_atomic > kMaxRdAtomic)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": max_rd_atomic above the device limit 16");
  if (mask_has(mask, QpAttrMask::timeout) && a.timeout > 31)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": timeout exponent above 31");
  if (mask_has(mask, QpAttrMask::retry_cnt) && a.retry_cnt > 7)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": retry_cnt above 7");
  if (mask_has(mask, QpAttrMask::rnr_retry) && a.rnr_retry > 7)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": rnr_retry above 7");
  if (mask_has(mask, QpAttrMask::min_rnr_timer) && a.min_rnr_timer > 31)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": min_rnr_timer above 31");
  if (mask_has(mask, QpAttrMask::dest_qpn) && a.dest_qp_num > wire::kQpnMask)
    return make_error(Errc::invalid_argument, qp_name(*this) + ": destination QPN above 24 bits");

  // Apply.
  if (mask_has(mask, QpAttrMask::access_flags)) attr.qp_access_flags = a.qp_access_flags;
  if (mask_has(mask, QpAttrMask::qkey)) attr.qkey = a.qkey;
  if (mask_has(mask, QpAttrMask::av)) attr.ah_attr = a.ah_attr;
  if (mask_has(mask, QpAttrMask::path_mtu)) attr.path_mtu = a.path_mtu;
  if (mask_has(mask, QpAttrMask::timeout)) attr.timeout = a.timeout;
  if (mask_has(mask, QpAttrMask::retry_cnt)) attr.retry_cnt = a.retry_cnt;
  if (mask_has(mask, QpAttrMask::rnr_retry)) attr.rnr_retry = a.rnr_retry;
  if (mask_has(mask, QpAttrMask::rq_psn)) attr.rq_psn = a.rq_psn & wire::kPsnMask;
  if (mask_has(mask, QpAttrMask::sq_psn)) attr.sq_psn = a.sq_psn & wire::kPsnMask;
  if (mask_has(mask, QpAttrMask::max_qp_rd_atomic)) attr.max_rd_atomic = std::max<std::uint8_t>(a.max_rd_atomic, 1);
  if (mask_has(mask, QpAttrMask::max_dest_rd_atomic))
    attr.max_dest_rd_atomic = std::max<std::uint8_t>(a.max_dest_rd_atomic, 1);
  if (mask_has(mask, QpAttrMask::min_rnr_timer)) attr.min_rnr_timer = a.min_rnr_timer;
  if (mask_has(mask, QpAttrMask::dest_qpn)) attr.dest_qp_num = a.dest_qp_num;
  if (mask_has(mask, QpAttrMask::port)) attr.port_num = a.port_num;

  if (next == QpState::reset && cur != QpState::reset) {
    // Back to RESET: queues emptied without completions (IBA 10.3.1), all state forgotten.
    sq_head = sq_next = sq_tail = 0;
    rq.clear();
    drop_reads();
    rd_res.clear();
    in_send = in_write = have_recv = false;
    retx_deadline = rnr_deadline = probe_deadline = {};
    rnr_wait = retx_pending = flush_pending = ack_pending = false;
    rd_atomic_outstanding = 0;
    std::erase(dev.active, this);
    queued = false;
    QpAttr fresh;
    fresh.cap = cap;
    attr = fresh;
  }
  if (cur == QpState::init && next == QpState::rtr) {
    e_psn = attr.rq_psn;
    msn = 0;
    nak_sent = false;
    rd_res.assign(attr.max_dest_rd_atomic, RdAtomicResource{});
    rd_res_next = 0;
  }
  if (cur == QpState::rtr && next == QpState::rts) {
    send_psn = una_psn = next_new_psn = attr.sq_psn;
    reset_send_loss_state(attr.sq_psn);
    retry_left = attr.retry_cnt;
    rnr_left = attr.rnr_retry;
  }
  set_state(next);
  if (next == QpState::err && cur != QpState::err) dev.move_to_error(*this);
  if ((next == QpState::rts || next == QpState::err) && !sq_empty()) dev.mark_active(*this);
  if (next == QpState::rts || next == QpState::err) dev.kick();
  return {};
}

// What a REG_MR can be refused at once (the region's state is checked when it runs: an error
// completion then, as in Linux rxe).
Status SoftQp::check_reg(const SendWr& wr) const {
  const std::string what = qp_name(*this) + ": REG_MR: ";
  auto* mr = dynamic_cast<SoftMr*>(wr.reg.mr);
  if (mr == nullptr || !mr->fast() || mr->pd() != pd.get())
    return make_error(Errc::invalid_argument, what + "the region is not one alloc_mr made on this QP's PD");
  if ((wr.reg.key >> 8) != (mr->lkey() >> 8))
    return make_error(Errc::invalid_argument, fmt::format("{}key {:#x} differs from the region's {:#x} above its low byte "
                                                          "(REG_MR changes only the key's low 8 bits)",
                                                          what, wr.reg.key, mr->lkey()));
  if (wr.reg.page_shift < 12 || wr.reg.page_shift > 30)
    return make_error(Errc::invalid_argument, fmt::format("{}page_shift {} is outside 12..30", what, wr.reg.page_shift));
  if (wr.reg.length == 0 || wr.reg.addr == nullptr || wr.reg.iova + wr.reg.length < wr.reg.iova)
    return make_error(Errc::invalid_argument, what + "no memory (a null address, a zero or wrapping length)");
  // From iova's page to the last byte's (the sum cannot wrap: checked above).
  const std::uint64_t last = wr.reg.iova + (wr.reg.length - 1);
  const std::uint64_t pages = (last >> wr.reg.page_shift) - (wr.reg.iova >> wr.reg.page_shift) + 1;
  if (pages > mr->max_pages())
    return make_error(Errc::invalid_argument, fmt::format("{}{} bytes from iova {:#x} span {} pages of {}; the region "
                                                          "was made for {}",
                                                          what, wr.reg.length, wr.reg.iova, pages,
                                                          std::uint64_t{1} << wr.reg.page_shift, mr->max_pages()));
  if (!rights_consistent(wr.reg.access)) return make_error(Errc::invalid_argument, what + kRightsInconsistent);
  return {};
}

Status SoftQp::post_send(std::span<const SendWr> wrs, std::size_t* bad_index) {
  std::unique_lock lk(dev.mu_);
  QpState s = state();
  auto fail = [&](std::size_t i, Error e) -> Status {
    if (bad_index) *bad_index = i;
    if (i > 0) {
      dev.mark_active(*this);
      lk.unlock();
      dev.kick();
    }
    return e;
  };
  if (s == QpState::reset || s == QpState::init || s == QpState::rtr)
    return fail(0, make_error(Errc::bad_state, qp_name(*this) + " is in " + std::string(to_string(s)) +
                                                   "; post_send needs RTS (move the QP through INIT, RTR, RTS first)"));
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const SendWr& wr = wrs[i];
    if (sq_tail - sq_head >= sq.size())
      return fail(i, make_error(Errc::would_block, qp_name(*this) + ": send queue is full (" + std::to_string(sq.size()) +
                                                     " work requests); poll the CQ before posting more"));
    if (wr.sg_list.size() > cap.max_send_sge)
      return fail(i, make_error(Errc::invalid_argument, qp_name(*this) + ": " + std::to_string(wr.sg_list.size()) +
                                                            " SGEs exceed max_send_sge " + std::to_string(cap.max_send_sge)));
    bool ud_ok = wr.opcode == WrOpcode::send || wr.opcode == WrOpcode::send_with_imm;
    if (is_datagram(type_) && !ud_ok)
      return fail(i, make_error(Errc::invalid_argument, qp_name(*this) + ": UD QPs carry only SEND and SEND_WITH_IMM, not " +
                                                            std::string(to_string(wr.opcode))));
    if (!is_known(wr.opcode))
      return fail(i, make_error(Errc::invalid_argument, qp_name(*this) + ": unknown opcode"));
    if (wr.opcode == WrOpcode::reg_mr) {
      auto st = check_reg(wr);
      if (!st) return fail(i, st.error());
    }
    if (is_datagram(type_) && wr.ud.ah == nullptr)
      return fail(i, make_error(Errc::invalid_argument, qp_name(*this) + ": UD send without an address handle"));
    std::uint64_t total = 0;
    if (!is_local_op(wr.opcode))
      for (const auto& sge : wr.sg_list) total += sge.length;
    bool inl = has(wr.flags, SendFlags::inline_data);
    if (inl && total > cap.max_inline_data)
      return fail(i, make_error(Errc::invalid_argument, qp_name(*this) + ": inline data of " + std::to_string(total) +
                                                            " bytes exceeds max_inline_data " + std::to_string(cap.max_inline_data)));
    if (total > (1ull << 31))
      return fail(i, make_error(Errc::invalid_argument, qp_name(*this) + ": message longer than 2 GiB"));
    SendWqe& w = wqe(sq_tail);
    w.wr_id = wr.wr_id;
    w.opcode = wr.opcode;
    w.signaled = sq_sig_all || has(wr.flags, SendFlags::signaled);
    w.solicited = has(wr.flags, SendFlags::solicited);
    w.fence = has(wr.flags, SendFlags::fence);
    w.imm = wr.opcode == WrOpcode::send_with_inv || wr.opcode == WrOpcode::local_inv ? wr.invalidate_rkey : wr.imm_data;
    if (wr.opcode == WrOpcode::reg_mr) {
      w.reg.index = wr.reg.mr->lkey() >> 8;
      w.reg.addr = static_cast<std::uint8_t*>(wr.reg.addr);
      w.reg.iova = wr.reg.iova;
      w.reg.length = wr.reg.length;
      w.reg.access = wr.reg.access;
      w.reg.key = wr.reg.key;
    }
    bool atomic = wr.opcode == WrOpcode::atomic_cmp_and_swp || wr.opcode == WrOpcode::atomic_fetch_and_add;
    w.remote_addr = atomic ? wr.atomic.remote_addr : wr.rdma.remote_addr;
    w.rkey = atomic ? wr.atomic.rkey : wr.rdma.rkey;
    w.compare_add = wr.atomic.compare_add;
    w.swap = wr.atomic.swap;
    if (is_datagram(type_)) {
      const Gid& g = wr.ud.ah->attr().dgid;
      w.ud_dst_ip_be = g.ipv4();
      w.ud_qpn = wr.ud.remote_qpn & wire::kQpnMask;
      w.ud_qkey = wr.ud.remote_qkey;
    }
    w.num_sge = is_local_op(wr.opcode) ? 0 : static_cast<std::uint32_t>(wr.sg_list.size());
    std::copy_n(wr.sg_list.begin(), w.num_sge, w.sge.begin());
    w.is_inline = inl;
    w.length = static_cast<std::uint32_t>(total);
    if (inl) {
      // Inline data is copied now: the caller may reuse its buffers as soon as post returns.
      w.inline_data.clear();
      for (const auto& sge : wr.sg_list) {
        const auto* p = reinterpret_cast<const std::uint8_t*>(sge.addr);
        w.inline_data.insert(w.inline_data.end(), p, p + sge.length);
      }
    }
    w.started = w.done = false;
    w.resp_pkts = 0;
    w.forget_after_gap();
    w.status = WcStatus::success;
    ++sq_tail;
  }
  if (s == QpState::err) flush_pending = true;
  // Transmit now, on the caller's thread; the engine thread is woken only for what is left over
  // (a long message past the budget, the error flush; not a full window: an ACK reopens it).
  const bool left = dev.send_now(*this);
  if (sq_next != sq_tail || flush_pending) dev.mark_active(*this);
  lk.unlock();
  if (left) dev.kick();
  return {};
}

Status SoftQp::post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) {
  std::unique_lock lk(dev.mu_);
  auto fail = [&](std::size_t i, Error e) -> Status {
    if (bad_index) *bad_index = i;
    return e;
  };
  if (srq) return fail(0, make_error(Errc::invalid_argument, qp_name(*this) + " takes its receives from an SRQ; post to the SRQ"));
  if (state() == QpState::reset)
    return fail(0, make_error(Errc::bad_state, qp_name(*this) + " is in RESET; post_recv needs INIT or later"));
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const RecvWr& wr = wrs[i];
    if (rq.size() >= rq_max)
      return fail(i, make_error(Errc::would_block, qp_name(*this) + ": receive queue is full (" + std::to_string(rq_max) + " work requests)"));
    if (wr.sg_list.size() > cap.max_recv_sge)
      return fail(i, make_error(Errc::invalid_argument, qp_name(*this) + ": " + std::to_string(wr.sg_list.size()) +
                                                            " SGEs exceed max_recv_sge " + std::to_string(cap.max_recv_sge)));
    RecvWqe r;
    r.wr_id = wr.wr_id;
    r.num_sge = static_cast<std::uint32_t>(wr.sg_list.size());
    std::copy(wr.sg_list.begin(), wr.sg_list.end(), r.sge.begin());
    rq.push_back(r);
  }
  if (state() == QpState::err) {
    flush_pending = true;
    dev.mark_active(*this);
    lk.unlock();
    dev.kick();
  }
  return {};
}

Status SoftSrq::post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) {
  std::lock_guard lk(pd_->dev().mu_);
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const RecvWr& wr = wrs[i];
    if (queue.size() >= max_wr_ || wr.sg_list.size() > max_sge_) {
      if (bad_index) *bad_index = i;
      return make_error(queue.size() >= max_wr_ ? Errc::would_block : Errc::invalid_argument,
                        queue.size() >= max_wr_ ? "SRQ is full (" + std::to_string(max_wr_) + " work requests)"
                                                : "SRQ receive has more SGEs than max_sge " + std::to_string(max_sge_));
    }
    RecvWqe r;
    r.wr_id = wr.wr_id;
    r.num_sge = static_cast<std::uint32_t>(wr.sg_list.size());
    std::copy(wr.sg_list.begin(), wr.sg_list.end(), r.sge.begin());
    queue.push_back(r);
  }
  return {};
}

}  // namespace vrdma::nicdrv::soft
