// Conversions between the virtio RDMA device contract's wire structs (vrdma/virtio_rdma.h) and
// the engine API's value types, each written once: the device model (vrdmad) and the pv provider
// (libpvverbs) both read the contract through these. They live here, the lowest module that may
// see both (docs/architecture.md: the contract is open to every module, nicdrv uses only common).
// Numeric values the contract takes from libibverbs (opcodes, statuses, QP states, access flags,
// MTUs) are nicdrv's values too (types.hpp), so those fields convert by value; flag bytes the
// contract defines itself convert bit by bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "vrdma/nicdrv/types.hpp"
#include "vrdma/virtio_rdma.h"

namespace vrdma::nicdrv {

// ---- Device and port ------------------------------------------------------------------------
// QUERY_DEVICE's answer; fw_ver is cut to 31 bytes and ends with a NUL.
inline ::virtio_rdma_device_attr_resp device_attr_to_wire(const DeviceAttr& a) {
  ::virtio_rdma_device_attr_resp w{};
  w.node_guid = a.node_guid;
  w.max_mr_size = a.max_mr_size;
  w.vendor_id = a.vendor_id;
  w.vendor_part_id = a.vendor_part_id;
  w.max_qp = a.max_qp;
  w.max_qp_wr = a.max_qp_wr;
  w.max_sge = a.max_sge;
  w.max_cq = a.max_cq;
  w.max_cqe = a.max_cqe;
  w.max_mr = a.max_mr;
  w.max_pd = a.max_pd;
  w.max_ah = a.max_ah;
  w.max_srq = a.max_srq;
  w.max_srq_wr = a.max_srq_wr;
  w.max_qp_rd_atom = a.max_qp_rd_atom;
  w.max_qp_init_rd_atom = a.max_qp_init_rd_atom;
  w.max_inline_data = a.max_inline_data;
  w.atomic_cap = static_cast<std::uint8_t>(a.atomic_cap);
  w.phys_port_cnt = a.phys_port_cnt;
  w.transport = static_cast<std::uint8_t>(a.transport);
  std::memcpy(w.fw_ver, a.fw_ver.data(), std::min(a.fw_ver.size(), sizeof w.fw_ver - 1));
  return w;
}

// The device's attributes as a driver reports them (name and provider are the driver's own).
inline DeviceAttr device_attr_from_wire(const ::virtio_rdma_device_attr_resp& w) {
  DeviceAttr a;
  a.transport = static_cast<Transport>(std::min<std::uint8_t>(w.transport, 3));
  a.node_guid = w.node_guid;
  a.vendor_id = w.vendor_id;
  a.vendor_part_id = w.vendor_part_id;
  a.fw_ver = std::string(w.fw_ver, ::strnlen(w.fw_ver, sizeof w.fw_ver));
  a.max_mr_size = w.max_mr_size;
  a.max_qp = w.max_qp;
  a.max_qp_wr = w.max_qp_wr;
  a.max_sge = w.max_sge;
  a.max_cq = w.max_cq;
  a.max_cqe = w.max_cqe;
  a.max_mr = w.max_mr;
  a.max_pd = w.max_pd;
  a.max_ah = w.max_ah;
  a.max_srq = w.max_srq;
  a.max_srq_wr = w.max_srq_wr;
  a.max_qp_rd_atom = w.max_qp_rd_atom;
  a.max_qp_init_rd_atom = w.max_qp_init_rd_atom;
  a.max_inline_data = w.max_inline_data;
  a.atomic_cap = static_cast<AtomicCap>(std::min<std::uint8_t>(w.atomic_cap, 2));
  a.phys_port_cnt = w.phys_port_cnt;
  return a;
}

inline ::virtio_rdma_port_attr_resp port_attr_to_wire(const PortAttr& p) {
  ::virtio_rdma_port_attr_resp w{};
  w.state = static_cast<std::uint8_t>(p.state);
  w.max_mtu = static_cast<std::uint8_t>(p.max_mtu);
  w.active_mtu = static_cast<std::uint8_t>(p.active_mtu);
  w.link_layer = static_cast<std::uint8_t>(p.link_layer);
  w.gid_tbl_len = p.gid_tbl_len;
  w.max_msg_sz = p.max_msg_sz;
  w.active_speed_mbps = p.active_speed_mbps;
  return w;
}

inline PortAttr port_attr_from_wire(const ::virtio_rdma_port_attr_resp& w) {
  PortAttr p;
  p.state = static_cast<PortState>(w.state);
  p.max_mtu = static_cast<Mtu>(w.max_mtu);
  p.active_mtu = static_cast<Mtu>(w.active_mtu);
  p.link_layer = static_cast<LinkLayer>(w.link_layer);
  p.gid_tbl_len = w.gid_tbl_len;
  p.max_msg_sz = w.max_msg_sz;
  p.active_speed_mbps = w.active_speed_mbps;
  return p;
}

// ---- QP attributes --------------------------------------------------------------------------
// nullopt for a value outside ibv_qp_state.
inline std::optional<QpState> qp_state_from_wire(std::uint32_t v) {
  if (v > static_cast<std::uint32_t>(QpState::err)) return std::nullopt;
  return static_cast<QpState>(v);
}

inline ::virtio_rdma_ah ah_to_wire(const AhAttr& a) {
  ::virtio_rdma_ah w{};
  std::memcpy(w.dgid, a.dgid.raw.data(), sizeof w.dgid);
  w.flow_label = a.flow_label;
  w.sgid_index = a.sgid_index;
  w.hop_limit = a.hop_limit;
  w.traffic_class = a.traffic_class;
  w.sl = a.sl;
  w.port_num = a.port_num;
  return w;
}

inline AhAttr ah_from_wire(const ::virtio_rdma_ah& w) {
  AhAttr a;
  std::memcpy(a.dgid.raw.data(), w.dgid, sizeof w.dgid);
  a.flow_label = w.flow_label & 0xfffffu;
  a.sgid_index = w.sgid_index;
  a.hop_limit = w.hop_limit;
  a.traffic_class = w.traffic_class;
  a.sl = w.sl;
  a.port_num = w.port_num;
  return a;
}

inline ::virtio_rdma_qp_attr qp_attr_to_wire(const QpAttr& a) {
  ::virtio_rdma_qp_attr w{};
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
inline std::optional<QpAttr> qp_attr_from_wire(const ::virtio_rdma_qp_attr& w) {
  const auto state = qp_state_from_wire(w.qp_state);
  const auto cur_state = qp_state_from_wire(w.cur_qp_state);
  if (!state || !cur_state) return std::nullopt;
  if (w.path_mtu < 1 || w.path_mtu > 5) return std::nullopt;
  if ((w.qp_access_flags & ~0xfu) != 0) return std::nullopt;
  QpAttr a;
  a.qp_state = *state;
  a.cur_qp_state = *cur_state;
  a.path_mtu = static_cast<Mtu>(w.path_mtu);
  a.qp_access_flags = static_cast<Access>(w.qp_access_flags);
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

// ---- Work requests --------------------------------------------------------------------------
// A send WQE's flags byte (VIRTIO_RDMA_SEND_*).
inline std::uint8_t send_flags_to_wire(SendFlags f) {
  return static_cast<std::uint8_t>((has(f, SendFlags::fence) ? VIRTIO_RDMA_SEND_FENCE : 0u) |
                                   (has(f, SendFlags::signaled) ? VIRTIO_RDMA_SEND_SIGNALED : 0u) |
                                   (has(f, SendFlags::solicited) ? VIRTIO_RDMA_SEND_SOLICITED : 0u) |
                                   (has(f, SendFlags::inline_data) ? VIRTIO_RDMA_SEND_INLINE : 0u));
}

inline SendFlags send_flags_from_wire(std::uint8_t w) {
  std::uint32_t f = 0;
  if (w & VIRTIO_RDMA_SEND_FENCE) f |= static_cast<std::uint32_t>(SendFlags::fence);
  if (w & VIRTIO_RDMA_SEND_SIGNALED) f |= static_cast<std::uint32_t>(SendFlags::signaled);
  if (w & VIRTIO_RDMA_SEND_SOLICITED) f |= static_cast<std::uint32_t>(SendFlags::solicited);
  if (w & VIRTIO_RDMA_SEND_INLINE) f |= static_cast<std::uint32_t>(SendFlags::inline_data);
  return static_cast<SendFlags>(f);
}

// ---- Completions ----------------------------------------------------------------------------
// The engine's numbers for fast registration are the contract's (a WQE's opcode, a CQE's).
static_assert(static_cast<unsigned>(WrOpcode::local_inv) == VIRTIO_RDMA_WR_LOCAL_INV &&
              static_cast<unsigned>(WrOpcode::send_with_inv) == VIRTIO_RDMA_WR_SEND_WITH_INV &&
              static_cast<unsigned>(WrOpcode::reg_mr) == VIRTIO_RDMA_WR_REG_MR &&
              static_cast<unsigned>(WcOpcode::local_inv) == VIRTIO_RDMA_WC_LOCAL_INV &&
              static_cast<unsigned>(WcOpcode::reg_mr) == VIRTIO_RDMA_WC_REG_MR);

// The guest's CQE for an engine completion (its owner byte is the writer's: IBA 11.4.2.2 order).
inline ::virtio_rdma_cqe to_cqe(const WorkCompletion& wc) {
  ::virtio_rdma_cqe c{};
  c.wr_id = wc.wr_id;
  c.qp_num = wc.qp_num;
  c.byte_len = wc.byte_len;
  // A SEND with Invalidate's CQE carries the key it ended where the immediate would be.
  c.imm_data = has(wc.wc_flags, WcFlags::with_inv) ? wc.invalidated_rkey : wc.imm_data;
  c.src_qp = wc.src_qp;
  c.status = static_cast<std::uint8_t>(wc.status);
  c.opcode = static_cast<std::uint8_t>(wc.opcode);
  c.wc_flags = static_cast<std::uint8_t>((has(wc.wc_flags, WcFlags::with_imm) ? VIRTIO_RDMA_WC_WITH_IMM : 0u) |
                                         (has(wc.wc_flags, WcFlags::grh) ? VIRTIO_RDMA_WC_GRH : 0u) |
                                         (has(wc.wc_flags, WcFlags::solicited) ? VIRTIO_RDMA_WC_SOLICITED : 0u) |
                                         (has(wc.wc_flags, WcFlags::with_inv) ? VIRTIO_RDMA_WC_WITH_INV : 0u));
  c.vendor_err = wc.vendor_err;
  return c;
}

// A driver's completion for a CQE. VIRTIO_RDMA_WC_SOLICITED stays behind: the device honours
// solicited-only arms itself, and a driver reports no solicited flag (like ibv_wc; its
// DeviceAttr::reports_solicited is false).
inline WorkCompletion from_cqe(const ::virtio_rdma_cqe& c) {
  WorkCompletion wc{};
  wc.wr_id = c.wr_id;
  wc.status = static_cast<WcStatus>(c.status);
  wc.opcode = static_cast<WcOpcode>(c.opcode);
  wc.vendor_err = c.vendor_err;
  wc.byte_len = c.byte_len;
  const bool with_inv = (c.wc_flags & VIRTIO_RDMA_WC_WITH_INV) != 0;
  wc.imm_data = with_inv ? 0 : c.imm_data;
  wc.invalidated_rkey = with_inv ? c.imm_data : 0;
  wc.qp_num = c.qp_num;
  wc.src_qp = c.src_qp;
  wc.wc_flags = ((c.wc_flags & VIRTIO_RDMA_WC_WITH_IMM) ? WcFlags::with_imm : WcFlags::none) |
                ((c.wc_flags & VIRTIO_RDMA_WC_GRH) ? WcFlags::grh : WcFlags::none) |
                (with_inv ? WcFlags::with_inv : WcFlags::none);
  return wc;
}

}  // namespace vrdma::nicdrv
