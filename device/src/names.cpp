// The guest's names for what the engine names otherwise. The guest keeps the QPNs and memory
// keys it was given; an engine that cannot take them again (a NIC, after a move re-created its
// QPs and regions: migration/src/rebuild.cpp) names them its own way, and the maps here turn
// one into the other in work requests, completions and commands. Also the DMA memory regions'
// bookkeeping and a QP's creation attributes, which re-creation reads.
#include "vrdma/device/model.hpp"

namespace vrdma::device {

bool DeviceModel::guest_name_taken(std::uint32_t v, bool qpn) const {
  return qpn ? qpn_to_engine.count(v) != 0 : (lkey_to_engine.count(v) != 0 || rkey_to_engine.count(v) != 0);
}

void DeviceModel::forget_names(std::uint32_t handle) {
  if (auto it = qps.find(handle); it != qps.end()) {
    const auto eq = it->second.eng->qp_num();
    qp_by_engine_qpn.erase(eq);
    if (auto g = qpn_to_guest.find(eq); g != qpn_to_guest.end()) {
      qpn_to_engine.erase(g->second);
      qpn_to_guest.erase(g);
    }
  }
  if (auto it = mrs.find(handle); it != mrs.end()) {
    if (it->second.eng->lkey() != it->second.guest_lkey) lkey_to_engine.erase(it->second.guest_lkey);
    if (it->second.eng->rkey() != it->second.guest_rkey) rkey_to_engine.erase(it->second.guest_rkey);
  }
}

void DeviceModel::add_dma_mr(std::uint32_t handle, DmaMrObj mr) {
  if (auto p = pds.find(mr.pd); p != pds.end()) ++p->second.users;
  auto& placed = dma_mrs.emplace(handle, std::move(mr)).first->second;
  dma_by_lkey[placed.guest_lkey] = &placed;
}

std::optional<std::uint32_t> DeviceModel::dma_mr_of_pd(std::uint32_t pd) const {
  for (const auto& [h, mr] : dma_mrs)
    if (mr.pd == pd) return h;
  return std::nullopt;
}

void DeviceModel::forget_dma_mr(std::uint32_t handle) {
  auto it = dma_mrs.find(handle);
  if (it == dma_mrs.end()) return;
  dma_by_lkey.erase(it->second.guest_lkey);
  lkey_to_engine.erase(it->second.guest_lkey);
  if (auto p = pds.find(it->second.pd); p != pds.end()) --p->second.users;
  dma_mrs.erase(it);
}

void DeviceModel::add_fast_mr(std::uint32_t handle, FastMrObj mr) {
  if (auto p = pds.find(mr.pd); p != pds.end()) ++p->second.users;
  fast_window_bytes += mr.window.size();
  fast_mrs.emplace(handle, std::move(mr));
}

void DeviceModel::forget_fast_mr(std::uint32_t handle) {
  auto it = fast_mrs.find(handle);
  if (it == fast_mrs.end()) return;
  if (auto p = pds.find(it->second.pd); p != pds.end()) --p->second.users;
  fast_window_bytes -= it->second.window.size();
  fast_mrs.erase(it);
}

nicdrv::QpInitAttr DeviceModel::init_attr_of(const QpObj& qp) {
  nicdrv::QpInitAttr ia;
  ia.type = qp.type;
  ia.send_cq = cqs[qp.send_cq].eng.get();
  ia.recv_cq = cqs[qp.recv_cq].eng.get();
  ia.srq = qp.srq != 0 ? srqs[qp.srq].eng.get() : nullptr;
  ia.cap = nicdrv::QpCap{qp.sq.depth, qp.srq != 0 ? 0 : qp.rq.depth, qp.max_send_sge, qp.max_recv_sge, qp.max_inline};
  ia.sq_sig_all = qp.sq_sig_all;
  return ia;
}

}  // namespace vrdma::device
