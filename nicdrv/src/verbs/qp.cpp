// Queue pairs of the verbs provider: creation, the IBA state machine (checked by the shared
// rules in qp_state.hpp before the NIC sees the call, so every provider refuses the same masks
// with the same sentence), and posting.
#include <cerrno>
#include <cstring>

#include "verbs_internal.hpp"
#include "vrdma/nicdrv/qp_state.hpp"

namespace vrdma::nicdrv::verbs {
namespace {

constexpr std::size_t kMaxSge = 32;    // per work request; more than any NIC we know offers
constexpr std::size_t kBatch = 16;     // work requests per ibv_post_* call

bool mask_has(QpAttrMask m, QpAttrMask bit) { return any(m & bit); }

}  // namespace

// An SGE of length 0 moves nothing and is left out, as NIC libraries do (libmlx5: a data
// segment of length 0 would mean 2 GiB); siw in Linux 6.1 dereferences a NULL memory pointer
// for one inside a gathered SEND (siw_tx_hdt) and oopses. Returns how many were kept.
int copy_sges(std::span<const Sge> in, ibv_sge* out) noexcept {
  int n = 0;
  for (const Sge& s : in)
    if (s.length != 0) out[n++] = ibv_sge{s.addr, s.length, s.lkey};
  return n;
}

namespace {

// types.hpp promises libibverbs' values; the casts below rely on it.
static_assert(static_cast<int>(WrOpcode::atomic_fetch_and_add) == IBV_WR_ATOMIC_FETCH_AND_ADD);
static_assert(static_cast<int>(WrOpcode::send_with_imm) == IBV_WR_SEND_WITH_IMM);
static_assert(static_cast<int>(WrOpcode::send_with_inv) == IBV_WR_SEND_WITH_INV);
static_assert(static_cast<unsigned>(WcFlags::with_inv) == IBV_WC_WITH_INV);
static_assert(static_cast<unsigned>(SendFlags::inline_data) == IBV_SEND_INLINE);
static_assert(static_cast<unsigned>(SendFlags::solicited) == IBV_SEND_SOLICITED);
static_assert(static_cast<unsigned>(QpAttrMask::dest_qpn) == IBV_QP_DEST_QPN);
static_assert(static_cast<unsigned>(QpAttrMask::max_dest_rd_atomic) == IBV_QP_MAX_DEST_RD_ATOMIC);
static_assert(static_cast<unsigned>(Access::remote_atomic) == IBV_ACCESS_REMOTE_ATOMIC);
static_assert(static_cast<int>(WcStatus::general_err) == IBV_WC_GENERAL_ERR);
static_assert(static_cast<int>(WcOpcode::recv_rdma_with_imm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(static_cast<int>(QpState::err) == IBV_QPS_ERR);

AhAttr ah_from(const ibv_ah_attr& ia) {
  AhAttr a;
  a.dgid = gid_of(ia.grh.dgid);
  a.sgid_index = ia.grh.sgid_index;
  a.hop_limit = ia.grh.hop_limit;
  a.traffic_class = ia.grh.traffic_class;
  a.flow_label = ia.grh.flow_label;
  a.sl = ia.sl;
  a.port_num = ia.port_num;
  return a;
}

ibv_qp_state to_ibv(QpState s) { return static_cast<ibv_qp_state>(static_cast<int>(s)); }

}  // namespace

ibv_ah_attr ah_of(const AhAttr& a) {
  ibv_ah_attr ia{};
  ia.is_global = 1;
  ia.grh.dgid = ibv_gid_of(a.dgid);
  ia.grh.sgid_index = a.sgid_index;
  ia.grh.hop_limit = a.hop_limit;
  ia.grh.traffic_class = a.traffic_class;
  ia.grh.flow_label = a.flow_label;
  ia.sl = a.sl;
  ia.port_num = a.port_num;
  return ia;
}

void RecvLog::add(std::span<const RecvWr> wrs) {
  std::lock_guard lk(mu_);
  for (const RecvWr& w : wrs) {
    Entry e{w.wr_id, 0, 0, 0};
    for (const Sge& g : w.sg_list)
      if (g.length != 0) {  // the first the NIC writes to (see copy_sges)
        e.addr = g.addr;
        e.length = g.length;
        e.lkey = g.lkey;
        break;
      }
    q_.push_back(e);
    if (q_.size() > bound_) q_.pop_front();
  }
}

std::optional<RecvLog::Entry> RecvLog::take(std::uint64_t wr_id) {
  std::lock_guard lk(mu_);
  for (auto it = q_.begin(); it != q_.end(); ++it) {
    if (it->wr_id != wr_id) continue;
    Entry e = *it;
    // A QP's receives complete in posting order: the older ones have completed already (as
    // errors, whose completions carry no opcode and so were not matched here).
    q_.erase(in_order_ ? q_.begin() : it, it + 1);
    return e;
  }
  return std::nullopt;
}

void RecvLog::undo_last() {
  std::lock_guard lk(mu_);
  if (!q_.empty()) q_.pop_back();
}

void RecvLog::clear() {
  std::lock_guard lk(mu_);
  q_.clear();
}

VerbsQp::VerbsQp(std::shared_ptr<VerbsPd> pd, std::shared_ptr<VerbsCq> scq, std::shared_ptr<VerbsCq> rcq,
                 std::shared_ptr<VerbsSrq> srq, ibv_qp* qp, QpType t, const QpCap& cap)
    : pd_(std::move(pd)), scq_(std::move(scq)), rcq_(std::move(rcq)), srq_(std::move(srq)), qp_(qp), type_(t),
      cap_(cap) {
  if (t == QpType::ud && !srq_) log_ = std::make_unique<RecvLog>(true, 2 * std::size_t{cap.max_recv_wr} + 64);
  scq_->attach(this);
  if (rcq_ != scq_) rcq_->attach(this);
  std::lock_guard lk(dev().context().qps_mu);
  dev().context().qps[qp_->qp_num] = this;
}

VerbsQp::~VerbsQp() {
  // Detach first: after this no poll or event can reach the QP; then the NIC forgets it.
  scq_->detach(qp_->qp_num);
  if (rcq_ != scq_) rcq_->detach(qp_->qp_num);
  {
    std::lock_guard lk(dev().context().qps_mu);
    dev().context().qps.erase(qp_->qp_num);
  }
  ibv_destroy_qp(qp_);
}

std::optional<RecvLog::Entry> VerbsQp::completed(std::uint64_t wr_id, bool ok, bool recv) {
  if (!ok) failed_ = true;
  if (!recv) return std::nullopt;
  if (srq_) return srq_->log().take(wr_id);
  if (log_) return log_->take(wr_id);
  return std::nullopt;
}

// ---- creation ------------------------------------------------------------------------------
Result<std::shared_ptr<QueuePair>> VerbsPd::create_qp(const QpInitAttr& attr, const QpOptions& opts) {
  const std::string& dn = dev_->name();
  if (opts.requested_qpn != 0)
    return make_error(Errc::not_supported, "create_qp: " + dn + " picks QP numbers itself; a requested QPN (" +
                                               std::to_string(opts.requested_qpn) + ") is not supported by verbs");
  if (attr.type == QpType::gsi)
    return make_error(Errc::not_supported, "create_qp: QP1 (GSI) of " + dn + " belongs to the host's kernel; a guest's "
                                           "connection manager MADs are not multiplexed onto it yet");
  if (attr.type != QpType::rc && attr.type != QpType::ud)
    return make_error(Errc::not_supported, "create_qp: the API offers RC and UD QPs only");
  if (attr.type == QpType::ud && dev_->iwarp())
    return make_error(Errc::not_supported, "create_qp: " + dn + " is iWARP, which has connected (RC) QPs only; UD is not supported");
  auto* scq = dynamic_cast<VerbsCq*>(attr.send_cq);
  auto* rcq = dynamic_cast<VerbsCq*>(attr.recv_cq);
  if (scq == nullptr || rcq == nullptr || &scq->dev() != dev_.get() || &rcq->dev() != dev_.get())
    return make_error(Errc::invalid_argument, "create_qp: send and receive CQs must be CQs of device " + dn);
  VerbsSrq* srq = nullptr;
  if (attr.srq != nullptr) {
    srq = dynamic_cast<VerbsSrq*>(attr.srq);
    if (srq == nullptr || &srq->pd() != this)
      return make_error(Errc::invalid_argument, "create_qp: the SRQ belongs to another protection domain");
  }
  if (attr.cap.max_send_sge > kMaxSge || attr.cap.max_recv_sge > kMaxSge)
    return make_error(Errc::invalid_argument, "create_qp: at most " + std::to_string(kMaxSge) + " SGEs per work request");
  ibv_qp_init_attr ia{};
  ia.send_cq = scq->cq();
  ia.recv_cq = rcq->cq();
  ia.srq = srq != nullptr ? srq->srq() : nullptr;
  ia.qp_type = attr.type == QpType::rc ? IBV_QPT_RC : IBV_QPT_UD;
  ia.sq_sig_all = attr.sq_sig_all ? 1 : 0;
  ia.cap.max_send_wr = attr.cap.max_send_wr;
  ia.cap.max_recv_wr = srq != nullptr ? 0 : attr.cap.max_recv_wr;
  ia.cap.max_send_sge = attr.cap.max_send_sge;
  ia.cap.max_recv_sge = srq != nullptr ? 0 : attr.cap.max_recv_sge;
  ia.cap.max_inline_data = attr.cap.max_inline_data;
  ibv_qp* qp = ibv_create_qp(pd_, &ia);
  if (qp == nullptr)
    return verbs_error(errno, dn + ": create a " + std::string(to_string(attr.type)) + " QP (" +
                                  std::to_string(attr.cap.max_send_wr) + " send / " + std::to_string(attr.cap.max_recv_wr) +
                                  " receive WRs, " + std::to_string(attr.cap.max_inline_data) +
                                  " inline bytes); the NIC refused these limits");
  QpCap cap;  // what the NIC granted (at least what was asked)
  cap.max_send_wr = ia.cap.max_send_wr;
  cap.max_recv_wr = ia.cap.max_recv_wr;
  cap.max_send_sge = std::min<std::uint32_t>(ia.cap.max_send_sge, kMaxSge);
  cap.max_recv_sge = std::min<std::uint32_t>(ia.cap.max_recv_sge, kMaxSge);
  cap.max_inline_data = ia.cap.max_inline_data;
  return std::shared_ptr<QueuePair>(std::make_shared<VerbsQp>(
      shared_from_this(), scq->shared_from_this(), rcq->shared_from_this(),
      srq != nullptr ? srq->shared_from_this() : nullptr, qp, attr.type, cap));
}

std::string VerbsQp::what() const { return "QP " + std::to_string(qp_->qp_num) + " on " + dev().name(); }

// ---- state ---------------------------------------------------------------------------------
QpState VerbsQp::state() const noexcept {
  // The NIC moves QPs on its own (to ERR on a fatal completion, to RTS through the iWARP CM),
  // so ask it rather than remember.
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  const QpState set = set_state_.load();
  const QpState nic = ibv_query_qp(qp_, &a, IBV_QP_STATE, &ia) != 0 ? from_ibv(qp_->state) : from_ibv(a.qp_state);
  // An iWARP device that answers RESET for a QP we moved on does not report state (siw): then
  // it is what we and the CM set, or ERR after an error completion.
  if (dev().iwarp() && nic == QpState::reset && set != QpState::reset) {
    dev().context().drain_async_events();
    return failed_.load() && set != QpState::err ? QpState::err : set;
  }
  return nic;
}

Status VerbsQp::modify_raw(ibv_qp_attr& a, int mask, const char* step) {
  if (int e = ibv_modify_qp(qp_, &a, mask); e != 0) return verbs_error(e, what() + ": " + step);
  if ((mask & IBV_QP_STATE) != 0) set_state_ = from_ibv(a.qp_state);
  return {};
}

Status VerbsQp::modify(const QpAttr& a, QpAttrMask mask) {
  const QpState cur = state();
  if (mask_has(mask, QpAttrMask::cur_state) && a.cur_qp_state != cur)
    return make_error(Errc::invalid_argument, what() + ": cur_qp_state " + std::string(to_string(a.cur_qp_state)) +
                                                  " does not match the QP's state " + std::string(to_string(cur)));
  const QpState next = mask_has(mask, QpAttrMask::state) ? a.qp_state : cur;
  VRDMA_TRY(check_qp_transition(type_, cur, next, mask));
  if (mask_has(mask, QpAttrMask::port)) VRDMA_TRY(dev().check_port(a.port_num));
  if (mask_has(mask, QpAttrMask::av)) {
    auto ll = dev().link_layer(a.ah_attr.port_num);
    if (!ll) return std::move(ll).error();
    if (*ll == LinkLayer::infiniband)
      return make_error(Errc::not_supported, what() + ": port " + std::to_string(a.ah_attr.port_num) +
                                                 " is InfiniBand, which needs a destination LID the API does not carry yet");
  }
  if (mask_has(mask, QpAttrMask::alt_path) || mask_has(mask, QpAttrMask::path_mig_state))
    return make_error(Errc::not_supported, what() + ": alternate paths (APM) are not offered by the API");
  if (dev().iwarp() && (next == QpState::rtr || (next == QpState::rts && cur != QpState::rts)))
    return make_error(Errc::not_supported,
                      what() + " is iWARP: its QPs reach RTR and RTS only through the connection manager, which runs "
                               "the MPA exchange (verbs::cm_resolve/cm_listen, then connect/accept); " +
                          std::string(to_string(cur)) + " -> " + std::string(to_string(next)) + " by modify is not supported");

  ibv_qp_attr ia{};
  ia.qp_state = to_ibv(a.qp_state);
  ia.cur_qp_state = to_ibv(a.cur_qp_state);
  ia.path_mtu = static_cast<ibv_mtu>(a.path_mtu);
  ia.qkey = a.qkey;
  ia.rq_psn = a.rq_psn;
  ia.sq_psn = a.sq_psn;
  ia.dest_qp_num = a.dest_qp_num;
  ia.qp_access_flags = static_cast<unsigned>(a.qp_access_flags);
  ia.cap.max_send_wr = a.cap.max_send_wr;
  ia.cap.max_recv_wr = a.cap.max_recv_wr;
  ia.cap.max_send_sge = a.cap.max_send_sge;
  ia.cap.max_recv_sge = a.cap.max_recv_sge;
  ia.cap.max_inline_data = a.cap.max_inline_data;
  ia.ah_attr = ah_of(a.ah_attr);
  ia.pkey_index = a.pkey_index;
  ia.sq_draining = a.sq_draining;
  ia.max_rd_atomic = a.max_rd_atomic;
  ia.max_dest_rd_atomic = a.max_dest_rd_atomic;
  ia.min_rnr_timer = a.min_rnr_timer;
  ia.port_num = a.port_num;
  ia.timeout = a.timeout;
  ia.retry_cnt = a.retry_cnt;
  ia.rnr_retry = a.rnr_retry;
  const int m = static_cast<int>(static_cast<std::uint32_t>(mask));  // same bits as ibv_qp_attr_mask
  if (int e = ibv_modify_qp(qp_, &ia, m); e != 0)
    return verbs_error(e, what() + ": " + std::string(to_string(cur)) + " -> " + std::string(to_string(next)) +
                              " with " + mask_names(mask) + " refused by the NIC");
  set_state_ = next;
  if (next == QpState::reset || next == QpState::init) failed_ = false;
  if (next == QpState::reset && log_) log_->clear();  // RESET empties the receive queue
  return {};
}

Result<QpAttr> VerbsQp::query() const {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  const int all = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                  IBV_QP_QKEY | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                  IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN |
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_CAP | IBV_QP_DEST_QPN;
  if (int e = ibv_query_qp(qp_, &a, all, &ia); e != 0) return verbs_error(e, what() + ": query");
  QpAttr o;
  o.qp_state = from_ibv(a.qp_state);
  o.cur_qp_state = from_ibv(a.cur_qp_state);
  o.path_mtu = static_cast<Mtu>(a.path_mtu);
  o.qkey = a.qkey;
  o.rq_psn = a.rq_psn;
  o.sq_psn = a.sq_psn;
  o.dest_qp_num = a.dest_qp_num;
  o.qp_access_flags = static_cast<Access>(a.qp_access_flags);
  o.cap = cap_;
  o.cap.max_inline_data = std::max(cap_.max_inline_data, a.cap.max_inline_data);
  o.ah_attr = ah_from(a.ah_attr);
  o.pkey_index = a.pkey_index;
  o.sq_draining = a.sq_draining;
  o.max_rd_atomic = a.max_rd_atomic;
  o.max_dest_rd_atomic = a.max_dest_rd_atomic;
  o.min_rnr_timer = a.min_rnr_timer;
  o.port_num = a.port_num;
  o.timeout = a.timeout;
  o.retry_cnt = a.retry_cnt;
  o.rnr_retry = a.rnr_retry;
  return o;
}

// ---- posting -------------------------------------------------------------------------------
Status VerbsQp::post_send(std::span<const SendWr> wrs, std::size_t* bad_index) {
  auto fail = [&](std::size_t i, Error e) -> Status {
    if (bad_index) *bad_index = i;
    return e;
  };
  // Posting before RTS is an application error every provider reports the same way (some NICs
  // would accept the WQE and never execute it).
  auto not_ready = [](QpState st) { return st == QpState::reset || st == QpState::init || st == QpState::rtr; };
  QpState s = set_state_.load(std::memory_order_relaxed);
  if (not_ready(s)) s = state();
  if (not_ready(s))
    return fail(0, make_error(Errc::bad_state, what() + " is in " + std::string(to_string(s)) +
                                                   "; post_send needs RTS (move the QP through INIT, RTR, RTS first)"));
  for (std::size_t base = 0; base < wrs.size(); base += kBatch) {
    const std::size_t n = std::min(kBatch, wrs.size() - base);
    ibv_send_wr w[kBatch];
    ibv_sge sg[kBatch][kMaxSge];
    for (std::size_t k = 0; k < n; ++k) {
      const SendWr& in = wrs[base + k];
      if (in.sg_list.size() > cap_.max_send_sge)
        return fail(base + k, make_error(Errc::invalid_argument, what() + ": " + std::to_string(in.sg_list.size()) +
                                                                     " SGEs, the QP takes at most " + std::to_string(cap_.max_send_sge)));
      if (type_ == QpType::ud && in.opcode != WrOpcode::send && in.opcode != WrOpcode::send_with_imm)
        return fail(base + k, make_error(Errc::invalid_argument, what() + ": UD QPs carry only SEND and SEND_WITH_IMM, not " +
                                                                     std::string(to_string(in.opcode))));
      if (!is_known(in.opcode))
        return fail(base + k, make_error(Errc::invalid_argument, what() + ": unknown opcode"));
      if (is_local_op(in.opcode))
        return fail(base + k, make_error(Errc::not_supported, what() + ": " + std::string(to_string(in.opcode)) +
                                                                  " works on fast-registration regions, which only kernel "
                                                                  "users make (rdma-core has no alloc_mr)"));
      if (in.opcode == WrOpcode::rdma_read && dev().max_sge_rd() != 0 && in.sg_list.size() > dev().max_sge_rd())
        return fail(base + k, make_error(Errc::not_supported, what() + ": an RDMA READ into " + std::to_string(in.sg_list.size()) +
                                                                  " SGEs; " + dev().name() + " scatters READ responses into at most " +
                                                                  std::to_string(dev().max_sge_rd()) + " (max_sge_rd)"));
      const bool atomic = in.opcode == WrOpcode::atomic_cmp_and_swp || in.opcode == WrOpcode::atomic_fetch_and_add;
      if (atomic && !dev().atomics())
        return fail(base + k, make_error(Errc::not_supported, what() + ": " + dev().name() +
                                                                  " has no atomic operations (its atomic_cap is none)"));
      if (dev().iwarp() && (in.opcode == WrOpcode::send_with_imm || in.opcode == WrOpcode::rdma_write_with_imm))
        return fail(base + k, make_error(Errc::not_supported, what() + ": " + dev().name() + " is iWARP, which carries no "
                                                                  "immediate data (RFC 5040); " +
                                                                  std::string(to_string(in.opcode)) + " is not supported"));
      ibv_send_wr& o = w[k];
      o = ibv_send_wr{};
      o.wr_id = in.wr_id;
      o.next = k + 1 < n ? &w[k + 1] : nullptr;
      o.sg_list = sg[k];
      o.num_sge = copy_sges(in.sg_list, sg[k]);
      o.opcode = static_cast<ibv_wr_opcode>(static_cast<int>(in.opcode));  // same values as ibv_wr_opcode
      o.send_flags = static_cast<unsigned>(in.flags);                       // same bits as ibv_send_flags
      if (in.opcode == WrOpcode::send_with_imm || in.opcode == WrOpcode::rdma_write_with_imm)
        o.imm_data = htobe32(in.imm_data);
      if (in.opcode == WrOpcode::send_with_inv) o.invalidate_rkey = in.invalidate_rkey;
      if (type_ == QpType::ud) {
        auto* ah = dynamic_cast<VerbsAh*>(in.ud.ah);
        if (ah == nullptr || &ah->pd().dev() != &dev())
          return fail(base + k, make_error(Errc::invalid_argument, what() + ": UD send without an address handle of this device"));
        o.wr.ud.ah = ah->ah();
        o.wr.ud.remote_qpn = in.ud.remote_qpn;
        o.wr.ud.remote_qkey = in.ud.remote_qkey;
      } else if (in.opcode == WrOpcode::atomic_cmp_and_swp || in.opcode == WrOpcode::atomic_fetch_and_add) {
        o.wr.atomic.remote_addr = in.atomic.remote_addr;
        o.wr.atomic.rkey = in.atomic.rkey;
        o.wr.atomic.compare_add = in.atomic.compare_add;
        o.wr.atomic.swap = in.atomic.swap;
      } else {
        o.wr.rdma.remote_addr = in.rdma.remote_addr;
        o.wr.rdma.rkey = in.rdma.rkey;
      }
    }
    ibv_send_wr* bad = nullptr;
    if (int e = ibv_post_send(qp_, w, &bad); e != 0) {
      const std::size_t at = base + (bad != nullptr ? static_cast<std::size_t>(bad - w) : 0);
      if (e == ENOMEM)
        return fail(at, make_error(Errc::would_block, what() + ": send queue is full (" + std::to_string(cap_.max_send_wr) +
                                                        " work requests); poll the CQ before posting more"));
      return fail(at, verbs_error(e, what() + ": the NIC refused send work request " + std::to_string(at)));
    }
  }
  return {};
}

Status VerbsQp::post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) {
  auto fail = [&](std::size_t i, Error e) -> Status {
    if (bad_index) *bad_index = i;
    return e;
  };
  if (srq_) return fail(0, make_error(Errc::invalid_argument, what() + " takes its receives from an SRQ; post to the SRQ"));
  if (set_state_.load(std::memory_order_relaxed) == QpState::reset && state() == QpState::reset)
    return fail(0, make_error(Errc::bad_state, what() + " is in RESET; post_recv needs INIT or later"));
  for (std::size_t base = 0; base < wrs.size(); base += kBatch) {
    const std::size_t n = std::min(kBatch, wrs.size() - base);
    ibv_recv_wr w[kBatch];
    ibv_sge sg[kBatch][kMaxSge];
    for (std::size_t k = 0; k < n; ++k) {
      const RecvWr& in = wrs[base + k];
      if (in.sg_list.size() > cap_.max_recv_sge)
        return fail(base + k, make_error(Errc::invalid_argument, what() + ": " + std::to_string(in.sg_list.size()) +
                                                                     " SGEs, the QP takes at most " + std::to_string(cap_.max_recv_sge)));
      w[k] = ibv_recv_wr{};
      w[k].wr_id = in.wr_id;
      w[k].next = k + 1 < n ? &w[k + 1] : nullptr;
      w[k].sg_list = sg[k];
      w[k].num_sge = copy_sges(in.sg_list, sg[k]);
    }
    if (log_) log_->add(wrs.subspan(base, n));  // before the NIC can complete them
    ibv_recv_wr* bad = nullptr;
    if (int e = ibv_post_recv(qp_, w, &bad); e != 0) {
      const std::size_t at = base + (bad != nullptr ? static_cast<std::size_t>(bad - w) : 0);
      if (log_)
        for (std::size_t k = at - base; k < n; ++k) log_->undo_last();
      if (e == ENOMEM)
        return fail(at, make_error(Errc::would_block, what() + ": receive queue is full (" + std::to_string(cap_.max_recv_wr) +
                                                        " work requests)"));
      return fail(at, verbs_error(e, what() + ": the NIC refused receive work request " + std::to_string(at)));
    }
  }
  return {};
}

// ---- migration -----------------------------------------------------------------------------
Result<std::vector<std::uint8_t>> VerbsQp::export_state() const {
  return make_error(Errc::not_supported, what() + ": a hardware QP's state cannot be exported; migrate verbs "
                                                  "devices by draining the QP and re-creating it on the destination");
}

Status VerbsQp::import_state(std::span<const std::uint8_t>) {
  return make_error(Errc::not_supported, what() + ": a hardware QP cannot take an imported state; re-create and "
                                                  "reconnect it instead");
}

Result<std::vector<std::uint8_t>> VerbsSrq::export_state() const {
  return make_error(Errc::not_supported, "a hardware SRQ's posted receives cannot be read back from the NIC");
}

Status VerbsSrq::import_state(std::span<const std::uint8_t>) {
  return make_error(Errc::not_supported, "a hardware SRQ cannot take an imported state; post its receives again");
}

}  // namespace vrdma::nicdrv::verbs
