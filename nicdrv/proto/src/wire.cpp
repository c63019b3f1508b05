// RoCEv2 wire format: opcode table, header encode/parse, ICRC (see wire.hpp).
#include "vrdma/nicdrv/proto/wire.hpp"

#include <algorithm>
#include <cstring>

#include <isa-l/crc.h>

namespace vrdma::nicdrv::soft::wire {
namespace {

// ---- Big-endian fields at explicit byte offsets (IBA 9.2: all fields are big-endian) ---------
void put16(std::uint8_t* p, std::uint16_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
void put24(std::uint8_t* p, std::uint32_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v >> 16);
  p[1] = static_cast<std::uint8_t>(v >> 8);
  p[2] = static_cast<std::uint8_t>(v);
}
void put32(std::uint8_t* p, std::uint32_t v) noexcept {
  put16(p, static_cast<std::uint16_t>(v >> 16));
  put16(p + 2, static_cast<std::uint16_t>(v));
}
void put64(std::uint8_t* p, std::uint64_t v) noexcept {
  put32(p, static_cast<std::uint32_t>(v >> 32));
  put32(p + 4, static_cast<std::uint32_t>(v));
}
std::uint16_t get16(const std::uint8_t* p) noexcept { return static_cast<std::uint16_t>((p[0] << 8) | p[1]); }
std::uint32_t get24(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 16) | (std::uint32_t{p[1]} << 8) | p[2];
}
std::uint32_t get32(const std::uint8_t* p) noexcept { return (std::uint32_t{get16(p)} << 16) | get16(p + 2); }
std::uint64_t get64(const std::uint8_t* p) noexcept { return (std::uint64_t{get32(p)} << 32) | get32(p + 4); }

// ---- Extended headers, in wire order (IBA 9.2 figure 123 / rxe_opcode.c offsets) ----------------
// BTH, [RDETH,] DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH. Encode, parse and the
// header lengths in the opcode table all walk this one list.
struct ExtHeader {
  HdrFlag flag;
  std::size_t len;
  void (*put)(const Headers&, std::uint8_t*) noexcept;
  void (*get)(Headers&, const std::uint8_t*) noexcept;
};

// DETH (9.3.3): Q_Key(4) reserved(1) SrcQP(3).
void put_deth(const Headers& h, std::uint8_t* p) noexcept {
  put32(p, h.deth.qkey);
  p[4] = 0;
  put24(p + 5, h.deth.src_qp & kQpnMask);
}
void get_deth(Headers& h, const std::uint8_t* p) noexcept { h.deth = Deth{get32(p), get24(p + 5)}; }

// RETH (9.3.4): VA(8) R_Key(4) DMA length(4).
void put_reth(const Headers& h, std::uint8_t* p) noexcept {
  put64(p, h.reth.va);
  put32(p + 8, h.reth.rkey);
  put32(p + 12, h.reth.dma_len);
}
void get_reth(Headers& h, const std::uint8_t* p) noexcept { h.reth = Reth{get64(p), get32(p + 8), get32(p + 12)}; }

// AtomicETH (9.3.5): VA(8) R_Key(4) Swap/Add data(8) Compare data(8).
void put_atomic(const Headers& h, std::uint8_t* p) noexcept {
  put64(p, h.atomic.va);
  put32(p + 8, h.atomic.rkey);
  put64(p + 12, h.atomic.swap_add);
  put64(p + 20, h.atomic.compare);
}
void get_atomic(Headers& h, const std::uint8_t* p) noexcept {
  h.atomic = AtomicEth{get64(p), get32(p + 8), get64(p + 12), get64(p + 20)};
}

// AETH (9.3.6): Syndrome(1) MSN(3).
void put_aeth(const Headers& h, std::uint8_t* p) noexcept {
  p[0] = h.aeth.syndrome;
  put24(p + 1, h.aeth.msn & 0xffffff);
}
void get_aeth(Headers& h, const std::uint8_t* p) noexcept { h.aeth = Aeth{p[0], get24(p + 1)}; }

// AtomicAckETH (9.5.3): original remote data(8).
void put_atomic_ack(const Headers& h, std::uint8_t* p) noexcept { put64(p, h.atomic_ack); }
void get_atomic_ack(Headers& h, const std::uint8_t* p) noexcept { h.atomic_ack = get64(p); }

// ImmDt (9.3.7): 4 bytes, carried as-is; we keep the big-endian wire value in host order.
void put_imm(const Headers& h, std::uint8_t* p) noexcept { put32(p, h.imm); }
void get_imm(Headers& h, const std::uint8_t* p) noexcept { h.imm = get32(p); }

// IETH (9.3.8): the R_Key to invalidate, 4 bytes.
void put_ieth(const Headers& h, std::uint8_t* p) noexcept { put32(p, h.ieth); }
void get_ieth(Headers& h, const std::uint8_t* p) noexcept { h.ieth = get32(p); }

constexpr std::array<ExtHeader, 7> kExtHeaders{{
    {kHasDeth, kDethLen, put_deth, get_deth},
    {kHasReth, kRethLen, put_reth, get_reth},
    {kHasAtomicEth, kAtomicEthLen, put_atomic, get_atomic},
    {kHasAeth, kAethLen, put_aeth, get_aeth},
    {kHasAtomicAckEth, kAtomicAckEthLen, put_atomic_ack, get_atomic_ack},
    {kHasImm, kImmLen, put_imm, get_imm},
    {kHasIeth, kIethLen, put_ieth, get_ieth},
}};

// ---- Opcode table (IBA 9.2.1 table 38; flags as in rxe_opcode.c) --------------------------------
template <typename... F>
constexpr std::uint16_t fl(F... f) noexcept {
  return static_cast<std::uint16_t>((0u | ... | static_cast<unsigned>(f)));
}

constexpr std::uint8_t hdr_len_for(std::uint16_t flags) noexcept {
  std::size_t n = kBthLen;
  for (const ExtHeader& e : kExtHeaders) {
    if (flags & e.flag) n += e.len;
  }
  return static_cast<std::uint8_t>(n);
}

struct Row {
  Opcode op;
  std::string_view name;
  std::uint16_t flags;
};

constexpr std::uint16_t kSend = fl(kIsRequest, kIsSend, kHasPayload);
constexpr std::uint16_t kWrite = fl(kIsRequest, kIsWrite, kHasPayload);
constexpr std::uint16_t kReadResp = fl(kIsRead, kHasPayload);
constexpr std::uint16_t kOnly = fl(kIsFirst, kIsLast);

// Names exactly as Wireshark's infiniband dissector prints them in the Info column.
constexpr Row kRows[] = {
    {Opcode::rc_send_first, "RC Send First", fl(kSend, kIsFirst)},
    {Opcode::rc_send_middle, "RC Send Middle", kSend},
    {Opcode::rc_send_last, "RC Send Last", fl(kSend, kIsLast)},
    {Opcode::rc_send_last_imm, "RC Send Last Immediate", fl(kSend, kIsLast, kHasImm)},
    {Opcode::rc_send_only, "RC Send Only", fl(kSend, kOnly)},
    {Opcode::rc_send_only_imm, "RC Send Only Immediate", fl(kSend, kOnly, kHasImm)},
    {Opcode::rc_write_first, "RC RDMA Write First", fl(kWrite, kIsFirst, kHasReth)},
    {Opcode::rc_write_middle, "RC RDMA Write Middle", kWrite},
    {Opcode::rc_write_last, "RC RDMA Write Last", fl(kWrite, kIsLast)},
    {Opcode::rc_write_last_imm, "RC RDMA Write Last Immediate", fl(kWrite, kIsLast, kHasImm)},
    {Opcode::rc_write_only, "RC RDMA Write Only", fl(kWrite, kOnly, kHasReth)},
    {Opcode::rc_write_only_imm, "RC RDMA Write Only Immediate", fl(kWrite, kOnly, kHasReth, kHasImm)},
    {Opcode::rc_read_request, "RC RDMA Read Request", fl(kIsRequest, kIsRead, kOnly, kHasReth)},
    {Opcode::rc_read_response_first, "RC RDMA Read Response First", fl(kReadResp, kIsFirst, kHasAeth)},
    {Opcode::rc_read_response_middle, "RC RDMA Read Response Middle", kReadResp},
    {Opcode::rc_read_response_last, "RC RDMA Read Response Last", fl(kReadResp, kIsLast, kHasAeth)},
    {Opcode::rc_read_response_only, "RC RDMA Read Response Only", fl(kReadResp, kOnly, kHasAeth)},
    {Opcode::rc_acknowledge, "RC Acknowledge", fl(kOnly, kHasAeth)},
    {Opcode::rc_atomic_acknowledge, "RC Atomic Acknowledge", fl(kIsAtomic, kOnly, kHasAeth, kHasAtomicAckEth)},
    {Opcode::rc_compare_swap, "RC Compare Swap", fl(kIsRequest, kIsAtomic, kOnly, kHasAtomicEth)},
    {Opcode::rc_fetch_add, "RC Fetch Add", fl(kIsRequest, kIsAtomic, kOnly, kHasAtomicEth)},
    {Opcode::rc_send_last_inv, "RC Send Last Invalidate", fl(kSend, kIsLast, kHasIeth)},
    {Opcode::rc_send_only_inv, "RC Send Only Invalidate", fl(kSend, kOnly, kHasIeth)},
    {Opcode::ud_send_only, "UD Send Only", fl(kSend, kOnly, kHasDeth)},
    {Opcode::ud_send_only_imm, "UD Send Only Immediate", fl(kSend, kOnly, kHasDeth, kHasImm)},
};

constexpr std::array<OpcodeInfo, 256> make_table() noexcept {
  std::array<OpcodeInfo, 256> t{};
  for (const Row& r : kRows) {
    t[static_cast<std::uint8_t>(r.op)] = OpcodeInfo{r.name, r.flags, hdr_len_for(r.flags), true};
  }
  return t;
}
constexpr std::array<OpcodeInfo, 256> kTable = make_table();

constexpr std::size_t hl(Opcode op) noexcept { return kTable[static_cast<std::uint8_t>(op)].hdr_len; }
static_assert(std::size(kRows) == 25, "RC (23) + UD (2) opcodes");
static_assert(hl(Opcode::rc_send_middle) == kBthLen);
static_assert(hl(Opcode::rc_send_only_imm) == kBthLen + kImmLen);
static_assert(hl(Opcode::rc_write_first) == kBthLen + kRethLen);
static_assert(hl(Opcode::rc_write_only_imm) == kBthLen + kRethLen + kImmLen);
static_assert(hl(Opcode::rc_read_request) == kBthLen + kRethLen);
static_assert(hl(Opcode::rc_read_response_middle) == kBthLen);
static_assert(hl(Opcode::rc_read_response_only) == kBthLen + kAethLen);
static_assert(hl(Opcode::rc_atomic_acknowledge) == kBthLen + kAethLen + kAtomicAckEthLen);
static_assert(hl(Opcode::rc_compare_swap) == kBthLen + kAtomicEthLen);
static_assert(hl(Opcode::ud_send_only_imm) == kBthLen + kDethLen + kImmLen);
static_assert(hl(Opcode::rc_send_only_inv) == kBthLen + kIethLen);
static_assert(!kTable[0x15].valid && !kTable[0x63].valid && !kTable[0x66].valid);

// ---- BTH (IBA 9.2, figure 124) ---------------------------------------------------------------
// byte0 OpCode; byte1 SE(7) M(6) PadCnt(5:4) TVer(3:0); bytes2-3 P_Key; byte4 FECN(7) BECN(6)
// resv6; bytes5-7 DestQP; byte8 AckReq(7) resv7; bytes9-11 PSN.
constexpr std::uint8_t kSe = 0x80, kMig = 0x40, kFecn = 0x80, kBecn = 0x40, kAckReq = 0x80;

void put_bth(const Bth& b, std::uint8_t* p) noexcept {
  p[0] = static_cast<std::uint8_t>(b.opcode);
  p[1] = static_cast<std::uint8_t>((b.solicited ? kSe : 0u) | (b.mig_req ? kMig : 0u) | ((b.pad & 3u) << 4) |
                                   (b.tver & 0xfu));
  put16(p + 2, b.pkey);
  p[4] = static_cast<std::uint8_t>((b.fecn ? kFecn : 0u) | (b.becn ? kBecn : 0u));
  put24(p + 5, b.dest_qp & kQpnMask);
  p[8] = b.ack_req ? kAckReq : 0;
  put24(p + 9, b.psn & kPsnMask);
}

Bth get_bth(const std::uint8_t* p) noexcept {
  Bth b;
  b.opcode = static_cast<Opcode>(p[0]);
  b.solicited = (p[1] & kSe) != 0;
  b.mig_req = (p[1] & kMig) != 0;
  b.pad = static_cast<std::uint8_t>((p[1] >> 4) & 3u);
  b.tver = static_cast<std::uint8_t>(p[1] & 0xfu);
  b.pkey = get16(p + 2);
  b.fecn = (p[4] & kFecn) != 0;
  b.becn = (p[4] & kBecn) != 0;
  b.dest_qp = get24(p + 5);
  b.ack_req = (p[8] & kAckReq) != 0;
  b.psn = get24(p + 9);
  return b;
}

}  // namespace

const std::array<OpcodeInfo, 256>& opcode_table() noexcept { return kTable; }

// ---- ICRC (Annex A17.3.3; Linux rxe_icrc.c) ---------------------------------------------------
// CRC-32 (the Ethernet/zlib polynomial) over 8 bytes of ones for the absent LRH, the IPv4 header
// with TOS, TTL and checksum set to ones, the UDP header with its checksum set to ones, the BTH
// with FECN/BECN/resv6 set to ones, and the rest of the packet through the pad. ISA-L's
// crc32_gzip_refl is zlib's crc32 (reflected, inverted in and out) computed with PCLMULQDQ, about
// twenty times fewer instructions per byte than zlib's tables; it already does the initial and
// final inversion that rxe does by hand (its 0xdebb20e3 start is the CRC state after the 8 LRH
// bytes), so chaining calls gives the value rxe stores.
std::uint32_t icrc(const Ipv4Context& ip, std::span<const std::uint8_t> ib_packet) noexcept {
  constexpr std::size_t kLrh = 8, kIp = 20, kUdp = 8;
  std::array<std::uint8_t, kLrh + kIp + kUdp + kBthLen> ph;
  ph.fill(0xff);
  // UDP payload = the IB packet plus its ICRC. Lengths wrap for spans too big for a datagram.
  const std::size_t udp_len = kUdp + ib_packet.size() + kIcrcLen;
  std::uint8_t* iph = ph.data() + kLrh;
  iph[0] = 0x45;  // version 4, IHL 5; iph[1] TOS stays 0xff
  put16(iph + 2, static_cast<std::uint16_t>(kIp + udp_len));
  put16(iph + 4, ip.ip_id);
  put16(iph + 6, ip.dont_fragment ? 0x4000 : 0);  // flags DF, fragment offset 0
  // iph[8] TTL stays 0xff
  iph[9] = 17;  // UDP; iph[10..11] checksum stays 0xffff
  std::memcpy(iph + 12, &ip.src_be, 4);
  std::memcpy(iph + 16, &ip.dst_be, 4);
  std::uint8_t* udph = iph + kIp;
  put16(udph, ip.udp_src_port);
  put16(udph + 2, ip.udp_dst_port);
  put16(udph + 4, static_cast<std::uint16_t>(udp_len));
  // udph[6..7] checksum stays 0xffff
  const std::size_t bth_bytes = std::min(ib_packet.size(), kBthLen);
  std::uint8_t* bth = udph + kUdp;
  std::copy_n(ib_packet.data(), bth_bytes, bth);
  if (bth_bytes > 4) bth[4] = 0xff;  // FECN, BECN, resv6 are variant

  std::uint32_t crc = crc32_gzip_refl(0, ph.data(), kLrh + kIp + kUdp + bth_bytes);
  if (ib_packet.size() > kBthLen) crc = crc32_gzip_refl(crc, ib_packet.data() + kBthLen, ib_packet.size() - kBthLen);
  return crc;
}

// ---- Encode -------------------------------------------------------------------------------------
std::size_t encode_headers(Headers& h, std::size_t payload_len, std::span<std::uint8_t> out) noexcept {
  const OpcodeInfo& oi = kTable[static_cast<std::uint8_t>(h.bth.opcode)];
  if (!oi.valid || out.size() < oi.hdr_len || payload_len > kMaxPayload) return 0;
  if (!(oi.flags & kHasPayload) && payload_len != 0) return 0;
  h.bth.pad = pad_for(payload_len);
  std::uint8_t* p = out.data();
  put_bth(h.bth, p);
  std::size_t off = kBthLen;
  for (const ExtHeader& e : kExtHeaders) {
    if (!(oi.flags & e.flag)) continue;
    e.put(h, p + off);
    off += e.len;
  }
  return off;
}

std::size_t finish_packet(const Ipv4Context& ip, std::span<std::uint8_t> pkt, std::size_t hdr_plus_payload) noexcept {
  if (hdr_plus_payload < kBthLen || hdr_plus_payload > pkt.size()) return 0;
  const std::size_t pad = (pkt[1] >> 4) & 3u;  // PadCnt as encode_headers wrote it
  const std::size_t total = hdr_plus_payload + pad + kIcrcLen;
  if (pkt.size() < total) return 0;
  std::fill_n(pkt.data() + hdr_plus_payload, pad, std::uint8_t{0});
  const std::uint32_t c = icrc(ip, pkt.first(hdr_plus_payload + pad));
  // Stored least significant byte first, as rxe's `*icrcp = ~crc` does on a little-endian host.
  std::uint8_t* q = pkt.data() + hdr_plus_payload + pad;
  for (int i = 0; i < 4; ++i) q[i] = static_cast<std::uint8_t>(c >> (8 * i));
  return total;
}

// ---- Parse --------------------------------------------------------------------------------------
std::string_view to_string(ParseError e) noexcept {
  switch (e) {
    case ParseError::none: return "none";
    case ParseError::too_short: return "too_short";
    case ParseError::bad_opcode: return "bad_opcode";
    case ParseError::bad_version: return "bad_version";
    case ParseError::bad_pad: return "bad_pad";
    case ParseError::bad_icrc: return "bad_icrc";
    case ParseError::bad_length: return "bad_length";
  }
  return "unknown";
}

std::size_t run_segment_size(std::span<const std::uint8_t> datagram, std::uint32_t pmtu) noexcept {
  if (datagram.size() < kBthLen + kIcrcLen) return 0;
  const OpcodeInfo& oi = kTable[datagram[0]];
  if (!oi.valid) return 0;
  const std::size_t one = oi.hdr_len + ((oi.flags & kHasPayload) != 0 ? std::size_t{pmtu} : 0) + kIcrcLen;
  return datagram.size() > one + 3 ? one : 0;  // +3: the most pad one packet can carry
}

ParseError parse(std::span<const std::uint8_t> datagram, const Ipv4Context& ip, bool verify_icrc,
                 Packet& out) noexcept {
  const std::size_t n = datagram.size();
  if (n < kBthLen) return ParseError::too_short;
  const std::uint8_t* p = datagram.data();
  const OpcodeInfo& oi = kTable[p[0]];
  if (!oi.valid) return ParseError::bad_opcode;
  Headers h;
  h.bth = get_bth(p);
  if (h.bth.tver != 0) return ParseError::bad_version;  // 9.2.1: TVer 0 only
  const bool has_payload = (oi.flags & kHasPayload) != 0;
  if (!has_payload && h.bth.pad != 0) return ParseError::bad_pad;
  const std::size_t fixed = oi.hdr_len + std::size_t{h.bth.pad} + kIcrcLen;  // at most 40 + 3 + 4
  if (n < fixed) return ParseError::too_short;
  const std::size_t payload_len = n - fixed;
  if (((payload_len + h.bth.pad) & 3u) != 0) return ParseError::bad_pad;  // 9.2: payload + pad is whole words
  if (!has_payload && payload_len != 0) return ParseError::bad_length;
  if (payload_len > kMaxPayload) return ParseError::bad_length;

  std::uint32_t rx_icrc = 0;
  for (int i = 0; i < 4; ++i) rx_icrc |= std::uint32_t{p[n - kIcrcLen + static_cast<std::size_t>(i)]} << (8 * i);
  if (verify_icrc && icrc(ip, datagram.first(n - kIcrcLen)) != rx_icrc) return ParseError::bad_icrc;

  std::size_t off = kBthLen;
  for (const ExtHeader& e : kExtHeaders) {
    if (!(oi.flags & e.flag)) continue;
    e.get(h, p + off);
    off += e.len;
  }
  out.hdr = h;
  out.payload = datagram.subspan(off, payload_len);
  out.icrc = rx_icrc;
  return ParseError::none;
}

}  // namespace vrdma::nicdrv::soft::wire
