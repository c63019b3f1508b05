#include "rdma_pair.hpp"

#include <thread>

namespace vrdma::test {

using namespace vrdma::nicdrv;

Result<Endpoint> make_endpoint(std::shared_ptr<Device> dev, const PairOptions& o) {
  Endpoint e;
  e.dev = std::move(dev);
  auto pd = e.dev->alloc_pd();
  if (!pd) return std::move(pd).error();
  e.pd = *pd;
  auto cq = e.dev->create_cq(o.cq_depth);
  if (!cq) return std::move(cq).error();
  e.cq = *cq;
  QpInitAttr ia;
  ia.type = o.type;
  ia.send_cq = e.cq.get();
  ia.recv_cq = e.cq.get();
  ia.cap.max_send_wr = o.sq_depth;
  ia.cap.max_recv_wr = o.rq_depth;
  ia.cap.max_send_sge = o.max_sge;
  ia.cap.max_recv_sge = o.max_sge;
  ia.cap.max_inline_data = 256;
  auto qp = e.pd->create_qp(ia);
  if (!qp) return std::move(qp).error();
  e.qp = *qp;
  auto mem = e.dev->alloc_buffer(o.buf_bytes);
  if (!mem) return std::move(mem).error();
  e.buf.mem = *mem;
  auto mr = e.pd->reg_mr(e.buf.data(), e.buf.size(), o.access);
  if (!mr) return std::move(mr).error();
  e.mr = *mr;
  auto g = e.dev->query_gid(o.gid_index);
  if (!g) return std::move(g).error();
  e.gid = g->gid;
  return e;
}

Status bring_up(QueuePair& qp, const PeerInfo& peer, std::uint32_t my_psn, const PairOptions& o) {
  const std::uint32_t peer_psn = peer.psn;
  QpAttr a;
  a.qp_state = QpState::init;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = o.access;
  a.qkey = o.qkey;
  using M = QpAttrMask;
  bool rc = o.type == QpType::rc;
  VRDMA_TRY(qp.modify(a, M::state | M::pkey_index | M::port | (rc ? M::access_flags : M::qkey)));
  a.qp_state = QpState::rtr;
  if (rc) {
    a.path_mtu = o.mtu;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer_psn;
    a.max_dest_rd_atomic = o.rd_atomic;
    a.min_rnr_timer = o.min_rnr_timer;
    a.ah_attr.dgid = peer.gid;
    a.ah_attr.sgid_index = o.gid_index;
    VRDMA_TRY(qp.modify(a, M::state | M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic |
                                 M::min_rnr_timer));
  } else {
    VRDMA_TRY(qp.modify(a, M::state));
  }
  a.qp_state = QpState::rts;
  a.sq_psn = my_psn;
  a.timeout = o.timeout;
  a.retry_cnt = o.retry_cnt;
  a.rnr_retry = o.rnr_retry;
  a.max_rd_atomic = o.rd_atomic;
  if (rc) return qp.modify(a, M::state | M::sq_psn | M::timeout | M::retry_cnt | M::rnr_retry | M::max_qp_rd_atomic);
  return qp.modify(a, M::state | M::sq_psn);
}

Status connect_to(Endpoint& self, const PeerInfo& peer, std::uint32_t my_psn, const PairOptions& o) {
  return bring_up(*self.qp, peer, my_psn, o);
}

Status write_checked(Endpoint& a, const Endpoint& b, std::size_t n, std::uint64_t seed,
                     std::chrono::milliseconds timeout) {
  fill_pattern(a.buf.data(), n, seed);
  Sge s{reinterpret_cast<std::uint64_t>(a.buf.data()), static_cast<std::uint32_t>(n), a.mr->lkey()};
  SendWr w;
  w.opcode = WrOpcode::rdma_write;
  w.flags = SendFlags::signaled;
  w.sg_list = std::span<const Sge>(&s, 1);
  w.rdma.remote_addr = b.mr->addr();
  w.rdma.rkey = b.mr->rkey();
  VRDMA_TRY(a.qp->post_send(std::span(&w, 1)));
  auto wc = wait_cq(*a.cq, 1, timeout);
  if (wc.empty()) return make_error(Errc::timeout, "the RDMA WRITE did not complete in time");
  if (wc[0].status != WcStatus::success)
    return make_error(Errc::io_error, "the RDMA WRITE completed with " + std::string(to_string(wc[0].status)));
  if (!check_pattern(b.buf.data(), n, seed)) return make_error(Errc::io_error, "the target does not hold the bytes written");
  return {};
}

Status connect(Endpoint& a, Endpoint& b, const PairOptions& o) {
  VRDMA_TRY(connect_to(a, PeerInfo{b.qp->qp_num(), b.gid, o.psn_b}, o.psn_a, o));
  VRDMA_TRY(connect_to(b, PeerInfo{a.qp->qp_num(), a.gid, o.psn_a}, o.psn_b, o));
  return {};
}

std::vector<WorkCompletion> wait_cq(CompletionQueue& cq, std::size_t n, std::chrono::milliseconds timeout) {
  std::vector<WorkCompletion> out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  WorkCompletion wc[32];
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    auto r = cq.poll(std::span<WorkCompletion>(wc, 32));
    if (!r) break;
    for (std::size_t i = 0; i < *r; ++i) out.push_back(wc[i]);
    if (*r == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return out;
}

void fill_pattern(std::uint8_t* p, std::size_t n, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<std::uint8_t>(x);
  }
}

bool check_pattern(const std::uint8_t* p, std::size_t n, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (p[i] != static_cast<std::uint8_t>(x)) return false;
  }
  return true;
}

}  // namespace vrdma::test
