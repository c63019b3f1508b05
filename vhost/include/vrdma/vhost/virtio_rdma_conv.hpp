// Conversions between the virtio RDMA wire structs and nicdrv's value types, shared by the
// device (vrdmad) and the driver (libpvverbs) so both read the contract the same way.
#pragma once

#include <cstring>
#include <optional>

#include "vrdma/nicdrv/types.hpp"
#include "vrdma/vhost/virtio_rdma.hpp"

namespace vrdma::vrdma_dev {

inline AhWire ah_to_wire(const nicdrv::AhAttr& a) {
  AhWire w{};
  std::memcpy(w.dgid, a.dgid.raw.data(), sizeof w.dgid);
  w.flow_label = a.flow_label;
  w.sgid_index = a.sgid_index;
  w.hop_limit = a.hop_limit;
  w.traffic_class = a.traffic_class;
  w.sl = a.sl;
  w.port_num = a.port_num;
  return w;
}

inline nicdrv::AhAttr ah_from_wire(const AhWire& w) {
  nicdrv::AhAttr a;
  std::memcpy(a.dgid.raw.data(), w.dgid, sizeof w.dgid);
  a.flow_label = w.flow_label & 0xfffffu;
  a.sgid_index = w.sgid_index;
  a.hop_limit = w.hop_limit;
  a.traffic_class = w.traffic_class;
  a.sl = w.sl;
  a.port_num = w.port_num;
  return a;
}

inline QpAttrWire qp_attr_to_wire(const nicdrv::QpAttr& a) {
  QpAttrWire w{};
  w.qp_state = static_cast<std::uint8_t>(a.qp_state);
  w.cur_qp_state = static_cast<std::uint8_t>(a.cur_qp_state);
  w.path_mtu = static_cast<std::uint8_t>(a.path_mtu);
  w.qp_access_flags = static_cast<std::uint32_t>(a.qp_access_flags);
  w.qkey = a.qkey;
  w.rq_psn = a.rq_psn;
  w.sq_psn = a.sq_psn;
  w.dest_qp_num = a.dest_qp_num;
  w.max_send_wr = a.cap.max_send_wr;
  w.max_recv_wr = a.cap.max_recv_wr;
  w.max_send_sge = a.cap.max_send_sge;
  w.max_recv_sge = a.cap.max_recv_sge;
  w.max_inline_data = a.cap.max_inline_data;
  w.pkey_index = a.pkey_index;
  w.sq_draining = a.sq_draining;
  w.max_rd_atomic = a.max_rd_atomic;
  w.max_dest_rd_atomic = a.max_dest_rd_atomic;
  w.min_rnr_timer = a.min_rnr_timer;
  w.port_num = a.port_num;
  w.timeout = a.timeout;
  w.retry_cnt = a.retry_cnt;
  w.rnr_retry = a.rnr_retry;
  w.ah = ah_to_wire(a.ah_attr);
  return w;
}

// nullopt when an enumerated field holds a value outside its enumeration.
inline std::optional<nicdrv::QpAttr> qp_attr_from_wire(const QpAttrWire& w) {
  if (w.qp_state > 6 || w.cur_qp_state > 6) return std::nullopt;
  if (w.path_mtu < 1 || w.path_mtu > 5) return std::nullopt;
  if ((w.qp_access_flags & ~0xfu) != 0) return std::nullopt;
  nicdrv::QpAttr a;
  a.qp_state = static_cast<nicdrv::QpState>(w.qp_state);
  a.cur_qp_state = static_cast<nicdrv::QpState>(w.cur_qp_state);
  a.path_mtu = static_cast<nicdrv::Mtu>(w.path_mtu);
  a.qp_access_flags = static_cast<nicdrv::Access>(w.qp_access_flags);
  a.qkey = w.qkey;
  a.rq_psn = w.rq_psn;
  a.sq_psn = w.sq_psn;
  a.dest_qp_num = w.dest_qp_num;
  a.cap.max_send_wr = w.max_send_wr;
  a.cap.max_recv_wr = w.max_recv_wr;
  a.cap.max_send_sge = w.max_send_sge;
  a.cap.max_recv_sge = w.max_recv_sge;
  a.cap.max_inline_data = w.max_inline_data;
  a.pkey_index = w.pkey_index;
  a.sq_draining = w.sq_draining;
  a.max_rd_atomic = w.max_rd_atomic;
  a.max_dest_rd_atomic = w.max_dest_rd_atomic;
  a.min_rnr_timer = w.min_rnr_timer;
  a.port_num = w.port_num;
  a.timeout = w.timeout;
  a.retry_cnt = w.retry_cnt;
  a.rnr_retry = w.rnr_retry;
  a.ah_attr = ah_from_wire(w.ah);
  return a;
}

// The guest's CQE for an engine completion.
inline Cqe to_cqe(const nicdrv::WorkCompletion& wc) {
  Cqe c{};
  c.wr_id = wc.wr_id;
  c.qp_num = wc.qp_num;
  c.byte_len = wc.byte_len;
  c.imm_data = wc.imm_data;
  c.src_qp = wc.src_qp;
  c.status = static_cast<std::uint8_t>(wc.status);
  c.opcode = static_cast<std::uint8_t>(wc.opcode);
  c.wc_flags = static_cast<std::uint8_t>((has(wc.wc_flags, nicdrv::WcFlags::with_imm) ? kWcWithImm : 0) |
                                         (has(wc.wc_flags, nicdrv::WcFlags::grh) ? kWcGrh : 0) |
                                         (has(wc.wc_flags, nicdrv::WcFlags::solicited) ? kWcSolicited : 0));
  c.vendor_err = wc.vendor_err;
  return c;
}

}  // namespace vrdma::vrdma_dev
