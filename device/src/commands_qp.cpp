// The control commands that make and change QPs, AHs and SRQs (command_handlers.hpp).
#include "command_handlers.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::device::cmd {

Reply Handlers::create_qp() {
  const auto r = req_as<vd::CreateQpReq>(body);
  if (auto e = room(d.qps.size(), lim.max_qp, "QPs")) return *e;
  auto pit = d.pds.find(r.pd);
  auto scq = d.cqs.find(r.send_cq);
  auto rcq = d.cqs.find(r.recv_cq);
  if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("CREATE_QP names no PD {}", r.pd));
  if (scq == d.cqs.end() || rcq == d.cqs.end())
    return refuse(vd::Status::not_found, fmt::format("CREATE_QP names no CQ {} or {}", r.send_cq, r.recv_cq));
  SrqObj* srq = nullptr;
  if (r.srq != vd::kNoHandle) {
    auto sit = d.srqs.find(r.srq);
    if (sit == d.srqs.end()) return refuse(vd::Status::not_found, fmt::format("CREATE_QP names no SRQ {}", r.srq));
    if (sit->second.pd != r.pd)
      return refuse(vd::Status::perm, fmt::format("SRQ {} belongs to PD {}, not PD {}", r.srq, sit->second.pd, r.pd));
    srq = &sit->second;
  }
  if (auto e = db_ring_known(r.db_ring, "CREATE_QP")) return *e;
  if (r.qp_type != VIRTIO_RDMA_QPT_RC && r.qp_type != VIRTIO_RDMA_QPT_UD && r.qp_type != VIRTIO_RDMA_QPT_GSI)
    return refuse(vd::Status::not_supported, fmt::format("QP type {} is not RC (2), UD (4) or GSI (1)", r.qp_type));
  if (!pow2(r.sq_depth) || r.sq_depth > lim.max_qp_wr)
    return refuse(vd::Status::invalid, fmt::format("send queue depth {} is not a power of two up to {}", r.sq_depth, lim.max_qp_wr));
  if (srq == nullptr && (!pow2(r.rq_depth) || r.rq_depth > lim.max_qp_wr))
    return refuse(vd::Status::invalid, fmt::format("receive queue depth {} is not a power of two up to {}", r.rq_depth, lim.max_qp_wr));
  if (r.max_send_sge > lim.max_sge || r.max_recv_sge > lim.max_sge || r.max_inline > lim.max_inline)
    return refuse(vd::Status::invalid, fmt::format("QP caps (send SGEs {}, receive SGEs {}, inline {}) exceed the "
                                                   "device's ({}, {}, {})", r.max_send_sge, r.max_recv_sge,
                                                   r.max_inline, lim.max_sge, lim.max_sge, lim.max_inline));
  QpObj qp;
  qp.pd = r.pd;
  qp.send_cq = r.send_cq;
  qp.recv_cq = r.recv_cq;
  qp.srq = r.srq;
  qp.type = static_cast<nicdrv::QpType>(r.qp_type);
  qp.sq_sig_all = r.sq_sig_all != 0;
  qp.max_send_sge = std::max(1u, r.max_send_sge);
  qp.max_recv_sge = std::max(1u, r.max_recv_sge);
  qp.max_inline = r.max_inline;
  qp.sq = WorkRing{r.sq_gpa, r.sq_depth, vd::send_stride(qp.max_send_sge, r.max_inline), 0, 0};
  if (srq == nullptr) qp.rq = WorkRing{r.rq_gpa, r.rq_depth, vd::recv_stride(qp.max_recv_sge), 0, 0};
  qp.status_gpa = r.status_gpa;
  if (auto why = check_area(g, r.sq_gpa, std::uint64_t{qp.sq.depth} * qp.sq.stride, 64, "the send ring"))
    return refuse(vd::Status::fault, *why);
  if (srq == nullptr)
    if (auto why = check_area(g, r.rq_gpa, std::uint64_t{qp.rq.depth} * qp.rq.stride, 64, "the receive ring"))
      return refuse(vd::Status::fault, *why);
  if (auto why = check_area(g, r.status_gpa, sizeof(vd::QpStatus), 64, "the QP status block"))
    return refuse(vd::Status::fault, *why);
  nicdrv::QpInitAttr ia;
  ia.type = qp.type;
  ia.send_cq = scq->second.eng.get();
  ia.recv_cq = rcq->second.eng.get();
  ia.srq = srq != nullptr ? srq->eng.get() : nullptr;
  ia.cap.max_send_wr = r.sq_depth;
  ia.cap.max_recv_wr = srq != nullptr ? 0 : r.rq_depth;
  ia.cap.max_send_sge = qp.max_send_sge;
  ia.cap.max_recv_sge = qp.max_recv_sge;
  ia.cap.max_inline_data = r.max_inline;
  ia.sq_sig_all = r.sq_sig_all != 0;
  auto eng = pit->second.eng->create_qp(ia);
  // After a move onto a NIC, a QPN it hands out may be a moved QP's name in the guest.
  std::vector<std::shared_ptr<nicdrv::QueuePair>> set_aside;
  for (int tries = 0; eng && !d.qpn_to_engine.empty() && d.guest_name_taken((*eng)->qp_num(), true); ++tries) {
    if (tries == 7) return refuse(vd::Status::busy, "the NIC kept handing out QPNs the guest already uses");
    set_aside.push_back(std::move(*eng));
    eng = pit->second.eng->create_qp(ia);
  }
  if (!eng) return refuse(status_of(eng.error()), eng.error().message);
  qp.eng = std::move(*eng);
  qp.guest_qpn = qp.eng->qp_num();
  const auto h = d.new_handle();
  d.qp_by_engine_qpn[qp.guest_qpn] = h;
  vd::CreateQpResp out{h, qp.guest_qpn, qp.sq.stride, qp.rq.stride};
  d.write_status(g, qp.status_gpa, 0, 0, 0);
  ++pit->second.users;
  ++scq->second.users;
  ++rcq->second.users;
  if (srq != nullptr) ++srq->users;
  qp.db_ring = r.db_ring;
  d.count_db_ring_user(r.db_ring, +1);
  d.qps.emplace(h, std::move(qp));
  return bytes_of(out);
}

Reply Handlers::modify_qp() {
  const auto r = req_as<vd::ModifyQpReq>(body);
  auto it = d.qps.find(r.qp);
  if (it == d.qps.end()) return refuse(vd::Status::not_found, fmt::format("MODIFY_QP names no QP {}", r.qp));
  auto attr = nicdrv::qp_attr_from_wire(r.attr);
  if (!attr) return refuse(vd::Status::invalid, "MODIFY_QP carries an out-of-range state, MTU or access value");
  if ((r.mask & ~((1u << 21) - 1)) != 0)
    return refuse(vd::Status::invalid, fmt::format("MODIFY_QP mask {:#x} has unknown bits", r.mask));
  const auto mask = static_cast<nicdrv::QpAttrMask>(r.mask);
  attr->ah_attr.sgid_index = d.engine_sgid(attr->ah_attr.sgid_index);
  bool local_peer = it->second.local_peer;
  if (d.engine_rebuilds() && (mask & nicdrv::QpAttrMask::dest_qpn) != nicdrv::QpAttrMask::none) {
    // Connected to a QP of this same device? Then a move keeps the two connected.
    const auto gq = attr->dest_qp_num;
    auto own = d.qpn_to_engine.find(gq);
    auto byq = d.qp_by_engine_qpn.find(gq);
    const bool ours = own != d.qpn_to_engine.end() || (byq != d.qp_by_engine_qpn.end() && d.qps.count(byq->second) != 0 &&
                                                     d.qps[byq->second].guest_qpn == gq);
    auto sg = d.engine->query_gid(attr->ah_attr.sgid_index, attr->ah_attr.port_num);
    local_peer = ours && (mask & nicdrv::QpAttrMask::av) != nicdrv::QpAttrMask::none && sg.ok() && sg->gid == attr->ah_attr.dgid;
    if (local_peer && own != d.qpn_to_engine.end()) attr->dest_qp_num = own->second;
  }
  auto s = it->second.eng->modify(*attr, mask);
  if (!s.ok()) return refuse(status_of(s.error()), s.error().message);
  auto& qp = it->second;
  qp.local_peer = local_peer;
  if ((mask & nicdrv::QpAttrMask::dest_qpn) != nicdrv::QpAttrMask::none) {  // connected anew by the guest
    qp.guest_dest_qpn = 0;
    qp.remote_rkeys.clear();
    qp.peer_token = 0;
  }
  if (qp.eng->state() != nicdrv::QpState::err) qp.fatal_reported = false;
  d.write_status(g, qp.status_gpa, qp.sq.consumed, qp.rq.consumed, static_cast<std::uint32_t>(qp.eng->state()));
  if (qp.sq.produced != qp.sq.consumed) d.pending_sq.insert(r.qp);
  if (qp.rq.produced != qp.rq.consumed) d.pending_rq.insert(r.qp);
  return std::vector<std::uint8_t>{};
}

Reply Handlers::query_qp() {
  const auto h = req_as<vd::HandleReq>(body).handle;
  auto it = d.qps.find(h);
  if (it == d.qps.end()) return refuse(vd::Status::not_found, fmt::format("QUERY_QP names no QP {}", h));
  auto a = it->second.eng->query();
  if (!a) return refuse(status_of(a.error()), a.error().message);
  if (it->second.local_peer) a->dest_qp_num = d.guest_qpn_of(a->dest_qp_num);
  else if (it->second.guest_dest_qpn != 0) a->dest_qp_num = it->second.guest_dest_qpn;  // a re-pointed peer
  return bytes_of(nicdrv::qp_attr_to_wire(*a));
}

Reply Handlers::destroy_qp() {
  auto found = to_destroy(d.qps, "QP");
  if (auto* no = std::get_if<Refusal>(&found)) return *no;
  const auto it = std::get<0>(found);
  const auto h = it->first;
  auto& qp = it->second;
  --d.pds[qp.pd].users;
  --d.cqs[qp.send_cq].users;
  --d.cqs[qp.recv_cq].users;
  if (qp.srq != vd::kNoHandle) --d.srqs[qp.srq].users;
  d.count_db_ring_user(qp.db_ring, -1);
  d.pending_sq.erase(h);
  d.pending_rq.erase(h);
  d.forget_names(h);
  d.qps.erase(it);
  return std::vector<std::uint8_t>{};
}

Reply Handlers::create_ah() {
  const auto r = req_as<vd::CreateAhReq>(body);
  auto pit = d.pds.find(r.pd);
  if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("CREATE_AH names no PD {}", r.pd));
  if (auto e = room(d.ahs.size(), lim.max_ah, "AHs")) return *e;
  auto ah = pit->second.eng->create_ah(d.engine_ah(r.ah));
  if (!ah) return refuse(status_of(ah.error()), ah.error().message);
  const auto h = d.new_handle();
  d.ahs[h] = AhObj{r.pd, r.ah, std::move(*ah)};
  ++pit->second.users;
  return bytes_of(vd::HandleResp{h, 0});
}

Reply Handlers::destroy_ah() {
  auto found = to_destroy(d.ahs, "AH");
  if (auto* no = std::get_if<Refusal>(&found)) return *no;
  const auto it = std::get<0>(found);
  --d.pds[it->second.pd].users;
  d.ahs.erase(it);
  return std::vector<std::uint8_t>{};
}

Reply Handlers::create_srq() {
  const auto r = req_as<vd::CreateSrqReq>(body);
  auto pit = d.pds.find(r.pd);
  if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("CREATE_SRQ names no PD {}", r.pd));
  if (auto e = room(d.srqs.size(), lim.max_srq, "SRQs")) return *e;
  if (auto e = db_ring_known(r.db_ring, "CREATE_SRQ")) return *e;
  if (!pow2(r.depth) || r.depth > lim.max_qp_wr || r.max_sge == 0 || r.max_sge > lim.max_sge)
    return refuse(vd::Status::invalid, fmt::format("SRQ depth {} / SGEs {} out of range (power of two up to {}, 1..{})",
                                                   r.depth, r.max_sge, lim.max_qp_wr, lim.max_sge));
  SrqObj s;
  s.pd = r.pd;
  s.max_sge = r.max_sge;
  s.ring = WorkRing{r.ring_gpa, r.depth, vd::recv_stride(r.max_sge), 0, 0};
  s.status_gpa = r.status_gpa;
  if (auto why = check_area(g, r.ring_gpa, std::uint64_t{r.depth} * s.ring.stride, 64, "the SRQ ring"))
    return refuse(vd::Status::fault, *why);
  if (auto why = check_area(g, r.status_gpa, sizeof(vd::QpStatus), 64, "the SRQ status block"))
    return refuse(vd::Status::fault, *why);
  auto eng = pit->second.eng->create_srq(r.depth, r.max_sge);
  if (!eng) return refuse(status_of(eng.error()), eng.error().message);
  s.eng = std::move(*eng);
  const auto h = d.new_handle();
  vd::CreateSrqResp out{h, s.ring.stride};
  d.write_status(g, s.status_gpa, 0, 0, 0);
  ++pit->second.users;
  s.db_ring = r.db_ring;
  d.count_db_ring_user(r.db_ring, +1);
  d.srqs.emplace(h, std::move(s));
  return bytes_of(out);
}

Reply Handlers::destroy_srq() {
  auto found = to_destroy(d.srqs, "SRQ", "QPs");
  if (auto* no = std::get_if<Refusal>(&found)) return *no;
  const auto it = std::get<0>(found);
  --d.pds[it->second.pd].users;
  d.count_db_ring_user(it->second.db_ring, -1);
  d.pending_srq.erase(it->first);
  d.srqs.erase(it);
  return std::vector<std::uint8_t>{};
}

}  // namespace vrdma::device::cmd
