// The pv provider's objects in a PD (docs/virtio-rdma.md): memory registration (the pages'
// guest-physical addresses in a list the device reads), QPs and SRQs (their rings and status
// blocks in DMA memory) and AHs, each one control command.
#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "pv_internal.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::pv::detail {

Result<std::shared_ptr<MemoryRegion>> PvPd::reg_mr(void* addr, std::size_t length, Access access,
                                                   const MrOptions& opts) {
  VRDMA_TRY(no_backend_options(dev_->name(), opts));
  if (opts.remote_invalidate)
    return make_error(Errc::not_supported, dev_->name() + ": on the virtio RDMA device a peer's SEND with Invalidate "
                                                          "ends only regions from alloc_mr (fast registration)");
  auto& t = dev_->transport();
  auto gpa = t.gpa_of(addr, length);
  if (!gpa)
    return make_error(Errc::invalid_argument, fmt::format("{}: {} bytes at {} are not device memory; allocate buffers "
                                                          "to register with Device::alloc_buffer()", dev_->name(), length,
                                                          addr));
  const auto npages = static_cast<std::uint32_t>(pages_spanned(*gpa, length, 12));
  auto list = t.alloc_dma(std::size_t{npages} * 8);
  if (!list) return std::move(list).error();
  Dma pages(&t, *list);
  write_page_list(pages.a.host, *gpa, npages, 12);
  vd::RegMrReq r{};
  r.pd = h_;
  r.access = static_cast<std::uint32_t>(access);
  // The region's first byte is `iova` (the caller's own address by default).
  const std::uint64_t iova = opts.iova.value_or(reinterpret_cast<std::uint64_t>(addr));
  VRDMA_TRY(same_page_offset(dev_->name(), iova, *gpa, 12));
  r.iova = iova;
  r.length = length;
  r.pages_gpa = pages.a.gpa;
  r.npages = npages;
  r.page_shift = 12;
  auto resp = dev_->call<vd::RegMrResp>(vd::Cmd::reg_mr, r);
  if (!resp) return std::move(resp).error();
  return std::shared_ptr<MemoryRegion>(std::make_shared<PvMr>(shared_from_this(), dev_, *resp, r.iova, length, access));
}

Result<std::shared_ptr<MemoryRegion>> PvPd::alloc_mr(std::uint32_t max_pages, const MrOptions& opts) {
  VRDMA_TRY(no_backend_options(dev_->name(), opts));
  const auto& c = dev_->config();
  if ((c.features & vd::kFeatureFastReg) == 0)
    return make_error(Errc::not_supported, dev_->name() + ": alloc_mr: the device offers no fast registration "
                                                          "(its engine cannot give a region new pages by a work request)");
  if (max_pages == 0 || max_pages > c.max_fast_reg_pages)
    return make_error(Errc::invalid_argument, fmt::format("{}: alloc_mr for {} pages: the device allows 1..{}",
                                                          dev_->name(), max_pages, c.max_fast_reg_pages));
  auto& t = dev_->transport();
  auto list = t.alloc_dma(std::size_t{max_pages} * 8);
  if (!list) return std::move(list).error();
  auto resp = dev_->call<vd::RegMrResp>(vd::Cmd::alloc_mr, vd::AllocMrReq{h_, max_pages});
  if (!resp) return std::move(resp).error();
  return std::shared_ptr<MemoryRegion>(
      std::make_shared<PvFastMr>(shared_from_this(), dev_, *resp, max_pages, Dma(&t, *list)));
}

Result<std::shared_ptr<MemoryRegion>> PvPd::reg_dma_mr(Access access) {
  vd::RegDmaMrReq r{};
  r.pd = h_;
  r.access = static_cast<std::uint32_t>(access);
  auto resp = dev_->call<vd::RegMrResp>(vd::Cmd::reg_dma_mr, r);
  if (!resp) return std::move(resp).error();
  return std::shared_ptr<MemoryRegion>(
      std::make_shared<PvMr>(shared_from_this(), dev_, *resp, 0, dev_->transport().dma_bytes(), access));
}

Result<std::shared_ptr<QueuePair>> PvPd::create_qp(const QpInitAttr& attr, const QpOptions& opts) {
  if (opts.requested_qpn != 0) return make_error(Errc::not_supported, dev_->name() + ": a pv guest cannot request QPNs");
  auto* scq = dynamic_cast<PvCq*>(attr.send_cq);
  auto* rcq = dynamic_cast<PvCq*>(attr.recv_cq);
  if (scq == nullptr || rcq == nullptr || &scq->device() != dev_.get() || &rcq->device() != dev_.get())
    return make_error(Errc::invalid_argument, dev_->name() + ": create_qp needs send and receive CQs of this device");
  auto* srq = attr.srq != nullptr ? dynamic_cast<PvSrq*>(attr.srq) : nullptr;
  if (attr.srq != nullptr && (srq == nullptr || &srq->device() != dev_.get()))
    return make_error(Errc::invalid_argument, dev_->name() + ": the SRQ belongs to another device");
  auto& t = dev_->transport();
  QpCap cap = attr.cap;
  cap.max_send_sge = std::max(1u, cap.max_send_sge);
  cap.max_recv_sge = std::max(1u, cap.max_recv_sge);
  WqRing sq, rq;
  sq.depth = std::bit_ceil(std::max(1u, cap.max_send_wr));
  sq.stride = vd::send_stride(cap.max_send_sge, cap.max_inline_data);
  auto sqm = t.alloc_dma(std::size_t{sq.depth} * sq.stride);
  if (!sqm) return std::move(sqm).error();
  sq.mem = Dma(&t, *sqm);
  if (srq == nullptr) {
    rq.depth = std::bit_ceil(std::max(1u, cap.max_recv_wr));
    rq.stride = vd::recv_stride(cap.max_recv_sge);
    auto rqm = t.alloc_dma(std::size_t{rq.depth} * rq.stride);
    if (!rqm) return std::move(rqm).error();
    rq.mem = Dma(&t, *rqm);
  }
  auto stm = t.alloc_dma(sizeof(vd::QpStatus));
  if (!stm) return std::move(stm).error();
  Dma status(&t, *stm);
  vd::CreateQpReq r{};
  r.pd = h_;
  r.send_cq = scq->handle();
  r.recv_cq = rcq->handle();
  r.srq = srq != nullptr ? srq->handle() : vd::kNoHandle;
  r.qp_type = static_cast<std::uint8_t>(attr.type);
  r.sq_sig_all = attr.sq_sig_all ? 1 : 0;
  r.sq_depth = sq.depth;
  r.rq_depth = rq.depth;
  r.max_send_sge = cap.max_send_sge;
  r.max_recv_sge = cap.max_recv_sge;
  r.max_inline = cap.max_inline_data;
  r.sq_gpa = sq.mem.a.gpa;
  r.rq_gpa = rq.mem.a.gpa;
  r.status_gpa = status.a.gpa;
  r.db_ring = static_cast<std::uint16_t>(dev_->db_ring());
  auto resp = dev_->call<vd::CreateQpResp>(vd::Cmd::create_qp, r);
  if (!resp) return std::move(resp).error();
  if (resp->sq_stride != sq.stride || (srq == nullptr && resp->rq_stride != rq.stride))
    return make_error(Errc::protocol_error, dev_->name() + ": the device computed different WQE strides");
  cap.max_send_wr = sq.depth;
  cap.max_recv_wr = rq.depth;
  // The CQs and SRQ stay alive with the QP, as nicdrv's ownership rule says.
  std::shared_ptr<SharedReceiveQueue> srq_sp;
  if (srq != nullptr) srq_sp = srq->shared_from_this();
  return std::shared_ptr<QueuePair>(std::make_shared<PvQp>(shared_from_this(), dev_, scq->shared_from_this(),
                                                           rcq->shared_from_this(), std::move(srq_sp), *resp, attr.type,
                                                           cap, std::move(sq), std::move(rq), std::move(status)));
}

Result<std::shared_ptr<AddressHandle>> PvPd::create_ah(const AhAttr& attr) {
  vd::CreateAhReq r{};
  r.pd = h_;
  r.ah = nicdrv::ah_to_wire(attr);
  auto resp = dev_->call<vd::HandleResp>(vd::Cmd::create_ah, r);
  if (!resp) return std::move(resp).error();
  return std::shared_ptr<AddressHandle>(std::make_shared<PvAh>(shared_from_this(), dev_, resp->handle, attr));
}

Result<std::shared_ptr<SharedReceiveQueue>> PvPd::create_srq(std::uint32_t max_wr, std::uint32_t max_sge) {
  auto& t = dev_->transport();
  WqRing ring;
  ring.depth = std::bit_ceil(std::max(1u, max_wr));
  ring.stride = vd::recv_stride(std::max(1u, max_sge));
  auto m = t.alloc_dma(std::size_t{ring.depth} * ring.stride);
  if (!m) return std::move(m).error();
  ring.mem = Dma(&t, *m);
  auto stm = t.alloc_dma(sizeof(vd::QpStatus));
  if (!stm) return std::move(stm).error();
  Dma status(&t, *stm);
  vd::CreateSrqReq r{};
  r.pd = h_;
  r.depth = ring.depth;
  r.max_sge = std::max(1u, max_sge);
  r.ring_gpa = ring.mem.a.gpa;
  r.status_gpa = status.a.gpa;
  r.db_ring = dev_->db_ring();
  auto resp = dev_->call<vd::CreateSrqResp>(vd::Cmd::create_srq, r);
  if (!resp) return std::move(resp).error();
  return std::shared_ptr<SharedReceiveQueue>(
      std::make_shared<PvSrq>(shared_from_this(), dev_, resp->srq, std::move(ring), std::move(status), r.max_sge));
}

}  // namespace vrdma::pv::detail

namespace vrdma::pv {

Result<std::shared_ptr<nicdrv::MemoryRegion>> reg_dma_mr(nicdrv::ProtectionDomain& pd, nicdrv::Access access) {
  auto* p = dynamic_cast<detail::PvPd*>(&pd);
  if (p == nullptr) return make_error(Errc::invalid_argument, "reg_dma_mr: the PD is not a pv device's");
  return p->reg_dma_mr(access);
}

std::optional<std::uint64_t> gpa_of(nicdrv::Device& dev, const void* ptr, std::size_t len) {
  auto* d = dynamic_cast<detail::PvDevice*>(&dev);
  if (d == nullptr) return std::nullopt;
  return d->transport().gpa_of(ptr, len);
}

}  // namespace vrdma::pv
