// The virtio RDMA device's contract (docs/virtio-rdma.md): config space, control commands,
// doorbells, events, and the layouts of the work-request and completion rings that live in
// guest memory. Shared by the device (vrdmad, vhost/src/rdma/) and the driver (libpvverbs,
// vhost/src/pv/); both are tested against it. Every field is little-endian; every struct is
// packed by construction (natural alignment, static_asserted sizes), so the layout is the same
// for every compiler. Nothing here depends on the nicdrv API: numeric values that come from
// libibverbs (opcodes, statuses, access flags, attribute masks) are the ibv values.
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>

namespace vrdma::vrdma_dev {

static_assert(std::endian::native == std::endian::little, "the virtio RDMA layouts are little-endian");

inline constexpr std::uint32_t kVirtioId = 42;
inline constexpr std::uint32_t kSignature = 0x4d445256;  // "VRDM" at config offset 0
inline constexpr std::uint16_t kVersion = 1;

// Queues.
inline constexpr std::uint16_t kControlQueue = 0;
inline constexpr std::uint16_t kEventQueue = 1;
inline constexpr std::uint16_t kDoorbellQueue = 2;
// Optional: the driver keeps one writable buffer posted here, the state area, into which the
// device writes its state when the frontend stops it during a migration (docs/virtio-rdma.md
// "State in guest memory"). A driver (or a frontend with num-queues=3) may leave it out.
inline constexpr std::uint16_t kStateQueue = 3;
inline constexpr std::uint16_t kNumQueues = 4;
inline constexpr std::uint16_t kRequiredQueues = 3;  // queues 0..2 must run; kStateQueue may not

// ---- Config space (256 bytes at most; read with GET_CONFIG) -----------------------------------
struct Config {
  std::uint32_t signature;  // kSignature
  std::uint16_t version;    // kVersion
  std::uint16_t num_queues; // kNumQueues
  std::uint64_t features;   // kFeature* bits (device features a carrier may mask travel here)
  std::uint32_t max_qp, max_cq, max_mr, max_pd;
  std::uint32_t max_ah, max_srq, max_qp_wr, max_cqe;
  std::uint32_t max_sge, max_inline, max_mr_pages, max_qp_rd_atom;
  std::uint64_t max_registered_bytes;  // per guest
  std::uint8_t mac[6];
  std::uint8_t port_state;  // ibv_port_state
  std::uint8_t active_mtu;  // ibv_mtu
  std::uint8_t gid[16];     // GID index 0 (RoCEv2 IPv4-mapped: the guest's own address)
  std::uint32_t transport;  // 0 IB, 1 RoCE, 2 iWARP, 3 software RoCEv2
  std::uint32_t reserved[3];
};
static_assert(sizeof(Config) == 112);

inline constexpr std::uint64_t kFeatureUd = 1u << 0;
inline constexpr std::uint64_t kFeatureSrq = 1u << 1;
inline constexpr std::uint64_t kFeatureAtomic = 1u << 2;
inline constexpr std::uint64_t kFeatureMigration = 1u << 3;

// ---- Carrier window (docs/virtio-rdma.md "Riding vhost-user-blk") ---------------------------
// Stock QEMU has no vhost-user RDMA device, so the device rides vhost-user-blk-pci. That
// frontend reads only a blk-sized config (GET_CONFIG of 36..60 bytes at offset 0 in QEMU 7.2),
// shows it to the guest as a virtio_blk_config, overwrites bytes 34..35 (blk num_queues) with
// its own queue count, and masks the virtio feature word to the blk feature list. A GET_CONFIG
// at offset 0 shorter than Config therefore gets this layout instead: blk capacity 0 (virtio_blk
// sees an empty disk and does no I/O), our signature at offset 8, and the device features the
// carrier masks. The driver reads the whole Config with QUERY_CONFIG on the control queue.
struct CarrierConfig {
  std::uint64_t blk_capacity;  // 0
  std::uint32_t signature;     // kSignature
  std::uint16_t version;       // kVersion
  std::uint16_t num_queues;    // kNumQueues
  std::uint64_t features;      // Config::features
  std::uint32_t config_size;   // sizeof(Config): what QUERY_CONFIG returns
  std::uint32_t reserved;
};
static_assert(sizeof(CarrierConfig) == 32);
inline constexpr std::uint32_t kCarrierSignatureOffset = 8;
// Bytes the carrier owns in its window (virtio_blk_config.num_queues): never ours.
inline constexpr std::uint32_t kCarrierBlkNumQueuesOffset = 34;
static_assert(sizeof(CarrierConfig) <= kCarrierBlkNumQueuesOffset);
// virtio_blk_config's size up to num_queues: the smallest window QEMU's vhost-user-blk reads.
inline constexpr std::uint32_t kCarrierMinWindow = 36;
// The carrier window describing the device whose full config space is `c`.
constexpr CarrierConfig carrier_config(const Config& c) {
  return CarrierConfig{0, c.signature, c.version, c.num_queues, c.features, sizeof(Config), 0};
}

// ---- Control queue: one chain = readable request, writable response ---------------------------
enum class Cmd : std::uint32_t {
  query_device = 1,
  query_port = 2,
  query_gid = 3,
  create_pd = 4,
  destroy_pd = 5,
  reg_mr = 6,
  dereg_mr = 7,
  create_cq = 8,
  destroy_cq = 9,
  create_qp = 10,
  modify_qp = 11,
  query_qp = 12,
  destroy_qp = 13,
  create_ah = 14,
  destroy_ah = 15,
  create_srq = 16,
  destroy_srq = 17,
  query_config = 18,  // response: Config (the whole config space, for drivers behind a carrier)
  count_
};
std::string_view cmd_name(std::uint32_t cmd) noexcept;

struct CmdHeader {
  std::uint32_t cmd;
  std::uint32_t reserved;
};
// Status values are Linux errno numbers (0 = success), so a guest can hand them to its callers.
enum class Status : std::uint32_t {
  ok = 0,
  perm = 1,        // EPERM: the object belongs to another PD / rights missing
  not_found = 2,   // ENOENT: no object with that handle
  io = 5,          // EIO: the engine failed
  no_memory = 12,  // ENOMEM
  fault = 14,      // EFAULT: a guest address is outside guest memory
  busy = 16,       // EBUSY: still in use
  invalid = 22,    // EINVAL: a malformed field
  no_space = 28,   // ENOSPC: a per-guest limit is reached
  not_supported = 95,  // EOPNOTSUPP
};
// On success the response body follows; on an error the body is the device's sentence saying
// why (msg_len bytes of UTF-8, no terminator, as much as fits the writable buffer).
struct RespHeader {
  std::uint32_t status;  // Status
  std::uint32_t msg_len;
};
inline constexpr std::uint32_t kMaxErrorMessage = 480;

// Handles are non-zero; 0 means "none" where a handle is optional.
inline constexpr std::uint32_t kNoHandle = 0;

struct DeviceAttrResp {
  std::uint64_t node_guid, max_mr_size;
  std::uint32_t vendor_id, vendor_part_id;
  std::uint32_t max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr, max_pd, max_ah, max_srq, max_srq_wr;
  std::uint32_t max_qp_rd_atom, max_qp_init_rd_atom, max_inline_data;
  std::uint8_t atomic_cap, phys_port_cnt, transport, reserved;
  char fw_ver[32];
};
static_assert(sizeof(DeviceAttrResp) == 112);

struct PortAttrResp {
  std::uint8_t state, max_mtu, active_mtu, link_layer;
  std::uint32_t gid_tbl_len, max_msg_sz, active_speed_mbps;
};
static_assert(sizeof(PortAttrResp) == 16);

struct QueryGidReq {
  std::uint32_t index;
  std::uint32_t reserved;
};
struct GidResp {
  std::uint8_t gid[16];
  std::uint32_t type;  // 0 IB, 1 RoCEv1, 2 RoCEv2, 3 iWARP
  std::uint32_t reserved;
};

struct HandleReq {  // destroy_*, query_qp
  std::uint32_t handle;
  std::uint32_t reserved;
};
struct HandleResp {  // create_pd, create_ah, create_srq
  std::uint32_t handle;
  std::uint32_t reserved;
};

// Memory registration: the region's bytes are `length` bytes starting `iova % page_size` into
// pages[0] and running through the following pages. pages_gpa points to npages little-endian
// u64 guest-physical page addresses, each aligned to 1 << page_shift.
struct RegMrReq {
  std::uint32_t pd;
  std::uint32_t access;      // ibv_access_flags
  std::uint64_t iova;        // the address work requests and peers use for the first byte
  std::uint64_t length;
  std::uint64_t pages_gpa;
  std::uint32_t npages;
  std::uint32_t page_shift;  // 12 (4 KiB) .. 30 (1 GiB)
};
static_assert(sizeof(RegMrReq) == 40);
struct RegMrResp {
  std::uint32_t mr, lkey, rkey, reserved;
};

// Completion ring: a 64-byte control block, then `depth` 32-byte CQEs, contiguous in guest
// physical memory at ring_gpa (4 KiB-aligned). depth is a power of two.
struct CreateCqReq {
  std::uint32_t depth;
  std::uint32_t reserved;
  std::uint64_t ring_gpa;
};
struct CqControl {
  std::uint32_t consumer;  // driver writes: CQEs it has consumed (free-running)
  std::uint32_t producer;  // device writes: CQEs it has produced (free-running; informative)
  std::uint32_t overruns;  // device writes: times it found the ring full and waited
  std::uint32_t reserved[13];
};
static_assert(sizeof(CqControl) == 64);
struct Cqe {
  std::uint64_t wr_id;
  std::uint32_t qp_num;
  std::uint32_t byte_len;
  std::uint32_t imm_data;  // host order of the value the peer sent
  std::uint32_t src_qp;
  std::uint8_t status;     // ibv_wc_status
  std::uint8_t opcode;     // ibv_wc_opcode
  std::uint8_t wc_flags;   // kWc* bits
  std::uint8_t owner;      // phase: ((index / depth) & 1) ^ 1 when valid
  std::uint32_t vendor_err;
};
static_assert(sizeof(Cqe) == 32);
inline constexpr std::uint8_t kWcWithImm = 1u << 0;
inline constexpr std::uint8_t kWcGrh = 1u << 1;
inline constexpr std::uint8_t kWcSolicited = 1u << 2;  // the message asked for a solicited event
inline constexpr std::uint64_t kCqeOffset = sizeof(CqControl);
// The phase a valid CQE at free-running index i carries.
constexpr std::uint8_t cqe_phase(std::uint32_t index, std::uint32_t depth) {
  return static_cast<std::uint8_t>(((index / depth) & 1u) ^ 1u);
}

// Queue pair. The send ring holds sq_depth WQEs of sq_stride bytes, the receive ring rq_depth
// WQEs of rq_stride bytes (strides from the response); both contiguous in guest-physical memory.
// status_gpa: a QpStatus block the device keeps up to date. An RQ is absent with an SRQ.
struct CreateQpReq {
  std::uint32_t pd, send_cq, recv_cq, srq;  // srq may be kNoHandle
  std::uint8_t qp_type;                     // ibv_qp_type: 2 RC, 4 UD
  std::uint8_t sq_sig_all;
  std::uint16_t reserved;
  std::uint32_t sq_depth, rq_depth;         // powers of two
  std::uint32_t max_send_sge, max_recv_sge, max_inline;
  std::uint64_t sq_gpa, rq_gpa, status_gpa;
};
static_assert(sizeof(CreateQpReq) == 64);
struct CreateQpResp {
  std::uint32_t qp, qp_num, sq_stride, rq_stride;
};
struct QpStatus {
  std::uint32_t sq_consumed;  // device writes: send WQEs taken from the ring (free-running)
  std::uint32_t rq_consumed;  // device writes: receive WQEs taken from the ring
  std::uint32_t state;        // device writes: ibv_qp_state as the device last saw it
  std::uint32_t reserved[13];
};
static_assert(sizeof(QpStatus) == 64);

// The AH attributes (ibv_ah_attr's RoCE subset).
struct AhWire {
  std::uint8_t dgid[16];
  std::uint32_t flow_label;
  std::uint8_t sgid_index, hop_limit, traffic_class, sl;
  std::uint8_t port_num, reserved[3];
};
static_assert(sizeof(AhWire) == 28);

struct QpAttrWire {
  std::uint8_t qp_state, cur_qp_state, path_mtu, qp_access_flags_pad;
  std::uint32_t qp_access_flags;
  std::uint32_t qkey, rq_psn, sq_psn, dest_qp_num;
  std::uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
  std::uint16_t pkey_index;
  std::uint8_t sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout;
  std::uint8_t retry_cnt, rnr_retry, reserved[2];
  AhWire ah;
};
static_assert(sizeof(QpAttrWire) == 84);

struct ModifyQpReq {
  std::uint32_t qp;
  std::uint32_t mask;  // ibv_qp_attr_mask
  QpAttrWire attr;
};
static_assert(sizeof(ModifyQpReq) == 92);

struct CreateAhReq {
  std::uint32_t pd;
  std::uint32_t reserved;
  AhWire ah;
  std::uint32_t reserved2;
};
static_assert(sizeof(CreateAhReq) == 40);

struct CreateSrqReq {
  std::uint32_t pd, depth, max_sge, reserved;
  std::uint64_t ring_gpa, status_gpa;  // ring of depth WQEs (stride from the response); QpStatus
};
struct CreateSrqResp {
  std::uint32_t srq, stride;
};

// ---- Work-request rings -----------------------------------------------------------------------
// A send WQE: this header, then num_sge Sges, or (kSendInline) inline_len bytes of payload.
struct SendWqe {
  std::uint64_t wr_id;
  std::uint8_t opcode;   // ibv_wr_opcode: 0 WRITE, 1 WRITE_IMM, 2 SEND, 3 SEND_IMM, 4 READ, 5 CAS, 6 FAA
  std::uint8_t flags;    // kSend* bits
  std::uint8_t num_sge;
  std::uint8_t reserved;
  std::uint32_t imm_data;
  std::uint64_t remote_addr;
  std::uint32_t rkey;
  std::uint32_t inline_len;
  std::uint64_t compare_add;
  std::uint64_t swap;
  std::uint32_t ah;          // UD: AH handle
  std::uint32_t remote_qpn;  // UD
  std::uint32_t remote_qkey; // UD
  std::uint32_t reserved2;
};
static_assert(sizeof(SendWqe) == 64);
inline constexpr std::uint8_t kSendFence = 1u << 0;
inline constexpr std::uint8_t kSendSignaled = 1u << 1;
inline constexpr std::uint8_t kSendSolicited = 1u << 2;
inline constexpr std::uint8_t kSendInline = 1u << 3;

struct WireSge {
  std::uint64_t addr;
  std::uint32_t length;
  std::uint32_t lkey;
};
static_assert(sizeof(WireSge) == 16);

struct RecvWqe {
  std::uint64_t wr_id;
  std::uint32_t num_sge;
  std::uint32_t reserved;
};
static_assert(sizeof(RecvWqe) == 16);

// Strides both sides compute the same way: header + SGEs (or inline bytes), rounded up to a
// power of two.
constexpr std::uint32_t pow2_at_least(std::uint32_t v) { return std::bit_ceil(v); }
constexpr std::uint32_t send_stride(std::uint32_t max_sge, std::uint32_t max_inline) {
  const std::uint32_t body = max_sge * sizeof(WireSge) > max_inline ? max_sge * std::uint32_t{sizeof(WireSge)} : max_inline;
  return pow2_at_least(std::uint32_t{sizeof(SendWqe)} + body);
}
constexpr std::uint32_t recv_stride(std::uint32_t max_sge) {
  return pow2_at_least(std::uint32_t{sizeof(RecvWqe)} + max_sge * std::uint32_t{sizeof(WireSge)});
}

// ---- Doorbell queue: a chain of readable Doorbell records -------------------------------------
enum class DoorbellKind : std::uint16_t {
  sq = 1,      // handle = QP, value = send producer index (free-running)
  rq = 2,      // handle = QP, value = receive producer index
  srq = 3,     // handle = SRQ, value = producer index
  cq_arm = 4,  // handle = CQ, value = 0 next completion, 1 solicited only
};
struct Doorbell {
  std::uint32_t handle;
  std::uint16_t kind;
  std::uint16_t reserved;
  std::uint32_t value;
  std::uint32_t reserved2;
};
static_assert(sizeof(Doorbell) == 16);

// ---- Event queue: the driver posts writable buffers; the device fills one Event in each -------
enum class EventType : std::uint32_t {
  cq_completion = 1,  // handle = CQ (armed CQ got a completion)
  cq_error = 2,       // handle = CQ
  qp_fatal = 3,       // handle = QP (the QP went to the error state)
  port_active = 4,
  port_error = 5,
  device_fatal = 6,
  // The device's state may outgrow the posted state area: info = KiB the area must have; the
  // driver posts a larger area on kStateQueue (the device then returns the old one).
  state_area_small = 7,
};
struct Event {
  std::uint32_t type;
  std::uint32_t handle;
  std::uint32_t info;
  std::uint32_t reserved;
};
static_assert(sizeof(Event) == 16);

// ---- State area (kStateQueue) ------------------------------------------------------------------
// The one chain the driver keeps posted on kStateQueue (writable buffers only, at least
// kMinStateArea bytes). When every ring has stopped while the frontend dirty-logs (a live
// migration), the device writes a StateAreaHeader and its state blob there, through the
// dirty log, so the frontend's last memory pass carries it to the destination. A destination
// device reads it from the chain the driver made available last on kStateQueue (split ring:
// avail.ring[(base - 1) mod size]), checks it, loads it and zeroes the magic. The driver zeroes
// a new area before posting it. The device returns the previous chain (used length 0) when a
// newer one arrives.
inline constexpr std::uint32_t kStateAreaMagic = 0x41535256;  // "VRSA"
inline constexpr std::uint32_t kMinStateArea = 64u << 10;
inline constexpr std::uint32_t kMaxStateArea = 64u << 20;
enum class StateAreaStatus : std::uint32_t {
  state = 1,     // `length` bytes of device state follow the header
  too_small = 2, // the state (`need` bytes with the header) did not fit: nothing follows
  not_saved = 3, // the source could not save the state (a NIC's QPs, SRQs): `length` bytes of
                 // reason (UTF-8, at most kMaxLostReason) follow, no CRC
};
constexpr std::uint32_t kMaxLostReason = 1024;
// EventType::device_fatal info: why the device lost the guest's objects.
constexpr std::uint32_t kFatalObjectsLost = 1;  // a migration could not bring them (the state did not come)
// The backend restarted (killed or crashed) with no state to take the guest's objects from: a
// driver that had objects has lost them; a driver with none has lost nothing and carries on.
constexpr std::uint32_t kFatalBackendRestarted = 2;
struct StateAreaHeader {
  std::uint32_t magic;          // kStateAreaMagic
  std::uint32_t status;         // StateAreaStatus
  std::uint64_t length;         // bytes of state after the header
  std::uint64_t need;           // bytes the area needs (header included)
  std::uint32_t crc32;          // CRC-32 (zlib) of the state bytes
  std::uint32_t state_version;  // the device-state format (RdmaDevice::kStateVersion)
  std::uint8_t gid[16];         // the engine's GID 0 at the source: the guest's RDMA address
  std::uint8_t mac[6];          // the device's MAC
  std::uint8_t reserved[26];
};
static_assert(sizeof(StateAreaHeader) == 80);

// An upper bound of the state's size for a device with these objects (what the device checks
// the posted area against, and what a driver may size its area by).
struct StateCensus {
  std::uint64_t pds = 0, ahs = 0, srqs = 0, mrs = 0, mr_pages = 0, cqs = 0, cqes = 0, qps = 0;
  std::uint64_t send_wrs = 0, recv_wrs = 0, inline_bytes = 0;  // summed over QPs (per-WR inline bound)
  std::uint64_t remote_rkeys = 0;  // rkey translations kept for peers that moved onto a NIC
};
constexpr std::uint64_t state_area_bound(const StateCensus& c) {
  return sizeof(StateAreaHeader) + 4096 + 64 * (c.pds + c.ahs + c.srqs) + 128 * c.mrs + 8 * c.mr_pages +
         128 * c.cqs + 64 * c.cqes + 2048 * c.qps + 512 * (c.send_wrs + c.recv_wrs) + c.inline_bytes +
         8 * c.remote_rkeys;
}

}  // namespace vrdma::vrdma_dev
