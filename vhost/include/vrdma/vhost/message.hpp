// vhost-user messages (QEMU docs/interop/vhost-user.rst): every request is declared once in
// kMessageTable, indexed by the Request enum; validate() checks a message against its row
// (sizes, fd counts, field ranges) before anything dispatches on it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/features.hpp"

namespace vrdma::vhost {

// The same error with context in front of its sentence.
inline Error prefixed(std::string_view what, const Error& e) {
  return Error{e.code, std::string(what) + e.message};
}

enum class Request : std::uint32_t {
  none = 0,
  get_features = 1,
  set_features = 2,
  set_owner = 3,
  reset_owner = 4,
  set_mem_table = 5,
  set_log_base = 6,
  set_log_fd = 7,
  set_vring_num = 8,
  set_vring_addr = 9,
  set_vring_base = 10,
  get_vring_base = 11,
  set_vring_kick = 12,
  set_vring_call = 13,
  set_vring_err = 14,
  get_protocol_features = 15,
  set_protocol_features = 16,
  get_queue_num = 17,
  set_vring_enable = 18,
  send_rarp = 19,
  net_set_mtu = 20,
  set_backend_req_fd = 21,
  iotlb_msg = 22,
  set_vring_endian = 23,
  get_config = 24,
  set_config = 25,
  create_crypto_session = 26,
  close_crypto_session = 27,
  postcopy_advise = 28,
  postcopy_listen = 29,
  postcopy_end = 30,
  get_inflight_fd = 31,
  set_inflight_fd = 32,
  gpu_set_socket = 33,
  reset_device = 34,
  vring_kick = 35,
  get_max_mem_slots = 36,
  add_mem_reg = 37,
  rem_mem_reg = 38,
  set_status = 39,
  get_status = 40,
  get_shared_object = 41,
  set_device_state_fd = 42,
  check_device_state = 43,
  count_,
};

// ---- wire layouts (little-endian host; x86-64 and aarch64 only) ----
struct Header {
  std::uint32_t request;
  std::uint32_t flags;
  std::uint32_t size;
};
inline constexpr std::uint32_t kVersion = 0x1;
inline constexpr std::uint32_t kVersionMask = 0x3;
inline constexpr std::uint32_t kFlagReply = 1u << 2;
inline constexpr std::uint32_t kFlagNeedReply = 1u << 3;

struct VringState {
  std::uint32_t index;
  std::uint32_t num;
};
struct VringAddr {
  std::uint32_t index;
  std::uint32_t flags;  // bit 0 (VHOST_VRING_F_LOG): log_guest_addr is valid
  std::uint64_t desc_uaddr;
  std::uint64_t used_uaddr;
  std::uint64_t avail_uaddr;
  std::uint64_t log_guest_addr;
};
inline constexpr std::uint32_t kVringFlagLog = 1u << 0;

struct MemRegion {
  std::uint64_t guest_phys_addr;
  std::uint64_t memory_size;
  std::uint64_t userspace_addr;
  std::uint64_t mmap_offset;
};
inline constexpr std::uint32_t kMaxMemTableRegions = 8;  // VHOST_MEMORY_BASELINE_NREGIONS
inline constexpr std::uint32_t kMaxMemSlots = 32;        // our GET_MAX_MEM_SLOTS answer
struct MemTableHeader {
  std::uint32_t nregions;
  std::uint32_t padding;
};
struct SingleMemRegion {
  std::uint64_t padding;
  MemRegion region;
};
struct LogArea {
  std::uint64_t mmap_size;
  std::uint64_t mmap_offset;
};
inline constexpr std::uint32_t kMaxConfigSize = 256;
struct ConfigHeader {
  std::uint32_t offset;
  std::uint32_t size;
  std::uint32_t flags;
};
struct InflightInfo {
  std::uint64_t mmap_size;
  std::uint64_t mmap_offset;
  std::uint16_t num_queues;
  std::uint16_t queue_size;
  std::uint32_t padding;  // QEMU sends sizeof() of the unpacked struct (24)
};
struct DeviceStateXfer {
  std::uint32_t direction;  // 0 save (backend writes), 1 load (backend reads)
  std::uint32_t phase;      // 0 stopped
};
static_assert(sizeof(Header) == 12 && sizeof(VringState) == 8 && sizeof(VringAddr) == 40);
static_assert(sizeof(MemRegion) == 32 && sizeof(SingleMemRegion) == 40 && sizeof(LogArea) == 16);
static_assert(sizeof(ConfigHeader) == 12 && sizeof(InflightInfo) == 24 && sizeof(DeviceStateXfer) == 8);

// Vring file messages (KICK/CALL/ERR): index in bits 0..7, bit 8 says "no fd" (polling).
inline constexpr std::uint64_t kVringIndexMask = 0xff;
inline constexpr std::uint64_t kVringNoFd = 1u << 8;

// ---- the message table ----
enum class FdRule : std::uint8_t {
  none,       // no fd may travel with it
  one,        // exactly one
  optional,   // zero or one (closed if unused)
  vring,      // one unless kVringNoFd is set in the u64 payload, then none
  mem_table,  // exactly nregions
};
enum class ReplyRule : std::uint8_t {
  ack,     // no reply of its own; REPLY_ACK answers it when the frontend sets need_reply
  always,  // the backend always answers (a GET, or a request with a defined reply)
};

struct MessageSpec {
  Request request;
  std::string_view name;
  bool supported;         // false: the backend answers "not supported" and keeps going
  std::uint32_t min_size;
  std::uint32_t max_size;
  FdRule fds;
  ReplyRule reply;
  bool gated;             // the request is only valid once `gate` was negotiated
  ProtocolFeature gate;
};

namespace detail {
constexpr std::uint32_t u64 = 8;
constexpr MessageSpec row(Request r, std::string_view n, bool s, std::uint32_t mn, std::uint32_t mx, FdRule f,
                          ReplyRule rep) {
  return {r, n, s, mn, mx, f, rep, false, ProtocolFeature::mq};
}
constexpr MessageSpec gated(MessageSpec m, ProtocolFeature g) {
  m.gated = true;
  m.gate = g;
  return m;
}
using R = Request;
using F = FdRule;
constexpr auto ack = ReplyRule::ack;
constexpr auto reply = ReplyRule::always;
constexpr std::uint32_t mem_table_max = sizeof(MemTableHeader) + kMaxMemTableRegions * sizeof(MemRegion);
constexpr std::uint32_t config_max = sizeof(ConfigHeader) + kMaxConfigSize;
}  // namespace detail

inline constexpr std::array<MessageSpec, static_cast<std::size_t>(Request::count_)> kMessageTable = [] {
  using namespace detail;
  using PF = ProtocolFeature;
  return std::array<MessageSpec, static_cast<std::size_t>(Request::count_)>{{
      row(R::none, "NONE", false, 0, 0, F::none, ack),
      row(R::get_features, "GET_FEATURES", true, 0, 0, F::none, reply),
      row(R::set_features, "SET_FEATURES", true, u64, u64, F::none, ack),
      row(R::set_owner, "SET_OWNER", true, 0, 0, F::none, ack),
      row(R::reset_owner, "RESET_OWNER", true, 0, 0, F::none, ack),
      row(R::set_mem_table, "SET_MEM_TABLE", true, sizeof(MemTableHeader) + sizeof(MemRegion), mem_table_max,
          F::mem_table, ack),
      gated(row(R::set_log_base, "SET_LOG_BASE", true, sizeof(LogArea), sizeof(LogArea), F::one, reply),
            PF::log_shmfd),
      row(R::set_log_fd, "SET_LOG_FD", false, 0, 0, F::one, ack),
      row(R::set_vring_num, "SET_VRING_NUM", true, sizeof(VringState), sizeof(VringState), F::none, ack),
      row(R::set_vring_addr, "SET_VRING_ADDR", true, sizeof(VringAddr), sizeof(VringAddr), F::none, ack),
      row(R::set_vring_base, "SET_VRING_BASE", true, sizeof(VringState), sizeof(VringState), F::none, ack),
      row(R::get_vring_base, "GET_VRING_BASE", true, sizeof(VringState), sizeof(VringState), F::none, reply),
      row(R::set_vring_kick, "SET_VRING_KICK", true, u64, u64, F::vring, ack),
      row(R::set_vring_call, "SET_VRING_CALL", true, u64, u64, F::vring, ack),
      row(R::set_vring_err, "SET_VRING_ERR", true, u64, u64, F::vring, ack),
      row(R::get_protocol_features, "GET_PROTOCOL_FEATURES", true, 0, 0, F::none, reply),
      row(R::set_protocol_features, "SET_PROTOCOL_FEATURES", true, u64, u64, F::none, ack),
      gated(row(R::get_queue_num, "GET_QUEUE_NUM", true, 0, 0, F::none, reply), PF::mq),
      row(R::set_vring_enable, "SET_VRING_ENABLE", true, sizeof(VringState), sizeof(VringState), F::none, ack),
      row(R::send_rarp, "SEND_RARP", false, u64, u64, F::none, ack),
      row(R::net_set_mtu, "NET_SET_MTU", false, u64, u64, F::none, ack),
      row(R::set_backend_req_fd, "SET_BACKEND_REQ_FD", false, 0, 0, F::one, ack),
      row(R::iotlb_msg, "IOTLB_MSG", false, 0, 64, F::none, ack),
      row(R::set_vring_endian, "SET_VRING_ENDIAN", false, sizeof(VringState), sizeof(VringState), F::none, ack),
      gated(row(R::get_config, "GET_CONFIG", true, sizeof(ConfigHeader), config_max, F::none, reply), PF::config),
      gated(row(R::set_config, "SET_CONFIG", true, sizeof(ConfigHeader), config_max, F::none, ack), PF::config),
      row(R::create_crypto_session, "CREATE_CRYPTO_SESSION", false, 0, config_max, F::none, reply),
      row(R::close_crypto_session, "CLOSE_CRYPTO_SESSION", false, 0, u64, F::none, ack),
      row(R::postcopy_advise, "POSTCOPY_ADVISE", false, 0, 0, F::none, reply),
      row(R::postcopy_listen, "POSTCOPY_LISTEN", false, 0, 0, F::none, ack),
      row(R::postcopy_end, "POSTCOPY_END", false, 0, 0, F::none, reply),
      gated(row(R::get_inflight_fd, "GET_INFLIGHT_FD", true, 20, sizeof(InflightInfo), F::none, reply),
            PF::inflight_shmfd),
      gated(row(R::set_inflight_fd, "SET_INFLIGHT_FD", true, 20, sizeof(InflightInfo), F::one, ack),
            PF::inflight_shmfd),
      row(R::gpu_set_socket, "GPU_SET_SOCKET", false, 0, 0, F::one, ack),
      gated(row(R::reset_device, "RESET_DEVICE", true, 0, 0, F::none, ack), PF::reset_device),
      row(R::vring_kick, "VRING_KICK", false, sizeof(VringState), sizeof(VringState), F::none, ack),
      gated(row(R::get_max_mem_slots, "GET_MAX_MEM_SLOTS", true, 0, 0, F::none, reply), PF::configure_mem_slots),
      gated(row(R::add_mem_reg, "ADD_MEM_REG", true, sizeof(SingleMemRegion), sizeof(SingleMemRegion), F::one, ack),
            PF::configure_mem_slots),
      gated(row(R::rem_mem_reg, "REM_MEM_REG", true, sizeof(SingleMemRegion), sizeof(SingleMemRegion),
                F::optional, ack),
            PF::configure_mem_slots),
      gated(row(R::set_status, "SET_STATUS", true, u64, u64, F::none, ack), PF::status),
      gated(row(R::get_status, "GET_STATUS", true, 0, 0, F::none, reply), PF::status),
      row(R::get_shared_object, "GET_SHARED_OBJECT", false, 0, 16, F::none, reply),
      gated(row(R::set_device_state_fd, "SET_DEVICE_STATE_FD", true, sizeof(DeviceStateXfer),
                sizeof(DeviceStateXfer), F::one, reply),
            PF::device_state),
      gated(row(R::check_device_state, "CHECK_DEVICE_STATE", true, 0, 0, F::none, reply), PF::device_state),
  }};
}();

constexpr bool table_is_indexed_by_request() {
  for (std::size_t i = 0; i < kMessageTable.size(); ++i) {
    if (static_cast<std::size_t>(kMessageTable[i].request) != i) return false;
    if (kMessageTable[i].min_size > kMessageTable[i].max_size) return false;
    if (kMessageTable[i].name.empty()) return false;
  }
  return true;
}
static_assert(table_is_indexed_by_request(), "kMessageTable rows must follow the Request enum order");

constexpr std::uint32_t max_payload_size() {
  std::uint32_t m = 0;
  for (const auto& s : kMessageTable) m = s.max_size > m ? s.max_size : m;
  return m;
}
inline constexpr std::uint32_t kMaxPayload = max_payload_size();
static_assert(kMaxPayload == sizeof(ConfigHeader) + kMaxConfigSize);
inline constexpr std::size_t kMaxFds = 8;  // the most any valid message carries (SET_MEM_TABLE)

// The row for a request number from the wire, or nullptr if it is out of range.
const MessageSpec* find_spec(std::uint32_t request) noexcept;
std::string_view request_name(std::uint32_t request) noexcept;

// One message with its payload and the fds that travelled with it (owned; closed when the
// message is destroyed, so every error path closes them).
struct Message {
  Header hdr{};
  std::array<std::uint8_t, kMaxPayload> payload{};
  std::vector<UniqueFd> fds;

  [[nodiscard]] Request request() const { return static_cast<Request>(hdr.request); }
  [[nodiscard]] bool need_reply() const { return (hdr.flags & kFlagNeedReply) != 0; }

  // Reads a payload struct; validate() has checked that hdr.size covers what is needed.
  template <class T>
  [[nodiscard]] T get(std::size_t offset = 0) const {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    static_assert(sizeof(T) <= kMaxPayload);
    if (offset <= kMaxPayload - sizeof(T)) std::memcpy(&v, payload.data() + offset, sizeof(T));
    return v;
  }
  template <class T>
  void set(const T& v) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kMaxPayload);
    std::memcpy(payload.data(), &v, sizeof(T));
    hdr.size = sizeof(T);
  }
  void set_bytes(std::size_t offset, const void* p, std::size_t n);
  // Moves fd i out (or an empty UniqueFd if there is none).
  UniqueFd take_fd(std::size_t i);
};

Message make_request(Request r, std::uint32_t flags = 0);
Message make_reply(const Message& req);

// Checks a received request against its table row: version and reply bits, a known and
// supported request, payload size in range, the right number of fds, protocol gate, and the
// ranges inside variable payloads (mem table count, config offset/size). On error the message's
// fds are closed when the message goes away; the Error says what was wrong in one sentence.
Status validate_request(const Message& m, ProtocolFeatures acked);

// Checks a reply from the backend (frontend side): reply bit, matching request, size.
Status validate_reply(const Message& m, Request expected, std::uint32_t expected_size);

}  // namespace vrdma::vhost
