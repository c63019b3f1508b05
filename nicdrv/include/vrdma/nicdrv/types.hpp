// Plain value types of the nicdrv API: attributes, work requests, completions.
// Shapes and numeric values follow libibverbs (verbs.h) so that the verbs provider maps 1:1
// and so that tools and tests can speak of statuses the way RDMA engineers already do.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace vrdma::nicdrv {

// ---- GIDs ---------------------------------------------------------------------------------
struct Gid {
  std::array<std::uint8_t, 16> raw{};

  // RoCEv2 IPv4-mapped GID ::ffff:a.b.c.d (IBA A17.4.5.1). `ipv4_be` is in network order.
  static Gid from_ipv4(std::uint32_t ipv4_be) noexcept;
  [[nodiscard]] bool is_ipv4_mapped() const noexcept;
  // The IPv4 address (network order) of an IPv4-mapped GID.
  [[nodiscard]] std::uint32_t ipv4() const noexcept;
  [[nodiscard]] std::string str() const;
  friend bool operator==(const Gid&, const Gid&) = default;
};

enum class GidType : std::uint8_t { ib = 0, roce_v1 = 1, roce_v2 = 2, iwarp = 3 };

struct GidEntry {
  Gid gid;
  GidType type = GidType::roce_v2;
  std::uint32_t index = 0;
  std::string netdev;  // interface the GID belongs to, if any
};

// ---- Device and port ----------------------------------------------------------------------
enum class Transport : std::uint8_t { infiniband, roce, iwarp, software };
enum class LinkLayer : std::uint8_t { infiniband, ethernet };
enum class PortState : std::uint8_t { down = 1, init = 2, armed = 3, active = 4 };

// Path MTU enumeration as in ibv_mtu (IBA 9.7.4.1).
enum class Mtu : std::uint8_t { mtu256 = 1, mtu512 = 2, mtu1024 = 3, mtu2048 = 4, mtu4096 = 5 };
constexpr std::uint32_t mtu_bytes(Mtu m) noexcept { return 128u << static_cast<unsigned>(m); }
std::optional<Mtu> mtu_from_bytes(std::uint32_t bytes) noexcept;

enum class AtomicCap : std::uint8_t { none, hca, global };

struct DeviceAttr {
  std::string name;
  std::string provider;
  Transport transport = Transport::roce;
  std::uint64_t node_guid = 0;
  std::uint32_t vendor_id = 0;
  std::uint32_t vendor_part_id = 0;
  std::string fw_ver;
  std::uint64_t max_mr_size = 0;
  std::uint32_t max_qp = 0;
  std::uint32_t max_qp_wr = 0;
  std::uint32_t max_sge = 0;
  std::uint32_t max_cq = 0;
  std::uint32_t max_cqe = 0;
  std::uint32_t max_mr = 0;
  std::uint32_t max_pd = 0;
  std::uint32_t max_ah = 0;
  std::uint32_t max_srq = 0;
  std::uint32_t max_srq_wr = 0;
  std::uint32_t max_qp_rd_atom = 0;      // outstanding READ/atomic as responder
  std::uint32_t max_qp_init_rd_atom = 0; // outstanding READ/atomic as requester
  std::uint32_t max_inline_data = 0;
  AtomicCap atomic_cap = AtomicCap::none;
  std::uint8_t phys_port_cnt = 1;
  // The engine tells a WriteObserver of every byte it writes into registered memory (software
  // engines). A NIC writes by DMA and cannot: a migrating backend then treats every page it
  // may write (local-write regions) as dirty at the stop.
  bool reports_writes = false;
  // Receive completions carry WcFlags::solicited (software engines; ibv_wc has no such bit).
  bool reports_solicited = false;
  // create_qp(QpType::gsi) gives the caller QP1 and the connection manager's MADs (the soft
  // engine; on a NIC QP1 belongs to the host's kernel).
  bool gsi = false;
  // ProtectionDomain::alloc_mr, WrOpcode::reg_mr and local_inv: the most pages one region can
  // be given (Linux max_fast_reg_page_list_len); 0: no fast registration.
  std::uint32_t max_fast_reg_pages = 0;
};

struct PortAttr {
  PortState state = PortState::down;
  Mtu max_mtu = Mtu::mtu4096;
  Mtu active_mtu = Mtu::mtu1024;
  LinkLayer link_layer = LinkLayer::ethernet;
  std::uint32_t gid_tbl_len = 0;
  std::uint32_t max_msg_sz = 0;
  std::uint32_t active_speed_mbps = 0;
  std::string netdev;
};

// ---- Memory -------------------------------------------------------------------------------
// Access flags: values of ibv_access_flags.
enum class Access : std::uint32_t {
  none = 0,
  local_write = 1u << 0,
  remote_write = 1u << 1,
  remote_read = 1u << 2,
  remote_atomic = 1u << 3,
};
constexpr Access operator|(Access a, Access b) noexcept {
  return static_cast<Access>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr Access operator&(Access a, Access b) noexcept {
  return static_cast<Access>(static_cast<std::uint32_t>(a) & static_cast<std::uint32_t>(b));
}
constexpr bool has(Access set, Access bit) noexcept { return (set & bit) == bit && bit != Access::none; }
// IBA 10.6.3.1: a region that may be written or updated by a peer may be written locally too.
// The sentence every registration path gives when `a` breaks the rule.
constexpr bool rights_consistent(Access a) noexcept {
  return has(a, Access::local_write) || !(has(a, Access::remote_write) || has(a, Access::remote_atomic));
}
inline constexpr const char* kRightsInconsistent = "remote write or atomic access requires local write access too (IBA 10.6.3.1)";

struct Sge {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};

// ---- Queue pairs --------------------------------------------------------------------------
// ibv_qp_type values; gsi is the kernel's IB_QPT_GSI: QP1, which carries the connection
// manager's MADs (IBA 13.5.1), a datagram QP whose QPN is always 1 (one per device).
enum class QpType : std::uint8_t { gsi = 1, rc = 2, ud = 4 };
constexpr bool is_datagram(QpType t) noexcept { return t == QpType::ud || t == QpType::gsi; }
enum class QpState : std::uint8_t { reset = 0, init, rtr, rts, sqd, sqe, err };
std::string_view to_string(QpState s) noexcept;
std::string_view to_string(QpType t) noexcept;

// Attribute mask bits: values of ibv_qp_attr_mask.
enum class QpAttrMask : std::uint32_t {
  none = 0,
  state = 1u << 0,
  cur_state = 1u << 1,
  en_sqd_async_notify = 1u << 2,
  access_flags = 1u << 3,
  pkey_index = 1u << 4,
  port = 1u << 5,
  qkey = 1u << 6,
  av = 1u << 7,
  path_mtu = 1u << 8,
  timeout = 1u << 9,
  retry_cnt = 1u << 10,
  rnr_retry = 1u << 11,
  rq_psn = 1u << 12,
  max_qp_rd_atomic = 1u << 13,
  alt_path = 1u << 14,
  min_rnr_timer = 1u << 15,
  sq_psn = 1u << 16,
  max_dest_rd_atomic = 1u << 17,
  path_mig_state = 1u << 18,
  cap = 1u << 19,
  dest_qpn = 1u << 20,
};
constexpr QpAttrMask operator|(QpAttrMask a, QpAttrMask b) noexcept {
  return static_cast<QpAttrMask>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr QpAttrMask operator&(QpAttrMask a, QpAttrMask b) noexcept {
  return static_cast<QpAttrMask>(static_cast<std::uint32_t>(a) & static_cast<std::uint32_t>(b));
}
constexpr QpAttrMask operator~(QpAttrMask a) noexcept {
  return static_cast<QpAttrMask>(~static_cast<std::uint32_t>(a));
}
constexpr bool any(QpAttrMask m) noexcept { return m != QpAttrMask::none; }

// Where a RoCE packet goes: the remote GID (and for RoCEv2 the UDP source port entropy).
struct AhAttr {
  Gid dgid;
  std::uint8_t sgid_index = 0;
  std::uint8_t hop_limit = 64;
  std::uint8_t traffic_class = 0;
  std::uint8_t sl = 0;
  std::uint32_t flow_label = 0;
  std::uint8_t port_num = 1;
};

struct QpCap {
  std::uint32_t max_send_wr = 0;
  std::uint32_t max_recv_wr = 0;
  std::uint32_t max_send_sge = 1;
  std::uint32_t max_recv_sge = 1;
  std::uint32_t max_inline_data = 0;
  bool operator==(const QpCap&) const = default;
};

struct QpAttr {
  QpState qp_state = QpState::reset;
  QpState cur_qp_state = QpState::reset;
  Mtu path_mtu = Mtu::mtu1024;
  std::uint32_t qkey = 0;
  std::uint32_t rq_psn = 0;
  std::uint32_t sq_psn = 0;
  std::uint32_t dest_qp_num = 0;
  Access qp_access_flags = Access::none;
  QpCap cap;
  AhAttr ah_attr;
  std::uint16_t pkey_index = 0;
  std::uint8_t sq_draining = 0;
  std::uint8_t max_rd_atomic = 1;       // as requester
  std::uint8_t max_dest_rd_atomic = 1;  // as responder
  std::uint8_t min_rnr_timer = 0;       // IBA table 45 encoding
  std::uint8_t port_num = 1;
  std::uint8_t timeout = 14;            // 4.096 us * 2^timeout; 0 = infinite
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;           // 7 = infinite
};

class CompletionQueue;
class SharedReceiveQueue;

struct QpInitAttr {
  QpType type = QpType::rc;
  CompletionQueue* send_cq = nullptr;
  CompletionQueue* recv_cq = nullptr;
  SharedReceiveQueue* srq = nullptr;
  QpCap cap;
  bool sq_sig_all = false;
};

// ---- Work requests ------------------------------------------------------------------------
enum class WrOpcode : std::uint8_t {
  rdma_write = 0,
  rdma_write_with_imm = 1,
  send = 2,
  send_with_imm = 3,
  rdma_read = 4,
  atomic_cmp_and_swp = 5,
  atomic_fetch_and_add = 6,
  // RC: a SEND whose last packet carries IETH, telling the responder to invalidate the R_Key
  // `invalidate_rkey` (one of its regions that allows it, MrOptions::remote_invalidate; IBA
  // 9.4.1.3, 10.6.6).
  send_with_inv = 9,
  // Fast registration (IBA 10.6.3.4 and 10.6.4.4; Linux IB_WR_LOCAL_INV, IB_WR_REG_MR), RC only,
  // executed in order when the send queue reaches them, no packet on the wire: LOCAL_INV makes
  // the region whose key is `invalidate_rkey` invalid; REG_MR gives a region from
  // ProtectionDomain::alloc_mr memory, rights and a new key (SendWr::reg). With the fence flag
  // either waits for every earlier work request to complete.
  local_inv = 7,
  reg_mr = 32,
};
std::string_view to_string(WrOpcode op) noexcept;
// One of the values above (a number off the wire or from a caller is checked with this).
constexpr bool is_known(WrOpcode op) noexcept {
  return static_cast<unsigned>(op) <= static_cast<unsigned>(WrOpcode::atomic_fetch_and_add) || op == WrOpcode::send_with_inv ||
         op == WrOpcode::local_inv || op == WrOpcode::reg_mr;
}
// LOCAL_INV and REG_MR: work on this side's regions, nothing on the wire.
constexpr bool is_local_op(WrOpcode op) noexcept { return op == WrOpcode::local_inv || op == WrOpcode::reg_mr; }

enum class SendFlags : std::uint32_t { none = 0, fence = 1, signaled = 2, solicited = 4, inline_data = 8 };
constexpr SendFlags operator|(SendFlags a, SendFlags b) noexcept {
  return static_cast<SendFlags>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr bool has(SendFlags set, SendFlags bit) noexcept {
  return (static_cast<std::uint32_t>(set) & static_cast<std::uint32_t>(bit)) != 0;
}

class AddressHandle;
class MemoryRegion;

struct SendWr {
  std::uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::send;
  SendFlags flags = SendFlags::none;
  std::span<const Sge> sg_list;
  std::uint32_t imm_data = 0;  // host order; sent big-endian
  std::uint32_t invalidate_rkey = 0;  // send_with_inv: the peer's R_Key; local_inv: our key
  struct {
    std::uint64_t remote_addr = 0;
    std::uint32_t rkey = 0;
  } rdma;
  struct {
    std::uint64_t remote_addr = 0;
    std::uint32_t rkey = 0;
    std::uint64_t compare_add = 0;
    std::uint64_t swap = 0;
  } atomic;
  struct {
    AddressHandle* ah = nullptr;
    std::uint32_t remote_qpn = 0;
    std::uint32_t remote_qkey = 0;
  } ud;
  // reg_mr: the region (from alloc_mr on the QP's PD, invalid until now) gets the `length`
  // bytes at host address `addr`, which work requests and peers name from `iova` on, in pages
  // of 1 << page_shift (as many as the region was made for, counting from iova's page), the
  // rights `access`, and the key `key` (the region's own but for its low byte: IBA 10.6.3.4).
  struct {
    MemoryRegion* mr = nullptr;
    void* addr = nullptr;
    std::uint64_t iova = 0;
    std::uint64_t length = 0;
    std::uint8_t page_shift = 12;
    Access access = Access::none;
    std::uint32_t key = 0;
  } reg;
};

struct RecvWr {
  std::uint64_t wr_id = 0;
  std::span<const Sge> sg_list;
};

// ---- Completions --------------------------------------------------------------------------
// Values of ibv_wc_status.
enum class WcStatus : std::uint8_t {
  success = 0,
  loc_len_err,
  loc_qp_op_err,
  loc_eec_op_err,
  loc_prot_err,
  wr_flush_err,
  mw_bind_err,
  bad_resp_err,
  loc_access_err,
  rem_inv_req_err,
  rem_access_err,
  rem_op_err,
  retry_exc_err,
  rnr_retry_exc_err,
  loc_rdd_viol_err,
  rem_inv_rd_req_err,
  rem_abort_err,
  inv_eecn_err,
  inv_eec_state_err,
  fatal_err,
  resp_timeout_err,
  general_err,
};
std::string_view to_string(WcStatus s) noexcept;

// Values of ibv_wc_opcode.
enum class WcOpcode : std::uint8_t {
  send = 0,
  rdma_write = 1,
  rdma_read = 2,
  comp_swap = 3,
  fetch_add = 4,
  bind_mw = 5,
  local_inv = 6,
  reg_mr = 10,  // Linux IB_WC_REG_MR (ibv has none: only kernel users register this way)
  recv = 128,
  recv_rdma_with_imm = 129,
};
std::string_view to_string(WcOpcode op) noexcept;

// grh, with_imm and with_inv are ibv_wc_flags; solicited (not in ibv) marks a receive whose
// message had the solicited-event bit, which a backend needs to honour a guest's solicited-only
// CQ arm. with_inv: the receive was a SEND with Invalidate, whose R_Key (invalidated_rkey) this
// side invalidated.
enum class WcFlags : std::uint32_t { none = 0, grh = 1, with_imm = 2, with_inv = 8, solicited = 1u << 8 };
constexpr WcFlags operator|(WcFlags a, WcFlags b) noexcept {
  return static_cast<WcFlags>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr bool has(WcFlags set, WcFlags bit) noexcept {
  return (static_cast<std::uint32_t>(set) & static_cast<std::uint32_t>(bit)) != 0;
}

struct WorkCompletion {
  std::uint64_t wr_id = 0;
  WcStatus status = WcStatus::success;
  WcOpcode opcode = WcOpcode::send;
  std::uint32_t vendor_err = 0;
  std::uint32_t byte_len = 0;
  std::uint32_t imm_data = 0;  // host order, valid with WcFlags::with_imm
  std::uint32_t invalidated_rkey = 0;  // valid with WcFlags::with_inv
  std::uint32_t qp_num = 0;
  std::uint32_t src_qp = 0;    // UD: sender's QPN
  WcFlags wc_flags = WcFlags::none;
  std::uint16_t pkey_index = 0;
  Gid sgid;                    // UD: sender's GID (the GRH), valid with WcFlags::grh
};

}  // namespace vrdma::nicdrv
