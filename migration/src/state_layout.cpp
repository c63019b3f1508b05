// The object layout for building ahead (PRESTATE): the source's PDs, CQs and QPs by handle and
// shape (save_layout), built on the destination during pre-copy (precreate) and adopted by
// load_state (state.cpp) when they match what the state names (take_precreated_qp).
#include <chrono>
#include <cstddef>

#include <fmt/format.h>

#include "device_state_impl.hpp"
#include "vrdma/common/bytes.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::migration {
namespace {

constexpr std::uint32_t kLayoutMagic = 0x4c445256;  // "VRDL"

}  // namespace

// ---- Object layout, built ahead on the destination ------------------------------------------------

std::vector<std::uint8_t> DeviceState::Impl::save_layout() const {
  ByteWriter w;
  w.put(kLayoutMagic, DeviceState::kStateVersion, static_cast<std::uint32_t>(d.pds.size()));
  for (const auto& [h, pd] : d.pds) w.put(h);
  w.put(static_cast<std::uint32_t>(d.cqs.size()));
  for (const auto& [h, cq] : d.cqs) {
    w.put(h, cq.depth);
  }
  std::uint32_t nqp = 0;
  for (const auto& [h, qp] : d.qps) nqp += qp.srq == 0 ? 1 : 0;
  w.put(nqp);
  for (const auto& [h, qp] : d.qps) {
    if (qp.srq != 0) continue;  // made at the load, after its SRQ (the layout has no SRQs)
    w.put(h, qp.pd, qp.send_cq, qp.recv_cq, static_cast<std::uint8_t>(qp.type),
          static_cast<std::uint8_t>(qp.sq_sig_all), qp.sq.depth, qp.rq.depth, qp.max_send_sge, qp.max_recv_sge,
          qp.max_inline, qp.eng->qp_num());
  }
  return std::move(w.out);
}

std::shared_ptr<nicdrv::QueuePair> DeviceState::Impl::take_precreated_qp(std::uint32_t handle, const QpObj& qp,
                                                                         const nicdrv::ProtectionDomain* pd,
                                                                         const nicdrv::QpInitAttr& ia,
                                                                         std::optional<std::uint32_t> qpn) {
  auto it = pre.qps.find(handle);
  if (it == pre.qps.end()) return nullptr;
  std::shared_ptr<nicdrv::QueuePair> eng;
  const auto& p = it->second;
  const auto& a = p.attr;
  if (p.pd == qp.pd && p.send_cq == qp.send_cq && p.recv_cq == qp.recv_cq && (!qpn || p.qpn == *qpn) &&
      p.pd_eng == pd && a.type == ia.type && a.send_cq == ia.send_cq && a.recv_cq == ia.recv_cq &&
      a.sq_sig_all == ia.sq_sig_all && a.cap == ia.cap) {
    eng = p.eng;
    ++adopted;
  }
  pre.qps.erase(it);
  return eng;
}

// On a NIC the QPs are built here with QPNs of the NIC's choosing: load_state() re-creates
// each QP from its record in one of them (rebuild_qp()), so only the modify to RTS is left for
// the stop.
Status DeviceState::Impl::precreate(std::span<const std::uint8_t> layout) {
  pre.clear();
  if (!d.pds.empty() || !d.cqs.empty() || !d.qps.empty())
    return make_error(Errc::bad_state, "objects can be built ahead only on a device with none");
  const auto t0 = std::chrono::steady_clock::now();
  const auto& lim = d.opts.limits;
  ByteReader r(layout);
  std::uint32_t magic = 0, version = 0, n = 0;
  auto fail = [this](const std::string& what) {
    pre.clear();
    return make_error(Errc::invalid_argument, "object layout rejected: " + what);
  };
  if (!r.get(magic) || magic != kLayoutMagic) return fail("not a virtio RDMA object layout (magic)");
  if (!r.get(version) || !DeviceState::state_version_readable(version))
    return fail(fmt::format("version {} (this vrdmad reads versions {} to {})", version,
                            DeviceState::kOldestStateVersion, DeviceState::kStateVersion));
  if (!r.get(n) || n > lim.max_pd) return fail("PD count");
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t h = 0;
    if (!r.get(h) || h == vd::kNoHandle || pre.pds.count(h) != 0) return fail("PD handle");
    auto pd = d.engine->alloc_pd();
    if (!pd) {
      pre.clear();
      return std::move(pd).error();
    }
    pre.pds.emplace(h, std::move(*pd));
  }
  if (!r.get(n) || n > lim.max_cq) return fail("CQ count");
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t h = 0, depth = 0;
    if (!r.get(h) || !r.get(depth)) return fail("truncated CQ");
    if (h == vd::kNoHandle || pre.cqs.count(h) != 0 || depth == 0 || (depth & (depth - 1)) != 0 || depth > lim.max_cqe)
      return fail(fmt::format("CQ {} (depth {})", h, depth));
    auto cq = d.engine->create_cq(depth);
    if (!cq) {
      pre.clear();
      return std::move(cq).error();
    }
    pre.cqs.emplace(h, Precreated::Cq{depth, std::move(*cq)});
  }
  if (!r.get(n) || n > lim.max_qp) return fail("QP count");
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint32_t h = 0, qpn = 0;
    Precreated::Qp q;
    std::uint8_t type = 0, sig = 0;
    nicdrv::QpCap cap;
    if (!r.get(h) || !r.get(q.pd) || !r.get(q.send_cq) || !r.get(q.recv_cq) || !r.get(type) || !r.get(sig) ||
        !r.get(cap.max_send_wr) || !r.get(cap.max_recv_wr) || !r.get(cap.max_send_sge) || !r.get(cap.max_recv_sge) ||
        !r.get(cap.max_inline_data) || !r.get(qpn))
      return fail("truncated QP");
    auto pit = pre.pds.find(q.pd);
    auto scq = pre.cqs.find(q.send_cq);
    auto rcq = pre.cqs.find(q.recv_cq);
    const auto depth_ok = [&](std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0 && v <= lim.max_qp_wr; };
    if (h == vd::kNoHandle || pre.qps.count(h) != 0 || pit == pre.pds.end() || scq == pre.cqs.end() ||
        rcq == pre.cqs.end() || !depth_ok(cap.max_send_wr) || !depth_ok(cap.max_recv_wr) ||
        !qp_shape_ok(lim, type, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data))
      return fail(fmt::format("QP {}", h));
    q.qpn = qpn;
    q.pd_eng = pit->second.get();
    q.attr.type = static_cast<nicdrv::QpType>(type);
    q.attr.send_cq = scq->second.eng.get();
    q.attr.recv_cq = rcq->second.eng.get();
    q.attr.cap = cap;
    q.attr.sq_sig_all = sig != 0;
    nicdrv::QpOptions qo;
    if (!d.engine_rebuilds()) qo.requested_qpn = qpn;
    auto eng = pit->second->create_qp(q.attr, qo);
    if (!eng) {
      pre.clear();
      return prefixed(fmt::format("QP {} (QPN {:#x}): ", h, qpn), eng.error());
    }
    q.eng = std::move(*eng);
    pre.qps.emplace(h, std::move(q));
  }
  if (!r.at_end()) return fail("trailing bytes");
  if (pre.count() == 0) return {};
  log::info("virtio-rdma: built {} PDs, {} CQs and {} QPs ahead for the incoming guest in {:.1f} ms", pre.pds.size(),
            pre.cqs.size(), pre.qps.size(),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return {};
}

}  // namespace vrdma::migration
