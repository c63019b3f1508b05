// The C++ view of the virtio RDMA device's contract, beside it. The contract itself is the plain
// C header vrdma/virtio_rdma.h (docs/virtio-rdma.md), which the guest kernel module and the
// rdma-core provider compile too; this header gives its structs and values the names the C++
// code uses (vrdmad's device model, device/src/; the migration code; libpvverbs,
// guest/src/pv/): every struct is an alias of the C struct, every constant and enumerator takes
// its value from the C define, and the static_asserts below tie the two together. Only C++
// conveniences live here: scoped enums, command names, std::bit_ceil, a zero-initialised
// StateCensus. Header-only (target vrdma_contract), so any module may use it.
#pragma once

#include <vrdma/virtio_rdma.h>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace vrdma::vrdma_dev {

// The C++ code reads the fields as host integers.
static_assert(std::endian::native == std::endian::little, "the virtio RDMA layouts are little-endian");

inline constexpr std::uint32_t kVirtioId = VIRTIO_RDMA_DEVICE_ID;
inline constexpr std::uint32_t kSignature = VIRTIO_RDMA_SIGNATURE;  // "VRDM" at config offset 0
inline constexpr std::uint16_t kVersion = VIRTIO_RDMA_VERSION;

// Queues.
inline constexpr std::uint16_t kControlQueue = VIRTIO_RDMA_CONTROL_QUEUE;
inline constexpr std::uint16_t kEventQueue = VIRTIO_RDMA_EVENT_QUEUE;
inline constexpr std::uint16_t kDoorbellQueue = VIRTIO_RDMA_DOORBELL_QUEUE;
inline constexpr std::uint16_t kStateQueue = VIRTIO_RDMA_STATE_QUEUE;  // optional: the state area
inline constexpr std::uint16_t kNumQueues = VIRTIO_RDMA_NUM_QUEUES;
inline constexpr std::uint16_t kRequiredQueues = VIRTIO_RDMA_REQUIRED_QUEUES;

// ---- Config space ---------------------------------------------------------------------------
using Config = ::virtio_rdma_config;

inline constexpr std::uint64_t kFeatureUd = VIRTIO_RDMA_FEATURE_UD;
inline constexpr std::uint64_t kFeatureSrq = VIRTIO_RDMA_FEATURE_SRQ;
inline constexpr std::uint64_t kFeatureAtomic = VIRTIO_RDMA_FEATURE_ATOMIC;
inline constexpr std::uint64_t kFeatureMigration = VIRTIO_RDMA_FEATURE_MIGRATION;
inline constexpr std::uint64_t kFeatureDmaMr = VIRTIO_RDMA_FEATURE_DMA_MR;
inline constexpr std::uint64_t kFeatureGsi = VIRTIO_RDMA_FEATURE_GSI;
inline constexpr std::uint64_t kFeatureFastReg = VIRTIO_RDMA_FEATURE_FAST_REG;
inline constexpr std::uint64_t kFeatureDbRing = VIRTIO_RDMA_FEATURE_DB_RING;

// ---- Carrier window (vhost-user-blk-pci) ----------------------------------------------------
using CarrierConfig = ::virtio_rdma_carrier_config;
inline constexpr std::uint32_t kCarrierSignatureOffset = VIRTIO_RDMA_CARRIER_SIGNATURE_OFFSET;
inline constexpr std::uint32_t kCarrierBlkNumQueuesOffset = VIRTIO_RDMA_CARRIER_BLK_NUM_QUEUES_OFFSET;
inline constexpr std::uint32_t kCarrierMinWindow = VIRTIO_RDMA_CARRIER_MIN_WINDOW;
// The carrier window describing the device whose full config space is `c`.
constexpr CarrierConfig carrier_config(const Config& c) {
  return CarrierConfig{0, c.signature, c.version, c.num_queues, c.features, sizeof(Config), 0};
}

// ---- Control queue --------------------------------------------------------------------------
enum class Cmd : std::uint32_t {
  query_device = VIRTIO_RDMA_CMD_QUERY_DEVICE,
  query_port = VIRTIO_RDMA_CMD_QUERY_PORT,
  query_gid = VIRTIO_RDMA_CMD_QUERY_GID,
  create_pd = VIRTIO_RDMA_CMD_CREATE_PD,
  destroy_pd = VIRTIO_RDMA_CMD_DESTROY_PD,
  reg_mr = VIRTIO_RDMA_CMD_REG_MR,
  dereg_mr = VIRTIO_RDMA_CMD_DEREG_MR,
  create_cq = VIRTIO_RDMA_CMD_CREATE_CQ,
  destroy_cq = VIRTIO_RDMA_CMD_DESTROY_CQ,
  create_qp = VIRTIO_RDMA_CMD_CREATE_QP,
  modify_qp = VIRTIO_RDMA_CMD_MODIFY_QP,
  query_qp = VIRTIO_RDMA_CMD_QUERY_QP,
  destroy_qp = VIRTIO_RDMA_CMD_DESTROY_QP,
  create_ah = VIRTIO_RDMA_CMD_CREATE_AH,
  destroy_ah = VIRTIO_RDMA_CMD_DESTROY_AH,
  create_srq = VIRTIO_RDMA_CMD_CREATE_SRQ,
  destroy_srq = VIRTIO_RDMA_CMD_DESTROY_SRQ,
  query_config = VIRTIO_RDMA_CMD_QUERY_CONFIG,  // response: Config (for drivers behind a carrier)
  reg_dma_mr = VIRTIO_RDMA_CMD_REG_DMA_MR,      // a PD's local DMA key (response: RegMrResp)
  alloc_mr = VIRTIO_RDMA_CMD_ALLOC_MR,          // a region for fast registration (response: RegMrResp)
  create_db_ring = VIRTIO_RDMA_CMD_CREATE_DB_RING,  // a process's doorbell ring (response: HandleResp)
  destroy_db_ring = VIRTIO_RDMA_CMD_DESTROY_DB_RING,
  count_ = VIRTIO_RDMA_CMD_COUNT
};
// A command's name for sentences ("?" for 0, "UNKNOWN" past the last).
inline constexpr std::array<std::string_view, VIRTIO_RDMA_CMD_COUNT> kCmdNames{
    "?",          "QUERY_DEVICE", "QUERY_PORT", "QUERY_GID",  "CREATE_PD",  "DESTROY_PD",  "REG_MR",
    "DEREG_MR",   "CREATE_CQ",    "DESTROY_CQ", "CREATE_QP",  "MODIFY_QP",  "QUERY_QP",    "DESTROY_QP",
    "CREATE_AH",  "DESTROY_AH",   "CREATE_SRQ", "DESTROY_SRQ", "QUERY_CONFIG", "REG_DMA_MR",
    "ALLOC_MR",   "CREATE_DB_RING", "DESTROY_DB_RING"};
constexpr bool every_command_named() {
  for (auto n : kCmdNames)
    if (n.empty()) return false;
  return true;
}
static_assert(every_command_named(), "kCmdNames: a name for every number below VIRTIO_RDMA_CMD_COUNT");
constexpr std::string_view cmd_name(std::uint32_t cmd) noexcept {
  return cmd < kCmdNames.size() ? kCmdNames[cmd] : std::string_view("UNKNOWN");
}

using CmdHeader = ::virtio_rdma_cmd_hdr;
// Status values are Linux errno numbers (0 = success), so a guest can hand them to its callers.
enum class Status : std::uint32_t {
  ok = VIRTIO_RDMA_S_OK,
  perm = VIRTIO_RDMA_S_PERM,                    // EPERM
  not_found = VIRTIO_RDMA_S_NOT_FOUND,          // ENOENT
  io = VIRTIO_RDMA_S_IO,                        // EIO
  no_memory = VIRTIO_RDMA_S_NO_MEMORY,          // ENOMEM
  fault = VIRTIO_RDMA_S_FAULT,                  // EFAULT
  busy = VIRTIO_RDMA_S_BUSY,                    // EBUSY
  invalid = VIRTIO_RDMA_S_INVALID,              // EINVAL
  no_space = VIRTIO_RDMA_S_NO_SPACE,            // ENOSPC
  not_supported = VIRTIO_RDMA_S_NOT_SUPPORTED,  // EOPNOTSUPP
};
using RespHeader = ::virtio_rdma_resp_hdr;
inline constexpr std::uint32_t kMaxErrorMessage = VIRTIO_RDMA_MAX_ERROR_MESSAGE;
inline constexpr std::uint32_t kNoHandle = VIRTIO_RDMA_NO_HANDLE;

using DeviceAttrResp = ::virtio_rdma_device_attr_resp;
using PortAttrResp = ::virtio_rdma_port_attr_resp;
using QueryGidReq = ::virtio_rdma_query_gid_req;
using GidResp = ::virtio_rdma_gid_resp;
using HandleReq = ::virtio_rdma_handle_req;    // destroy_*, query_qp
using HandleResp = ::virtio_rdma_handle_resp;  // create_pd, create_cq, create_ah
using RegMrReq = ::virtio_rdma_reg_mr_req;
using RegMrResp = ::virtio_rdma_reg_mr_resp;
using RegDmaMrReq = ::virtio_rdma_reg_dma_mr_req;
using AllocMrReq = ::virtio_rdma_alloc_mr_req;

// Completion ring: CqControl, then depth Cqes.
using CreateCqReq = ::virtio_rdma_create_cq_req;
using CqControl = ::virtio_rdma_cq_control;
using Cqe = ::virtio_rdma_cqe;
inline constexpr std::uint8_t kWcWithImm = VIRTIO_RDMA_WC_WITH_IMM;
inline constexpr std::uint8_t kWcGrh = VIRTIO_RDMA_WC_GRH;
inline constexpr std::uint8_t kWcSolicited = VIRTIO_RDMA_WC_SOLICITED;
inline constexpr std::uint8_t kWcWithInv = VIRTIO_RDMA_WC_WITH_INV;
inline constexpr std::uint8_t kWcOpLocalInv = VIRTIO_RDMA_WC_LOCAL_INV;
inline constexpr std::uint8_t kWcOpRegMr = VIRTIO_RDMA_WC_REG_MR;
inline constexpr std::uint64_t kCqeOffset = VIRTIO_RDMA_CQE_OFFSET;
// The phase a valid CQE at free-running index i carries.
constexpr std::uint8_t cqe_phase(std::uint32_t index, std::uint32_t depth) {
  return static_cast<std::uint8_t>(virtio_rdma_cqe_phase(index, depth));
}

// Queue pair.
using CreateQpReq = ::virtio_rdma_create_qp_req;
using CreateQpResp = ::virtio_rdma_create_qp_resp;
using QpStatus = ::virtio_rdma_qp_status;
using AhWire = ::virtio_rdma_ah;
using QpAttrWire = ::virtio_rdma_qp_attr;
using ModifyQpReq = ::virtio_rdma_modify_qp_req;
using CreateAhReq = ::virtio_rdma_create_ah_req;
using CreateSrqReq = ::virtio_rdma_create_srq_req;
using CreateSrqResp = ::virtio_rdma_create_srq_resp;

// ---- Work-request rings ---------------------------------------------------------------------
using SendWqe = ::virtio_rdma_send_wqe;
inline constexpr std::uint8_t kSendFence = VIRTIO_RDMA_SEND_FENCE;
inline constexpr std::uint8_t kSendSignaled = VIRTIO_RDMA_SEND_SIGNALED;
inline constexpr std::uint8_t kSendSolicited = VIRTIO_RDMA_SEND_SOLICITED;
inline constexpr std::uint8_t kSendInline = VIRTIO_RDMA_SEND_INLINE;
inline constexpr std::uint8_t kSendInlineAv = VIRTIO_RDMA_SEND_INLINE_AV;
inline constexpr std::uint32_t kInlineAvSize = VIRTIO_RDMA_INLINE_AV_SIZE;
// Fast registration's send WQEs (FEATURE_FAST_REG): their opcodes, and REG_MR's overlay.
inline constexpr std::uint8_t kWrLocalInv = VIRTIO_RDMA_WR_LOCAL_INV;
inline constexpr std::uint8_t kWrSendWithInv = VIRTIO_RDMA_WR_SEND_WITH_INV;
inline constexpr std::uint8_t kWrRegMr = VIRTIO_RDMA_WR_REG_MR;
using RegMrWqe = ::virtio_rdma_reg_mr_wqe;
inline constexpr std::uint32_t kFastRegMaxPageShift = VIRTIO_RDMA_FAST_REG_MAX_PAGE_SHIFT;
using WireSge = ::virtio_rdma_sge;
using RecvWqe = ::virtio_rdma_recv_wqe;

// Strides both sides compute the same way (the C helpers, constexpr here).
constexpr std::uint32_t pow2_at_least(std::uint32_t v) { return std::bit_ceil(v); }
constexpr std::uint32_t send_stride(std::uint32_t max_sge, std::uint32_t max_inline) {
  return virtio_rdma_send_stride(max_sge, max_inline);
}
constexpr std::uint32_t recv_stride(std::uint32_t max_sge) { return virtio_rdma_recv_stride(max_sge); }

// ---- Doorbell queue -------------------------------------------------------------------------
enum class DoorbellKind : std::uint16_t {
  sq = VIRTIO_RDMA_DB_SQ,
  rq = VIRTIO_RDMA_DB_RQ,
  srq = VIRTIO_RDMA_DB_SRQ,
  cq_arm = VIRTIO_RDMA_DB_CQ_ARM,
};
using Doorbell = ::virtio_rdma_doorbell;
// Doorbell rings (kFeatureDbRing): a process's own doorbells in guest memory.
using CreateDbRingReq = ::virtio_rdma_create_db_ring_req;
using DbRingHeader = ::virtio_rdma_db_ring_hdr;
inline constexpr std::uint32_t kDbRingNoKick = VIRTIO_RDMA_DB_RING_NO_KICK;
inline constexpr std::uint32_t kDbRingRecordsOffset = VIRTIO_RDMA_DB_RING_RECORDS_OFFSET;
inline constexpr std::uint32_t kDbRingMinDepth = VIRTIO_RDMA_DB_RING_MIN_DEPTH;
inline constexpr std::uint32_t kDbRingMaxDepth = VIRTIO_RDMA_DB_RING_MAX_DEPTH;
inline constexpr std::uint32_t kMaxDbRings = VIRTIO_RDMA_MAX_DB_RINGS;
static_assert(sizeof(DbRingHeader) == kDbRingRecordsOffset && sizeof(CreateDbRingReq) == 16 &&
              offsetof(DbRingHeader, consumed) == 4 && offsetof(DbRingHeader, flags) == 8);

// ---- Event queue ----------------------------------------------------------------------------
enum class EventType : std::uint32_t {
  cq_completion = VIRTIO_RDMA_EV_CQ_COMPLETION,
  cq_error = VIRTIO_RDMA_EV_CQ_ERROR,
  qp_fatal = VIRTIO_RDMA_EV_QP_FATAL,
  port_active = VIRTIO_RDMA_EV_PORT_ACTIVE,
  port_error = VIRTIO_RDMA_EV_PORT_ERROR,
  device_fatal = VIRTIO_RDMA_EV_DEVICE_FATAL,
  state_area_small = VIRTIO_RDMA_EV_STATE_AREA_SMALL,
};
using Event = ::virtio_rdma_event;

// ---- State area (kStateQueue) ---------------------------------------------------------------
inline constexpr std::uint32_t kStateAreaMagic = VIRTIO_RDMA_STATE_AREA_MAGIC;  // "VRSA"
inline constexpr std::uint32_t kMinStateArea = VIRTIO_RDMA_MIN_STATE_AREA;
inline constexpr std::uint32_t kMaxStateArea = VIRTIO_RDMA_MAX_STATE_AREA;
enum class StateAreaStatus : std::uint32_t {
  state = VIRTIO_RDMA_STATE_AREA_STATE,
  too_small = VIRTIO_RDMA_STATE_AREA_TOO_SMALL,
  not_saved = VIRTIO_RDMA_STATE_AREA_NOT_SAVED,
};
inline constexpr std::uint32_t kMaxLostReason = VIRTIO_RDMA_MAX_LOST_REASON;
// EventType::device_fatal info.
inline constexpr std::uint32_t kFatalObjectsLost = VIRTIO_RDMA_FATAL_OBJECTS_LOST;
inline constexpr std::uint32_t kFatalBackendRestarted = VIRTIO_RDMA_FATAL_BACKEND_RESTARTED;
using StateAreaHeader = ::virtio_rdma_state_area_hdr;

// The C census, every count zero until set.
struct StateCensus : ::virtio_rdma_state_census {
  constexpr StateCensus() : ::virtio_rdma_state_census{} {}
};
constexpr std::uint64_t state_area_bound(const StateCensus& c) { return virtio_rdma_state_area_bound(&c); }

// ---- The C++ names are the C contract -------------------------------------------------------
// Enumerators: each value is the C define's (a slip in the lists above fails here).
namespace detail {
template <class E>
constexpr std::uint32_t c_value(E e) {
  return static_cast<std::uint32_t>(e);
}
}  // namespace detail
static_assert(detail::c_value(Cmd::query_device) == VIRTIO_RDMA_CMD_QUERY_DEVICE && detail::c_value(Cmd::query_port) == VIRTIO_RDMA_CMD_QUERY_PORT &&
              detail::c_value(Cmd::query_gid) == VIRTIO_RDMA_CMD_QUERY_GID && detail::c_value(Cmd::create_pd) == VIRTIO_RDMA_CMD_CREATE_PD &&
              detail::c_value(Cmd::destroy_pd) == VIRTIO_RDMA_CMD_DESTROY_PD && detail::c_value(Cmd::reg_mr) == VIRTIO_RDMA_CMD_REG_MR &&
              detail::c_value(Cmd::dereg_mr) == VIRTIO_RDMA_CMD_DEREG_MR && detail::c_value(Cmd::create_cq) == VIRTIO_RDMA_CMD_CREATE_CQ &&
              detail::c_value(Cmd::destroy_cq) == VIRTIO_RDMA_CMD_DESTROY_CQ && detail::c_value(Cmd::create_qp) == VIRTIO_RDMA_CMD_CREATE_QP &&
              detail::c_value(Cmd::modify_qp) == VIRTIO_RDMA_CMD_MODIFY_QP && detail::c_value(Cmd::query_qp) == VIRTIO_RDMA_CMD_QUERY_QP &&
              detail::c_value(Cmd::destroy_qp) == VIRTIO_RDMA_CMD_DESTROY_QP && detail::c_value(Cmd::create_ah) == VIRTIO_RDMA_CMD_CREATE_AH &&
              detail::c_value(Cmd::destroy_ah) == VIRTIO_RDMA_CMD_DESTROY_AH && detail::c_value(Cmd::create_srq) == VIRTIO_RDMA_CMD_CREATE_SRQ &&
              detail::c_value(Cmd::destroy_srq) == VIRTIO_RDMA_CMD_DESTROY_SRQ &&
              detail::c_value(Cmd::query_config) == VIRTIO_RDMA_CMD_QUERY_CONFIG && detail::c_value(Cmd::count_) == VIRTIO_RDMA_CMD_COUNT &&
              detail::c_value(Cmd::reg_dma_mr) == VIRTIO_RDMA_CMD_REG_DMA_MR &&
              detail::c_value(Cmd::alloc_mr) == VIRTIO_RDMA_CMD_ALLOC_MR &&
              detail::c_value(Cmd::create_db_ring) == VIRTIO_RDMA_CMD_CREATE_DB_RING &&
              detail::c_value(Cmd::destroy_db_ring) == VIRTIO_RDMA_CMD_DESTROY_DB_RING &&
              detail::c_value(Cmd::destroy_db_ring) + 1 == detail::c_value(Cmd::count_));
static_assert(detail::c_value(Status::ok) == VIRTIO_RDMA_S_OK && detail::c_value(Status::perm) == VIRTIO_RDMA_S_PERM &&
              detail::c_value(Status::not_found) == VIRTIO_RDMA_S_NOT_FOUND && detail::c_value(Status::io) == VIRTIO_RDMA_S_IO &&
              detail::c_value(Status::no_memory) == VIRTIO_RDMA_S_NO_MEMORY && detail::c_value(Status::fault) == VIRTIO_RDMA_S_FAULT &&
              detail::c_value(Status::busy) == VIRTIO_RDMA_S_BUSY && detail::c_value(Status::invalid) == VIRTIO_RDMA_S_INVALID &&
              detail::c_value(Status::no_space) == VIRTIO_RDMA_S_NO_SPACE && detail::c_value(Status::not_supported) == VIRTIO_RDMA_S_NOT_SUPPORTED);
static_assert(detail::c_value(DoorbellKind::sq) == VIRTIO_RDMA_DB_SQ && detail::c_value(DoorbellKind::rq) == VIRTIO_RDMA_DB_RQ &&
              detail::c_value(DoorbellKind::srq) == VIRTIO_RDMA_DB_SRQ && detail::c_value(DoorbellKind::cq_arm) == VIRTIO_RDMA_DB_CQ_ARM);
static_assert(detail::c_value(EventType::cq_completion) == VIRTIO_RDMA_EV_CQ_COMPLETION &&
              detail::c_value(EventType::cq_error) == VIRTIO_RDMA_EV_CQ_ERROR && detail::c_value(EventType::qp_fatal) == VIRTIO_RDMA_EV_QP_FATAL &&
              detail::c_value(EventType::port_active) == VIRTIO_RDMA_EV_PORT_ACTIVE &&
              detail::c_value(EventType::port_error) == VIRTIO_RDMA_EV_PORT_ERROR &&
              detail::c_value(EventType::device_fatal) == VIRTIO_RDMA_EV_DEVICE_FATAL &&
              detail::c_value(EventType::state_area_small) == VIRTIO_RDMA_EV_STATE_AREA_SMALL);
static_assert(detail::c_value(StateAreaStatus::state) == VIRTIO_RDMA_STATE_AREA_STATE &&
              detail::c_value(StateAreaStatus::too_small) == VIRTIO_RDMA_STATE_AREA_TOO_SMALL &&
              detail::c_value(StateAreaStatus::not_saved) == VIRTIO_RDMA_STATE_AREA_NOT_SAVED);

// The C++ struct names are the C structs (aliases), so the layout is the C header's; the C test
// (tests/unit/vhost/contract_c_test.c) checks every offset in C. Here the sizes and a few key
// offsets as C++ sees them.
static_assert(std::is_same_v<Config, ::virtio_rdma_config> && std::is_standard_layout_v<Config> &&
              std::is_trivially_copyable_v<Config>);
static_assert(sizeof(Config) == 112 && offsetof(Config, features) == 8 && offsetof(Config, max_registered_bytes) == 64 &&
              offsetof(Config, mac) == 72 && offsetof(Config, gid) == 80 && offsetof(Config, transport) == 96);
static_assert(sizeof(CarrierConfig) == 32 && offsetof(CarrierConfig, signature) == kCarrierSignatureOffset &&
              offsetof(CarrierConfig, features) == 16 && sizeof(CarrierConfig) <= kCarrierBlkNumQueuesOffset);
static_assert(sizeof(CmdHeader) == 8 && sizeof(RespHeader) == 8 && offsetof(RespHeader, msg_len) == 4);
static_assert(sizeof(DeviceAttrResp) == 112 && offsetof(DeviceAttrResp, max_qp_rd_atom) == 64 &&
              offsetof(DeviceAttrResp, atomic_cap) == 76 && offsetof(DeviceAttrResp, fw_ver) == 80);
static_assert(sizeof(PortAttrResp) == 16 && offsetof(PortAttrResp, gid_tbl_len) == 4);
static_assert(sizeof(QueryGidReq) == 8 && sizeof(GidResp) == 24 && offsetof(GidResp, type) == 16);
static_assert(sizeof(HandleReq) == 8 && sizeof(HandleResp) == 8);
static_assert(sizeof(RegMrReq) == 40 && offsetof(RegMrReq, iova) == 8 && offsetof(RegMrReq, npages) == 32);
static_assert(sizeof(RegMrResp) == 16 && offsetof(RegMrResp, rkey) == 8);
static_assert(sizeof(CreateCqReq) == 16 && offsetof(CreateCqReq, ring_gpa) == 8);
static_assert(sizeof(CqControl) == 64 && kCqeOffset == sizeof(CqControl));
static_assert(sizeof(Cqe) == 32 && offsetof(Cqe, status) == 24 && offsetof(Cqe, owner) == 27 &&
              offsetof(Cqe, vendor_err) == 28);
static_assert(sizeof(CreateQpReq) == 64 && offsetof(CreateQpReq, qp_type) == 16 && offsetof(CreateQpReq, sq_depth) == 20 &&
              offsetof(CreateQpReq, sq_gpa) == 40 && offsetof(CreateQpReq, status_gpa) == 56);
static_assert(sizeof(CreateQpResp) == 16 && sizeof(QpStatus) == 64 && offsetof(QpStatus, state) == 8);
static_assert(sizeof(AhWire) == 28 && offsetof(AhWire, flow_label) == 16 && offsetof(AhWire, port_num) == 24);
static_assert(sizeof(QpAttrWire) == 84 && offsetof(QpAttrWire, qp_access_flags) == 4 &&
              offsetof(QpAttrWire, pkey_index) == 44 && offsetof(QpAttrWire, ah) == 56);
static_assert(sizeof(ModifyQpReq) == 92 && offsetof(ModifyQpReq, attr) == 8);
static_assert(sizeof(CreateAhReq) == 40 && offsetof(CreateAhReq, ah) == 8 && offsetof(CreateAhReq, reserved2) == 36);
static_assert(sizeof(CreateSrqReq) == 32 && offsetof(CreateSrqReq, ring_gpa) == 16 && sizeof(CreateSrqResp) == 8);
static_assert(sizeof(SendWqe) == 64 && offsetof(SendWqe, opcode) == 8 && offsetof(SendWqe, remote_addr) == 16 &&
              offsetof(SendWqe, compare_add) == 32 && offsetof(SendWqe, ah) == 48 && offsetof(SendWqe, reserved2) == 60);
static_assert(sizeof(WireSge) == 16 && offsetof(WireSge, lkey) == 12 && sizeof(RecvWqe) == 16);
static_assert(sizeof(Doorbell) == 16 && offsetof(Doorbell, kind) == 4 && offsetof(Doorbell, value) == 8);
static_assert(sizeof(Event) == 16 && offsetof(Event, info) == 8);
static_assert(sizeof(StateAreaHeader) == 80 && offsetof(StateAreaHeader, crc32) == 24 &&
              offsetof(StateAreaHeader, gid) == 32 && offsetof(StateAreaHeader, mac) == 48);

// The C helpers, evaluated by the C++ compiler, agree with the rules docs/virtio-rdma.md states.
static_assert(cqe_phase(0, 8) == 1 && cqe_phase(7, 8) == 1 && cqe_phase(8, 8) == 0 && cqe_phase(16, 8) == 1);
static_assert([] {
  for (std::uint32_t v = 0; v <= 4096; ++v)
    if (virtio_rdma_pow2_at_least(v) != std::bit_ceil(v)) return false;
  return virtio_rdma_pow2_at_least(0x80000000u) == 0x80000000u && virtio_rdma_pow2_at_least(0x80000001u) == 0;
}());
static_assert(send_stride(1, 0) == 128 && send_stride(4, 0) == 128 && send_stride(4, 200) == 512 &&
              recv_stride(1) == 32 && recv_stride(3) == 64);
static_assert(state_area_bound(StateCensus{}) == 80 + 4096);

}  // namespace vrdma::vrdma_dev
