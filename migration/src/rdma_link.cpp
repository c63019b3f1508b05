#include "rdma_link.hpp"

#include <arpa/inet.h>

#include <cstring>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "vrdma/migration/stream.hpp"

namespace vrdma::migration {

using namespace nicdrv;

namespace {
constexpr std::uint32_t kChunk = 1u << 20;                    // bytes per RDMA WRITE
constexpr std::uint32_t kMaxWrites = kMaxStateBytes / kChunk;  // the whole largest state in flight
}  // namespace

RdmaLink::~RdmaLink() = default;

Result<std::unique_ptr<RdmaLink>> RdmaLink::create(std::shared_ptr<Device> engine, std::uint64_t expose_bytes) {
  std::unique_ptr<RdmaLink> l(new RdmaLink());
  l->engine_ = std::move(engine);
  auto gid = preferred_gid(*l->engine_);
  if (!gid) return std::move(gid).error();
  l->sgid_index_ = static_cast<std::uint8_t>(gid->index);
  auto port = l->engine_->query_port(1);
  if (!port) return std::move(port).error();
  l->mtu_ = port->active_mtu;
  auto pd = l->engine_->alloc_pd();
  if (!pd) return std::move(pd).error();
  l->pd_ = *pd;
  auto cq = l->engine_->create_cq(kMaxWrites);
  if (!cq) return std::move(cq).error();
  l->cq_ = *cq;
  QpInitAttr qa;
  qa.type = QpType::rc;
  qa.send_cq = l->cq_.get();
  qa.recv_cq = l->cq_.get();
  qa.cap.max_send_wr = kMaxWrites;
  qa.cap.max_recv_wr = 1;
  auto qp = l->pd_->create_qp(qa);
  if (!qp) return std::move(qp).error();
  l->qp_ = *qp;
  if (expose_bytes > 0) {
    if (expose_bytes > kMaxStateBytes)
      return make_error(Errc::invalid_argument, fmt::format("a state buffer holds at most {} bytes", kMaxStateBytes));
    auto b = l->engine_->alloc_buffer(expose_bytes);
    if (!b) return std::move(b).error();
    l->buf_ = *b;
    auto mr = l->pd_->reg_mr(l->buf_->data(), expose_bytes, Access::local_write | Access::remote_write);
    if (!mr) return std::move(mr).error();
    l->mr_ = *mr;
    l->local_.addr = (*mr)->addr();
    l->local_.rkey = (*mr)->rkey();
    l->local_.bytes = expose_bytes;
  }
  l->local_.gid = gid->gid.str();
  l->local_.qpn = l->qp_->qp_num();
  l->local_.psn = std::random_device{}() & 0xffffff;
  return l;
}

Status RdmaLink::connect(const RdmaPeer& peer) {
  in6_addr a{};
  if (::inet_pton(AF_INET6, peer.gid.c_str(), &a) != 1)
    return make_error(Errc::invalid_argument, "'" + peer.gid + "' is not a GID");
  peer_ = peer;
  QpAttr at;
  at.qp_state = QpState::init;
  at.pkey_index = 0;
  at.port_num = 1;
  at.qp_access_flags = Access::local_write | Access::remote_write;
  using M = QpAttrMask;
  VRDMA_TRY(qp_->modify(at, M::state | M::pkey_index | M::port | M::access_flags));
  at.qp_state = QpState::rtr;
  at.path_mtu = mtu_;
  at.dest_qp_num = peer.qpn;
  at.rq_psn = peer.psn;
  at.max_dest_rd_atomic = 1;
  at.min_rnr_timer = 12;
  std::memcpy(at.ah_attr.dgid.raw.data(), &a, 16);
  at.ah_attr.sgid_index = sgid_index_;
  VRDMA_TRY(qp_->modify(at, M::state | M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic |
                                M::min_rnr_timer));
  at.qp_state = QpState::rts;
  at.sq_psn = local_.psn;
  at.timeout = 12;  // ~16.8 ms local ACK timeout
  at.retry_cnt = 7;
  at.rnr_retry = 7;
  at.max_rd_atomic = 1;
  return qp_->modify(at, M::state | M::sq_psn | M::timeout | M::retry_cnt | M::rnr_retry | M::max_qp_rd_atomic);
}

Status RdmaLink::write(std::span<const std::uint8_t> blob, std::chrono::milliseconds timeout) {
  auto s = post_and_wait(blob, timeout);
  if (!s.ok()) {
    // Nothing may read the blob after this returns (the caller sends it over TCP and frees it):
    // the QP goes to the error state, which flushes whatever it has not sent.
    QpAttr at;
    at.qp_state = QpState::err;
    (void)qp_->modify(at, QpAttrMask::state);
  }
  return s;
}

Status RdmaLink::post_and_wait(std::span<const std::uint8_t> blob, std::chrono::milliseconds timeout) {
  if (blob.size() > peer_.bytes)
    return make_error(Errc::no_memory, fmt::format("the state ({} bytes) is larger than the destination's buffer "
                                                   "({} bytes)",
                                                   blob.size(), peer_.bytes));
  if (blob.empty()) return {};
  auto mr = pd_->reg_mr(const_cast<std::uint8_t*>(blob.data()), blob.size(), Access::local_write);
  if (!mr) return std::move(mr).error();
  std::size_t posted = 0, done = 0;
  for (std::size_t off = 0; off < blob.size(); off += kChunk) {
    const auto len = static_cast<std::uint32_t>(std::min<std::size_t>(kChunk, blob.size() - off));
    Sge s{reinterpret_cast<std::uint64_t>(blob.data() + off), len, (*mr)->lkey()};
    SendWr w;
    w.wr_id = posted;
    w.opcode = WrOpcode::rdma_write;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    w.rdma.remote_addr = peer_.addr + off;
    w.rdma.rkey = peer_.rkey;
    VRDMA_TRY(qp_->post_send(std::span(&w, 1)));
    ++posted;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::array<WorkCompletion, 16> wcs;
  while (done < posted) {
    auto n = cq_->poll(wcs);
    if (!n) return std::move(n).error();
    for (std::size_t i = 0; i < *n; ++i) {
      if (wcs[i].status != WcStatus::success)
        return make_error(Errc::io_error, fmt::format("an RDMA WRITE of the state to {} failed ({})", peer_.gid,
                                                      to_string(wcs[i].status)));
      ++done;
    }
    if (*n == 0) {
      if (std::chrono::steady_clock::now() > deadline)
        return make_error(Errc::timeout, fmt::format("{} did not acknowledge the state's RDMA WRITEs within {} ms",
                                                     peer_.gid, timeout.count()));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  return {};
}

std::span<const std::uint8_t> RdmaLink::received(std::uint64_t bytes) const {
  if (!buf_ || bytes > local_.bytes) return {};
  return {buf_->data(), static_cast<std::size_t>(bytes)};
}

}  // namespace vrdma::migration
