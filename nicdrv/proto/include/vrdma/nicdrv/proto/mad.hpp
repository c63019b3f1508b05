// Management datagrams of the Communication Manager (IBA vol 1 13.4 MAD format, 12.6 CM
// messages) and the RDMA-CM private-data header, as they travel on QP1 (GSI) in RoCEv2 UD
// packets: BTH, DETH (Q_Key 0x80010000, source QP 1), 256 bytes of MAD, ICRC.
//
// One table (kCmAttrs) names every CM attribute with its private-data window; every message
// field is a Field {byte, bit, width} taken from IBA's tables (offsets count from the start of
// the MAD data, after the 24-byte common header; bit 0 is the most significant bit of that
// byte), read and written big-endian by get()/put(). No compiler bitfields.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <variant>

namespace vrdma::nicdrv::soft::mad {

inline constexpr std::size_t kMadLen = 256;      // IBA 13.4.2: every GSI MAD is 256 bytes
inline constexpr std::size_t kHdrLen = 24;       // common MAD header (13.4.2 table 145)
inline constexpr std::size_t kDataLen = kMadLen - kHdrLen;
inline constexpr std::uint32_t kGsiQkey = 0x80010000;  // IBA 13.5.1: QP1's well-known Q_Key
inline constexpr std::uint32_t kGsiQpn = 1;
inline constexpr std::uint8_t kBaseVersion = 1;
inline constexpr std::uint8_t kClassCm = 0x07;   // Communication Management class (table 144)
inline constexpr std::uint8_t kCmClassVersion = 2;
inline constexpr std::uint8_t kMethodSend = 0x03;  // CM messages are all Send (12.6.1)
static_assert(kHdrLen + kDataLen == 256);

using MadBytes = std::array<std::uint8_t, kMadLen>;

// ---- Fields ----------------------------------------------------------------------------------
struct Field {
  std::uint16_t byte;  // offset into the MAD data (after the common header)
  std::uint8_t bit;    // first bit, 0 = most significant bit of `byte`
  std::uint8_t width;  // 1..64 bits
};
constexpr bool fits(Field f) noexcept {
  return f.width >= 1 && f.width <= 64 && f.bit < 8 && f.byte * 8u + f.bit + f.width <= kDataLen * 8u;
}
// Reads/writes a field of the MAD data (`data` is the 232 bytes after the header).
std::uint64_t get(std::span<const std::uint8_t, kDataLen> data, Field f) noexcept;
void put(std::span<std::uint8_t, kDataLen> data, Field f, std::uint64_t v) noexcept;

// ---- Attributes (IBA table 104) ------------------------------------------------------------
enum class Attr : std::uint16_t {
  class_port_info = 0x0001,
  req = 0x0010,
  mra = 0x0011,
  rej = 0x0012,
  rep = 0x0013,
  rtu = 0x0014,
  dreq = 0x0015,
  drep = 0x0016,
  sidr_req = 0x0017,
  sidr_rep = 0x0018,
  lap = 0x0019,
  apr = 0x001a,
};

struct AttrInfo {
  Attr id;
  std::string_view name;        // as Wireshark names the message, e.g. "ConnectRequest"
  std::uint16_t private_off;    // where the private data starts in the MAD data
  std::uint16_t private_len;    // its length (to the end of the MAD)
  bool handled;                 // this CM sends or understands it (LAP/APR/SIDR are refused)
};
inline constexpr std::array<AttrInfo, 11> kCmAttrs{{
    {Attr::req, "ConnectRequest", 140, 92, true},
    {Attr::mra, "MsgRcptAck", 10, 222, true},
    {Attr::rej, "ConnectReject", 84, 148, true},
    {Attr::rep, "ConnectReply", 36, 196, true},
    {Attr::rtu, "ReadyToUse", 8, 224, true},
    {Attr::dreq, "DisconnectRequest", 12, 220, true},
    {Attr::drep, "DisconnectReply", 8, 224, true},
    {Attr::sidr_req, "ServiceIDResReq", 16, 216, false},
    {Attr::sidr_rep, "ServiceIDResReqResp", 96, 136, false},
    {Attr::lap, "LoadAlternatePath", 64, 168, false},
    {Attr::apr, "AlternatePathResponse", 84, 148, false},
}};
constexpr bool table_consistent() noexcept {
  for (const auto& a : kCmAttrs)
    if (a.private_off + a.private_len != kDataLen) return false;
  return true;
}
static_assert(table_consistent(), "every CM message's private data runs to the end of the MAD (IBA 12.6)");
const AttrInfo* attr_info(std::uint16_t id) noexcept;

// ---- The common MAD header (13.4.2) -----------------------------------------------------------
struct Header {
  std::uint8_t base_version = kBaseVersion;
  std::uint8_t mgmt_class = kClassCm;
  std::uint8_t class_version = kCmClassVersion;
  std::uint8_t method = kMethodSend;
  std::uint16_t status = 0;
  std::uint16_t class_specific = 0;
  std::uint64_t tid = 0;
  std::uint16_t attr_id = 0;
  std::uint32_t attr_mod = 0;
  bool operator==(const Header&) const = default;
};

// ---- CM messages (IBA 12.6.5 .. 12.6.11), host-order values ----------------------------------
using Gid16 = std::array<std::uint8_t, 16>;

struct Req {
  std::uint32_t local_comm_id = 0;
  std::uint64_t service_id = 0;
  std::uint64_t local_ca_guid = 0;
  std::uint32_t local_qkey = 0;
  std::uint32_t local_qpn = 0;               // 24 bits
  std::uint8_t responder_resources = 0;
  std::uint32_t local_eecn = 0;              // 24 bits
  std::uint8_t initiator_depth = 0;
  std::uint32_t remote_eecn = 0;             // 24 bits
  std::uint8_t remote_cm_response_timeout = 0;  // 5 bits
  std::uint8_t transport_service_type = 0;   // 2 bits: 0 RC, 1 UC, 2 RD
  bool end_to_end_flow_control = false;
  std::uint32_t starting_psn = 0;            // 24 bits: the PSN the REQ's sender expects to receive
  std::uint8_t local_cm_response_timeout = 0;   // 5 bits
  std::uint8_t retry_count = 0;              // 3 bits
  std::uint16_t pkey = 0xffff;
  std::uint8_t path_mtu = 0;                 // 4 bits, ibv_mtu enum
  bool rdc_exists = false;
  std::uint8_t rnr_retry_count = 0;          // 3 bits
  std::uint8_t max_cm_retries = 0;           // 4 bits
  bool srq = false;
  std::uint8_t extended_transport_type = 0;  // 3 bits
  std::uint16_t primary_local_lid = 0xffff, primary_remote_lid = 0xffff;
  Gid16 primary_local_gid{}, primary_remote_gid{};
  std::uint32_t primary_flow_label = 0;      // 20 bits
  std::uint8_t primary_packet_rate = 0;      // 6 bits
  std::uint8_t primary_traffic_class = 0;
  std::uint8_t primary_hop_limit = 0;
  std::uint8_t primary_sl = 0;               // 4 bits
  bool primary_subnet_local = false;
  std::uint8_t primary_local_ack_timeout = 0;  // 5 bits
  std::array<std::uint8_t, 44> alternate{};  // the alternate path (bytes 96..139), kept opaque
  std::array<std::uint8_t, 92> private_data{};
  bool operator==(const Req&) const = default;
};

struct Mra {
  std::uint32_t local_comm_id = 0, remote_comm_id = 0;
  std::uint8_t message_mraed = 0;  // 2 bits: 0 REQ, 1 REP, 2 LAP
  std::uint8_t service_timeout = 0;  // 5 bits
  std::array<std::uint8_t, 222> private_data{};
  bool operator==(const Mra&) const = default;
};

struct Rej {
  std::uint32_t local_comm_id = 0, remote_comm_id = 0;
  std::uint8_t message_rejected = 0;  // 2 bits: 0 REQ, 1 REP, 2 other
  std::uint8_t reject_info_length = 0;  // 7 bits, bytes of ARI used
  std::uint16_t reason = 0;
  std::array<std::uint8_t, 72> ari{};
  std::array<std::uint8_t, 148> private_data{};
  bool operator==(const Rej&) const = default;
};

struct Rep {
  std::uint32_t local_comm_id = 0, remote_comm_id = 0;
  std::uint32_t local_qkey = 0;
  std::uint32_t local_qpn = 0;     // 24 bits
  std::uint32_t local_eecn = 0;    // 24 bits
  std::uint32_t starting_psn = 0;  // 24 bits: the PSN the REP's sender expects to receive
  std::uint8_t responder_resources = 0, initiator_depth = 0;
  std::uint8_t target_ack_delay = 0;  // 5 bits
  std::uint8_t failover_accepted = 0;  // 2 bits
  bool end_to_end_flow_control = false;
  std::uint8_t rnr_retry_count = 0;  // 3 bits
  bool srq = false;
  std::uint64_t local_ca_guid = 0;
  std::array<std::uint8_t, 196> private_data{};
  bool operator==(const Rep&) const = default;
};

struct Rtu {
  std::uint32_t local_comm_id = 0, remote_comm_id = 0;
  std::array<std::uint8_t, 224> private_data{};
  bool operator==(const Rtu&) const = default;
};

struct Dreq {
  std::uint32_t local_comm_id = 0, remote_comm_id = 0;
  std::uint32_t remote_qpn = 0;  // 24 bits: the receiver's QPN
  std::array<std::uint8_t, 220> private_data{};
  bool operator==(const Dreq&) const = default;
};

struct Drep {
  std::uint32_t local_comm_id = 0, remote_comm_id = 0;
  std::array<std::uint8_t, 224> private_data{};
  bool operator==(const Drep&) const = default;
};

using Message = std::variant<Req, Mra, Rej, Rep, Rtu, Dreq, Drep>;
Attr attr_of(const Message& m) noexcept;

struct Mad {
  Header hdr;
  Message msg;
};

// ---- Encode and parse -------------------------------------------------------------------------
// Writes the header (attr_id from the message) and the message; reserved bits are zero.
MadBytes encode(Header hdr, const Message& msg) noexcept;

enum class ParseError : std::uint8_t {
  none = 0,
  bad_length,         // not exactly 256 bytes
  bad_base_version,   // not 1
  not_cm,             // another management class (QP1 carries others; not ours)
  bad_class_version,  // CM class version other than 2
  bad_method,         // not Send (CM uses Send only)
  unknown_attribute,
  unhandled_attribute,  // LAP/APR/SIDR: valid but not supported here
};
std::string_view to_string(ParseError e) noexcept;

// Decodes an untrusted MAD. Never reads outside `mad`.
ParseError parse(std::span<const std::uint8_t> mad, Mad& out) noexcept;
// Only the header (for the class/version checks before the message matters).
ParseError parse_header(std::span<const std::uint8_t> mad, Header& out) noexcept;

// ---- REJ reasons (IBA table 112) ----------------------------------------------------------------
enum class RejReason : std::uint16_t {
  no_qp = 1,
  no_resources = 3,
  timeout = 4,
  unsupported = 5,
  invalid_comm_id = 6,
  invalid_comm_instance = 7,
  invalid_service_id = 8,
  invalid_transport_type = 9,
  stale_connection = 10,
  invalid_gid = 12,
  invalid_mtu = 26,
  insufficient_resp_resources = 27,
  consumer = 28,
  invalid_rnr_retry = 29,
  duplicate_local_comm_id = 30,
  invalid_class_version = 31,
};
std::string_view to_string(RejReason r) noexcept;  // "" for unknown values

// ---- The RDMA-CM private-data header (librdmacm / the kernel's cma.c, struct cma_hdr) -------------
// version 0, IP version in the upper nibble, the initiator's source port, then source and
// destination addresses as 16-byte fields (IPv4 in the last four bytes). It opens the private
// data of every REQ that carries an RDMA-CM service ID.
inline constexpr std::size_t kCmaHdrLen = 36;
struct CmaHeader {
  std::uint8_t version = 0;
  std::uint8_t ip_version = 4;
  std::uint16_t src_port = 0;
  std::uint32_t src_ip_be = 0, dst_ip_be = 0;  // network order
  bool operator==(const CmaHeader&) const = default;
};
void encode_cma(const CmaHeader& h, std::span<std::uint8_t> out) noexcept;  // out.size() >= 36
// nullopt unless version 0, IPv4, and IPv4 addresses in the last four bytes (the rest zero).
std::optional<CmaHeader> parse_cma(std::span<const std::uint8_t> in) noexcept;

}  // namespace vrdma::nicdrv::soft::mad
