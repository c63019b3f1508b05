// QP state export/import for live migration: everything the engine knows about a QP, as a
// versioned little-endian blob. Import resumes by retransmitting from the oldest unacknowledged
// PSN, so packets lost in the switchover are recovered by the normal RC machinery.
#include <cstring>
#include <type_traits>

#include "soft/engine.hpp"
#include "vrdma/common/bytes.hpp"

namespace vrdma::nicdrv::soft {
namespace {

constexpr std::uint32_t kMagic = 0x56514d31;  // "VQM1"
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kSrqMagic = 0x56534d31;  // "VSM1"
constexpr std::uint32_t kSrqVersion = 1;


// Fixed-layout part of a send WQE (everything but the inline bytes).
struct WqeRec {
  std::uint64_t wr_id, remote_addr, compare_add, swap;
  std::uint32_t rkey, imm, ud_dst_ip_be, ud_qpn, ud_qkey, num_sge, length, first_psn, npkts, resp_pkts;
  std::uint8_t opcode, signaled, solicited, fence, is_inline, started, done, status;
  std::array<Sge, kMaxSge> sge;
};

struct RecvRec {
  std::uint64_t wr_id;
  std::uint32_t num_sge;
  std::array<Sge, kMaxSge> sge;
};

RecvRec to_rec(const RecvWqe& r) { return RecvRec{r.wr_id, r.num_sge, r.sge}; }
RecvWqe from_rec(const RecvRec& r) { return RecvWqe{r.wr_id, std::min<std::uint32_t>(r.num_sge, kMaxSge), r.sge}; }

}  // namespace

Result<std::vector<std::uint8_t>> SoftQp::export_state() const {
  std::lock_guard lk(dev.mu_);
  ByteWriter w;
  w.put(kMagic, kVersion, qpn_, static_cast<std::uint8_t>(type_), static_cast<std::uint8_t>(state()), attr, cap,
        una_psn, next_new_psn, retry_left, rnr_left, static_cast<std::uint32_t>(sq_tail - sq_head));
  for (std::uint64_t i = sq_head; i != sq_tail; ++i) {
    const SendWqe& s = sq[i % sq.size()];
    // A REG_MR that has run is a completion like any other; one still waiting names memory of
    // this host, which the record cannot carry.
    if (s.opcode == WrOpcode::reg_mr && !s.started)
      return make_error(Errc::bad_state, "QP " + std::to_string(qpn_) + ": a REG_MR waits in the send queue (it names memory of this "
                                                          "host); let the send queue drain (SQD) before exporting the QP");
    WqeRec r{s.wr_id, s.remote_addr, s.compare_add, s.swap, s.rkey, s.imm, s.ud_dst_ip_be, s.ud_qpn, s.ud_qkey,
             s.num_sge, s.length, s.first_psn, s.npkts, s.resp_pkts, static_cast<std::uint8_t>(s.opcode),
             s.signaled, s.solicited, s.fence, s.is_inline, s.started, s.done, static_cast<std::uint8_t>(s.status),
             s.sge};
    w.put(r);
    w.bytes(s.inline_data);
  }
  w.put(static_cast<std::uint32_t>(rq.size()));
  for (const auto& r : rq) w.put(to_rec(r));
  // Responder.
  w.put(e_psn, msn, static_cast<std::uint8_t>(in_send), static_cast<std::uint8_t>(in_write),
        static_cast<std::uint8_t>(have_recv), to_rec(cur_recv), recv_offset, write_va, write_rkey, write_left,
        write_total, static_cast<std::uint32_t>(rd_res.size()));
  for (const auto& r : rd_res) w.put(r);
  w.put(static_cast<std::uint64_t>(rd_res_next), static_cast<std::uint32_t>(read_jobs.size()));
  for (const auto& j : read_jobs) w.put(j);
  return std::move(w.out);
}

Status SoftQp::import_state(std::span<const std::uint8_t> blob) {
  std::lock_guard lk(dev.mu_);
  auto bad = [&](const char* what) -> Status {
    return make_error(Errc::invalid_argument, "QP " + std::to_string(qpn_) + ": state blob rejected (" + what + ")");
  };
  if (state() != QpState::reset) return make_error(Errc::bad_state, "QP " + std::to_string(qpn_) + ": import_state needs a QP in RESET");
  ByteReader r(blob);
  std::uint32_t magic = 0, version = 0, qpn = 0;
  std::uint8_t type = 0, st8 = 0;
  if (!r.get(magic) || magic != kMagic) return bad("not a soft-engine QP state");
  if (!r.get(version) || version != kVersion) return bad("unknown version");
  if (!r.get(qpn) || qpn != qpn_) return bad("it belongs to another QPN");
  if (!r.get(type) || type != static_cast<std::uint8_t>(type_)) return bad("QP type differs");
  if (!r.get(st8) || st8 > static_cast<std::uint8_t>(QpState::err)) return bad("bad state");
  QpAttr a;
  QpCap c;
  std::uint32_t una = 0, nnp = 0, rl = 0, rnl = 0, nsq = 0;
  if (!r.get(a) || !r.get(c) || !r.get(una) || !r.get(nnp) || !r.get(rl) || !r.get(rnl) || !r.get(nsq)) return bad("truncated");
  if (c.max_send_wr > sq.size() || nsq > sq.size() || c.max_recv_wr > rq_max) return bad("queues larger than this QP's");
  // The same value checks modify() makes: a blob must not smuggle in what a modify would refuse.
  auto mtu = static_cast<unsigned>(a.path_mtu);
  if (mtu < 1 || mtu > static_cast<unsigned>(dev.active_mtu())) return bad("path MTU out of range for this port");
  if (st8 >= static_cast<std::uint8_t>(QpState::rtr) && type_ == QpType::rc && !a.ah_attr.dgid.is_ipv4_mapped())
    return bad("destination is not an IPv4-mapped RoCEv2 GID");
  if (a.dest_qp_num > wire::kQpnMask || a.max_rd_atomic > 16 || a.max_dest_rd_atomic > 16 || a.timeout > 31 ||
      a.retry_cnt > 7 || a.rnr_retry > 7 || a.min_rnr_timer > 31 || a.port_num != 1 || a.pkey_index != 0 ||
      rl > 7 || rnl > 7 || (a.sq_psn | a.rq_psn | una | nnp) > wire::kPsnMask)
    return bad("attribute out of range");
  std::vector<SendWqe> wqes(nsq);
  for (auto& s : wqes) {
    WqeRec x{};
    if (!r.get(x) || !r.bytes(s.inline_data, cap.max_inline_data)) return bad("truncated send queue");
    if (x.num_sge > kMaxSge || x.num_sge > cap.max_send_sge ||
        !is_known(static_cast<WrOpcode>(x.opcode)) ||
        x.status > static_cast<std::uint8_t>(WcStatus::general_err) || x.first_psn > wire::kPsnMask ||
        x.npkts > (1u << 23) || x.resp_pkts > x.npkts || (x.is_inline && s.inline_data.size() != x.length) ||
        (static_cast<WrOpcode>(x.opcode) == WrOpcode::reg_mr && !x.started))
      return bad("bad WQE");
    s.wr_id = x.wr_id; s.remote_addr = x.remote_addr; s.compare_add = x.compare_add; s.swap = x.swap;
    s.rkey = x.rkey; s.imm = x.imm; s.ud_dst_ip_be = x.ud_dst_ip_be; s.ud_qpn = x.ud_qpn; s.ud_qkey = x.ud_qkey;
    s.num_sge = x.num_sge; s.length = x.length; s.first_psn = x.first_psn; s.npkts = x.npkts; s.resp_pkts = x.resp_pkts;
    s.opcode = static_cast<WrOpcode>(x.opcode); s.signaled = x.signaled; s.solicited = x.solicited; s.fence = x.fence;
    s.is_inline = x.is_inline; s.started = x.started; s.done = x.done; s.status = static_cast<WcStatus>(x.status);
    s.sge = x.sge;
  }
  std::uint32_t nrq = 0;
  if (!r.get(nrq) || nrq > rq_max) return bad("receive queue larger than this QP's");
  std::deque<RecvWqe> rqs;
  for (std::uint32_t i = 0; i < nrq; ++i) {
    RecvRec x{};
    if (!r.get(x)) return bad("truncated receive queue");
    if (x.num_sge > cap.max_recv_sge) return bad("receive WQE with too many SGEs");
    rqs.push_back(from_rec(x));
  }
  std::uint8_t isend = 0, iwrite = 0, hrecv = 0;
  RecvRec cur{};
  std::uint32_t ep = 0, m = 0, roff = 0, wrk = 0, wl = 0, wt = 0, nres = 0, njobs = 0;
  std::uint64_t wva = 0, rnext = 0;
  if (!r.get(ep) || !r.get(m) || !r.get(isend) || !r.get(iwrite) || !r.get(hrecv) || !r.get(cur) || !r.get(roff) ||
      !r.get(wva) || !r.get(wrk) || !r.get(wl) || !r.get(wt) || !r.get(nres) || nres > 16)
    return bad("truncated responder state");
  std::vector<RdAtomicResource> res(nres);
  for (auto& x : res)
    if (!r.get(x)) return bad("truncated responder resources");
  if (!r.get(rnext) || (nres > 0 && rnext >= nres) || !r.get(njobs) || njobs > 16) return bad("bad responder resources");
  if (cur.num_sge > kMaxSge || (st8 >= static_cast<std::uint8_t>(QpState::rtr) && type_ == QpType::rc && nres == 0))
    return bad("bad responder state");
  std::deque<ReadJob> jobs(njobs);
  for (auto& j : jobs)
    if (!r.get(j) || j.npkts == 0 || j.npkts > (1u << 23) ||
        static_cast<std::uint32_t>(wire::psn_diff(j.next_psn, j.first_psn)) > j.npkts)
      return bad("bad read response state");
  if (!r.at_end()) return bad("trailing bytes");

  // Commit.
  attr = a;
  sq_head = 0;
  sq_tail = nsq;
  for (std::uint32_t i = 0; i < nsq; ++i) {
    sq[i] = std::move(wqes[i]);
    sq[i].forget_after_gap();  // only the in-order part of a READ travels
  }
  rd_atomic_outstanding = 0;
  for (std::uint32_t i = 0; i < nsq; ++i)
    if (sq[i].started && !sq[i].done && sq[i].npkts > 0 &&
        is_rd_atomic(sq[i].opcode))
      ++rd_atomic_outstanding;
  una_psn = una;
  next_new_psn = nnp;
  retry_left = rl;
  rnr_left = rnl;
  rq = std::move(rqs);
  e_psn = ep;
  msn = m;
  in_send = isend != 0;
  in_write = iwrite != 0;
  have_recv = hrecv != 0;
  cur_recv = from_rec(cur);
  recv_offset = roff;
  write_va = wva;
  write_rkey = wrk;
  write_left = wl;
  write_total = wt;
  rd_res = std::move(res);
  rd_res_next = static_cast<std::size_t>(rnext);
  read_jobs = std::move(jobs);
  read_replays.clear();
  reset_send_loss_state(next_new_psn);
  set_state(static_cast<QpState>(st8));
  // Resume: retransmit everything not yet acknowledged.
  sq_next = 0;
  send_psn = una_psn;
  dev.go_back_n(*this, una_psn);
  if (wire::psn_lt(una_psn, next_new_psn)) retx_deadline = dev.retx_interval(*this);
  dev.rearm(*this);
  dev.mark_active(*this);
  return {};
}

// An SRQ's state: its receives not yet taken, oldest first. The SGEs name regions by key, which
// a soft engine keeps across a move (the regions travel first).
Result<std::vector<std::uint8_t>> SoftSrq::export_state() const {
  std::lock_guard lk(pd_->dev().mu_);
  ByteWriter w;
  w.put(kSrqMagic, kSrqVersion, max_wr_, max_sge_, static_cast<std::uint32_t>(queue.size()));
  for (const auto& r : queue) w.put(to_rec(r));
  return std::move(w.out);
}

Status SoftSrq::import_state(std::span<const std::uint8_t> blob) {
  std::lock_guard lk(pd_->dev().mu_);
  auto bad = [](const std::string& what) -> Status {
    return make_error(Errc::invalid_argument, "SRQ state blob rejected (" + what + ")");
  };
  if (!queue.empty()) return make_error(Errc::bad_state, "import_state needs an SRQ with no receives posted");
  ByteReader r(blob);
  std::uint32_t magic = 0, version = 0, max_wr = 0, max_sge = 0, n = 0;
  if (!r.get(magic) || magic != kSrqMagic) return bad("not a soft-engine SRQ state");
  if (!r.get(version) || version != kSrqVersion) return bad("unknown version");
  if (!r.get(max_wr) || !r.get(max_sge) || !r.get(n)) return bad("truncated");
  if (max_wr != max_wr_ || max_sge != max_sge_)
    return bad("it was made with " + std::to_string(max_wr) + " work requests of " + std::to_string(max_sge) +
               " SGEs, this SRQ has " + std::to_string(max_wr_) + " of " + std::to_string(max_sge_));
  if (n > max_wr_) return bad("more receives than the SRQ holds");
  std::deque<RecvWqe> q;
  for (std::uint32_t i = 0; i < n; ++i) {
    RecvRec x{};
    if (!r.get(x)) return bad("truncated receive queue");
    if (x.num_sge > max_sge_) return bad("receive WQE with too many SGEs");
    q.push_back(from_rec(x));
  }
  if (!r.at_end()) return bad("trailing bytes");
  queue = std::move(q);
  return {};
}

}  // namespace vrdma::nicdrv::soft
