// RoCEv2 wire format (IBA vol 1 ch. 9 transport headers, Annex A17 RoCEv2 encapsulation).
//
// One opcode table (kOpcodes) is the single source of truth for which extended headers each
// opcode carries and how long its headers are; encode and parse are driven by it. All fields
// are explicit big-endian byte offsets; there are no compiler bitfields.
//
// A RoCEv2 packet as carried in a UDP datagram to port 4791:
//   BTH (12) [DETH (8)] [RETH (16)] [AtomicETH (28)] [AETH (4)] [AtomicAckETH (8)]
//   [ImmDt (4)] payload pad(0..3) ICRC (4)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace vrdma::nicdrv::soft::wire {

inline constexpr std::uint16_t kRoceV2Port = 4791;
inline constexpr std::size_t kBthLen = 12, kDethLen = 8, kRethLen = 16, kAtomicEthLen = 28, kAethLen = 4,
                             kAtomicAckEthLen = 8, kImmLen = 4, kIethLen = 4, kIcrcLen = 4;
inline constexpr std::uint16_t kDefaultPkey = 0xffff;

// IBA 10.9.3 (and Linux rxe's pkey_match): a packet's P_Key matches a partition key when their
// low 15 bits (the partition) are equal and not the invalid 0, and at least one of the two is a
// full member (bit 15): two limited members of a partition may not talk to each other.
constexpr bool pkey_match(std::uint16_t a, std::uint16_t b) noexcept {
  return (a & 0x7fff) != 0 && (a & 0x7fff) == (b & 0x7fff) && ((a | b) & 0x8000) != 0;
}
static_assert(pkey_match(0xffff, 0xffff) && pkey_match(0x7fff, 0xffff) && pkey_match(0xffff, 0x7fff));
static_assert(!pkey_match(0x7fff, 0x7fff) && !pkey_match(0x8001, 0xffff) && !pkey_match(0x8000, 0x8000));
inline constexpr std::uint32_t kPsnMask = 0xffffff;
inline constexpr std::uint32_t kQpnMask = 0xffffff;
inline constexpr std::size_t kMaxPayload = 4096;  // largest IBA path MTU (9.6.1.2); parse() rejects more

// Pad bytes that make payload + pad a multiple of 4 (IBA 9.2 PadCnt).
constexpr std::uint8_t pad_for(std::size_t payload_len) noexcept {
  return static_cast<std::uint8_t>((4u - (payload_len & 3u)) & 3u);
}

// Opcodes (IBA table 38). Bits 7:5 transport (000 RC, 011 UD), bits 4:0 operation.
enum class Opcode : std::uint8_t {
  rc_send_first = 0x00,
  rc_send_middle = 0x01,
  rc_send_last = 0x02,
  rc_send_last_imm = 0x03,
  rc_send_only = 0x04,
  rc_send_only_imm = 0x05,
  rc_write_first = 0x06,
  rc_write_middle = 0x07,
  rc_write_last = 0x08,
  rc_write_last_imm = 0x09,
  rc_write_only = 0x0a,
  rc_write_only_imm = 0x0b,
  rc_read_request = 0x0c,
  rc_read_response_first = 0x0d,
  rc_read_response_middle = 0x0e,
  rc_read_response_last = 0x0f,
  rc_read_response_only = 0x10,
  rc_acknowledge = 0x11,
  rc_atomic_acknowledge = 0x12,
  rc_compare_swap = 0x13,
  rc_fetch_add = 0x14,
  rc_send_last_inv = 0x16,  // SEND with Invalidate: IETH names the responder's R_Key to invalidate
  rc_send_only_inv = 0x17,
  ud_send_only = 0x64,
  ud_send_only_imm = 0x65,
};

// Header-presence flags for the opcode table.
enum HdrFlag : std::uint16_t {
  kHasReth = 1u << 0,
  kHasAeth = 1u << 1,
  kHasAtomicEth = 1u << 2,
  kHasAtomicAckEth = 1u << 3,
  kHasImm = 1u << 4,
  kHasDeth = 1u << 5,
  kHasPayload = 1u << 6,
  kIsFirst = 1u << 7,   // first (or only) packet of a message
  kIsLast = 1u << 8,    // last (or only) packet of a message
  kIsRequest = 1u << 9, // sent by a requester (else a response)
  kIsSend = 1u << 10,
  kIsWrite = 1u << 11,
  kIsRead = 1u << 12,   // read request or read response
  kIsAtomic = 1u << 13, // atomic request or atomic ack
  kHasIeth = 1u << 14,  // IETH (9.3.8): SEND with Invalidate's R_Key
};

struct OpcodeInfo {
  std::string_view name;  // as Wireshark prints it, e.g. "RC Send First"
  std::uint16_t flags = 0;
  std::uint8_t hdr_len = 0;  // BTH + all extended headers, excluding payload/pad/ICRC
  bool valid = false;
};

// Indexed by the raw opcode byte; invalid entries have valid == false.
const std::array<OpcodeInfo, 256>& opcode_table() noexcept;
inline const OpcodeInfo& info(Opcode op) noexcept { return opcode_table()[static_cast<std::uint8_t>(op)]; }

// ---- Extended transport headers (host-order values) ------------------------------------------
struct Bth {
  Opcode opcode = Opcode::rc_send_only;
  bool solicited = false;     // SE
  bool mig_req = true;        // M (APM migration state; note Linux rxe sends 0)
  std::uint8_t pad = 0;       // 0..3 bytes of pad after the payload
  std::uint8_t tver = 0;
  std::uint16_t pkey = kDefaultPkey;
  bool fecn = false, becn = false;
  std::uint32_t dest_qp = 0;  // 24 bits
  bool ack_req = false;       // A
  std::uint32_t psn = 0;      // 24 bits
  bool operator==(const Bth&) const = default;
};

struct Reth {
  std::uint64_t va = 0;
  std::uint32_t rkey = 0;
  std::uint32_t dma_len = 0;
  bool operator==(const Reth&) const = default;
};

// AETH syndrome (IBA 9.7.5.1 table 42).
enum class AckType : std::uint8_t { ack = 0, rnr_nak = 1, reserved = 2, nak = 3 };
enum class NakCode : std::uint8_t {
  psn_seq_error = 0,
  invalid_request = 1,
  remote_access_error = 2,
  remote_op_error = 3,
  invalid_rd_request = 4,
};
inline constexpr std::uint8_t kCreditInvalid = 0x1f;  // "no end-to-end credit limit"

struct Aeth {
  std::uint8_t syndrome = 0;  // bits 7..5 type (bit 7 reserved 0), 4..0 value
  std::uint32_t msn = 0;      // 24 bits
  [[nodiscard]] AckType type() const noexcept { return static_cast<AckType>((syndrome >> 5) & 3); }
  [[nodiscard]] std::uint8_t value() const noexcept { return syndrome & 0x1f; }
  static Aeth make(AckType t, std::uint8_t value, std::uint32_t msn) noexcept {
    return Aeth{static_cast<std::uint8_t>((static_cast<unsigned>(t) << 5) | (value & 0x1f)), msn & 0xffffff};
  }
  bool operator==(const Aeth&) const = default;
};

struct AtomicEth {
  std::uint64_t va = 0;
  std::uint32_t rkey = 0;
  std::uint64_t swap_add = 0;
  std::uint64_t compare = 0;
  bool operator==(const AtomicEth&) const = default;
};

struct Deth {
  std::uint32_t qkey = 0;
  std::uint32_t src_qp = 0;  // 24 bits
  bool operator==(const Deth&) const = default;
};

// A packet's headers, as built by the sender or decoded by parse().
struct Headers {
  Bth bth;
  Reth reth;
  Aeth aeth;
  AtomicEth atomic;
  std::uint64_t atomic_ack = 0;  // AtomicAckETH: original remote data
  std::uint32_t imm = 0;         // ImmDt, host order
  std::uint32_t ieth = 0;        // IETH: the R_Key a SEND with Invalidate invalidates
  Deth deth;
  bool operator==(const Headers&) const = default;
};

// ---- IPv4/UDP context needed for the ICRC (A17.3.3) ------------------------------------------
// The ICRC covers the IPv4 and UDP headers with their variant fields (TOS, TTL, IP checksum,
// UDP checksum) masked to ones, preceded by 8 bytes of ones standing for the LRH.
struct Ipv4Context {
  std::uint32_t src_be = 0;      // network order
  std::uint32_t dst_be = 0;      // network order
  std::uint16_t ip_id = 0;       // identification field (host-order value of the wire field)
  bool dont_fragment = true;
  std::uint16_t udp_src_port = kRoceV2Port;
  std::uint16_t udp_dst_port = kRoceV2Port;
};

// ICRC over `ib_packet` = BTH .. end of pad (without the 4 ICRC bytes). The result is the value
// to store in the packet's last 4 bytes, written little-endian (as Linux rxe does; Wireshark
// shows those 4 bytes as a big-endian number).
std::uint32_t icrc(const Ipv4Context& ip, std::span<const std::uint8_t> ib_packet) noexcept;

// ---- Encode -----------------------------------------------------------------------------------
// Writes the headers the opcode calls for into out[0..hdr_len); sets bth.pad from payload_len.
// Returns hdr_len. `out` must hold at least info(h.bth.opcode).hdr_len bytes. Returns 0 and
// writes nothing if the opcode is not in the table, `out` is too small, or payload_len is over
// kMaxPayload or non-zero on an opcode that carries no payload.
std::size_t encode_headers(Headers& h, std::size_t payload_len, std::span<std::uint8_t> out) noexcept;

// Finishes a packet laid out as [headers | payload | pad]: writes pad bytes (zero) and the
// ICRC. `pkt` must have room for pad + 4. Returns the total packet length (0 if pkt is too
// small or hdr_plus_payload does not cover a BTH).
std::size_t finish_packet(const Ipv4Context& ip, std::span<std::uint8_t> pkt, std::size_t hdr_plus_payload) noexcept;

// ---- Parse ------------------------------------------------------------------------------------
enum class ParseError : std::uint8_t {
  none = 0,
  too_short,
  bad_opcode,
  bad_version,
  bad_pad,
  bad_icrc,
  bad_length,  // e.g. payload on an opcode that carries none, or over 4096 bytes
};
std::string_view to_string(ParseError e) noexcept;

struct Packet {
  Headers hdr;
  std::span<const std::uint8_t> payload;  // without pad and ICRC
  std::uint32_t icrc = 0;
};

// Decodes an untrusted UDP payload. Checks sizes against the opcode table, TVer == 0, the pad,
// the payload limit and (if verify_icrc) the ICRC. Never reads outside `datagram`.
ParseError parse(std::span<const std::uint8_t> datagram, const Ipv4Context& ip, bool verify_icrc,
                 Packet& out) noexcept;

// A UDP datagram longer than one packet of its first packet's opcode can be on a QP with path
// MTU `pmtu` is a segmentation run carried whole (UDP_SEGMENT; see soft/engine.hpp, whose senders
// lead runs with a full path-MTU packet). Returns its segment size (that packet's headers + pmtu
// of payload + ICRC), or 0: a single packet (or too short, or an unknown opcode: parse decides).
std::size_t run_segment_size(std::span<const std::uint8_t> datagram, std::uint32_t pmtu) noexcept;

// ---- PSN arithmetic (24-bit, IBA 9.7.1) -------------------------------------------------------
constexpr std::uint32_t psn_add(std::uint32_t psn, std::uint32_t n) noexcept { return (psn + n) & kPsnMask; }
// Signed distance a - b in the 24-bit space, in [-2^23, 2^23).
constexpr std::int32_t psn_diff(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t d = (a - b) & kPsnMask;
  return d >= 0x800000u ? static_cast<std::int32_t>(d) - 0x1000000 : static_cast<std::int32_t>(d);
}
constexpr bool psn_lt(std::uint32_t a, std::uint32_t b) noexcept { return psn_diff(a, b) < 0; }
constexpr bool psn_le(std::uint32_t a, std::uint32_t b) noexcept { return psn_diff(a, b) <= 0; }

}  // namespace vrdma::nicdrv::soft::wire
