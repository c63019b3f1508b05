// The re-creation record's bytes (vrdma/migration/rebuild_record.hpp); rebuild.cpp writes and
// reads them.
#include "vrdma/migration/rebuild_record.hpp"

#include <fmt/format.h>

#include "vrdma/common/bytes.hpp"
#include "vrdma/migration/peer_notice.hpp"
#include "vrdma/nicdrv/device.hpp"

namespace vrdma::migration {

namespace rebuild {
namespace {
constexpr std::uint32_t kRebuildMagic = 0x42525256;  // "VRRB"
// 1: without the notice fields; 2: the notice address an IPv4 u32; 3: 16 bytes (IPv6 too).
constexpr std::uint8_t kRebuildVersion = 3;
constexpr std::uint32_t kMaxRemoteRkeys = 65536;
}  // namespace

std::vector<std::uint8_t> encode(const Record& r) {
  ByteWriter w;
  w.put(kRebuildMagic, kRebuildVersion, r.state, r.type, r.path_mtu, r.qkey, r.rq_psn, r.sq_psn, r.dest_qp_num,
        r.access, r.pkey_index);
  for (auto v : {r.port, r.max_rd_atomic, r.max_dest_rd_atomic, r.min_rnr_timer, r.timeout, r.retry_cnt, r.rnr_retry}) w.put(v);
  w.put(r.dgid, r.sgid);
  for (auto v : {r.hop_limit, r.traffic_class, r.sl, r.local_peer}) w.put(v);
  w.put(r.flow_label, r.recv_outstanding, r.notice_token, r.notice_addr, r.notice_port, r.guest_dest_qpn,
        static_cast<std::uint32_t>(r.remote_rkeys.size()));
  for (const auto& [g, n] : r.remote_rkeys) {
    w.put(g, n);
  }
  return std::move(w.out);
}

Result<Record> decode(std::span<const std::uint8_t> b) {
  ByteReader rd(b);
  Record r;
  std::uint32_t magic = 0;
  std::uint8_t version = 0;
  auto bad = [](const std::string& what) { return make_error(Errc::invalid_argument, "re-creation record: " + what); };
  if (!rd.get(magic) || magic != kRebuildMagic) return bad("not a re-creation record (magic)");
  if (!rd.get(version) || version < 1 || version > kRebuildVersion)
    return bad(fmt::format("version {} (this vrdmad reads 1 to {})", version, kRebuildVersion));
  bool ok = rd.get(r.state, r.type, r.path_mtu, r.qkey, r.rq_psn, r.sq_psn, r.dest_qp_num, r.access, r.pkey_index);
  for (auto* v : {&r.port, &r.max_rd_atomic, &r.max_dest_rd_atomic, &r.min_rnr_timer, &r.timeout, &r.retry_cnt, &r.rnr_retry})
    ok = ok && rd.get(*v);
  ok = ok && rd.get(r.dgid, r.sgid);
  for (auto* v : {&r.hop_limit, &r.traffic_class, &r.sl, &r.local_peer}) ok = ok && rd.get(*v);
  ok = ok && rd.get(r.flow_label, r.recv_outstanding);
  if (version >= 2) {
    std::uint32_t nkeys = 0;
    ok = ok && rd.get(r.notice_token);
    if (version == 2) {
      std::uint32_t ip = 0;
      ok = ok && rd.get(ip);
      if (ip != 0) r.notice_addr = notice::ipv4_address(ip);
    } else {
      ok = ok && rd.get(r.notice_addr);
    }
    ok = ok && rd.get(r.notice_port, r.guest_dest_qpn, nkeys);
    if (ok && nkeys > kMaxRemoteRkeys) return bad(fmt::format("{} remote rkeys (at most {})", nkeys, kMaxRemoteRkeys));
    for (std::uint32_t i = 0; ok && i < nkeys; ++i) {
      std::pair<std::uint32_t, std::uint32_t> k;
      ok = rd.get(k.first, k.second);
      if (ok) r.remote_rkeys.push_back(k);
    }
  }
  if (!ok) return bad("truncated");
  if (!rd.at_end()) return bad("trailing bytes");
  if (r.state > static_cast<std::uint8_t>(nicdrv::QpState::err) || r.state == static_cast<std::uint8_t>(nicdrv::QpState::sqe))
    return bad(fmt::format("QP state {}", r.state));
  if (r.type != static_cast<std::uint8_t>(nicdrv::QpType::rc) && r.type != static_cast<std::uint8_t>(nicdrv::QpType::ud))
    return bad(fmt::format("QP type {}", r.type));
  if (r.path_mtu < 1 || r.path_mtu > 5) return bad(fmt::format("path MTU code {}", r.path_mtu));
  if ((r.rq_psn | r.sq_psn | r.dest_qp_num) >> 24 != 0 || (r.access & ~0xfu) != 0 || r.port == 0 || r.timeout > 31 ||
      r.retry_cnt > 7 || r.rnr_retry > 7 || r.min_rnr_timer > 31 || r.local_peer > 1 || r.flow_label >> 20 != 0 ||
      r.guest_dest_qpn >> 24 != 0 ||
      (r.notice_token != 0 && (!notice::notice_address(r.notice_addr) || r.notice_port == 0)))
    return bad("a PSN, QPN, access, port, timer, retry or notice value out of range");
  return r;
}

namespace {
constexpr std::uint32_t kSrqMagic = 0x53525256;  // "VRRS"
constexpr std::uint8_t kSrqVersion = 1;
}  // namespace

std::vector<std::uint8_t> encode_srq(const SrqRecord& r) {
  ByteWriter w;
  w.out.reserve(13 + r.receives.size() * (12 + 16 * std::size_t{r.max_sge}));  // (and GCC 12 sees the room)
  w.put(kSrqMagic, kSrqVersion, r.max_sge, static_cast<std::uint32_t>(r.receives.size()));
  for (const auto& x : r.receives) {
    w.put(x.wr_id, static_cast<std::uint32_t>(x.sges.size()));
    for (const auto& g : x.sges) w.put(g.addr, g.length, g.lkey);
  }
  return std::move(w.out);
}

Result<SrqRecord> decode_srq(std::span<const std::uint8_t> b) {
  ByteReader rd(b);
  SrqRecord r;
  std::uint32_t magic = 0, n = 0;
  std::uint8_t version = 0;
  auto bad = [](const std::string& what) { return make_error(Errc::invalid_argument, "SRQ record: " + what); };
  if (!rd.get(magic) || magic != kSrqMagic) return bad("not an SRQ record of a NIC (magic)");
  if (!rd.get(version) || version != kSrqVersion) return bad(fmt::format("version {} (this vrdmad reads {})", version, kSrqVersion));
  if (!rd.get(r.max_sge, n)) return bad("truncated");
  if (r.max_sge == 0 || r.max_sge > kSrqMaxSge) return bad(fmt::format("{} SGEs a receive (1 to {})", r.max_sge, kSrqMaxSge));
  if (n > kSrqMaxReceives) return bad(fmt::format("{} receives (at most {})", n, kSrqMaxReceives));
  for (std::uint32_t i = 0; i < n; ++i) {
    SrqReceive x;
    std::uint32_t nsge = 0;
    if (!rd.get(x.wr_id, nsge)) return bad("truncated");
    if (nsge > r.max_sge) return bad(fmt::format("receive {} has {} SGEs, the SRQ takes {}", i, nsge, r.max_sge));
    x.sges.resize(nsge);
    for (auto& g : x.sges)
      if (!rd.get(g.addr, g.length, g.lkey)) return bad("truncated");
    r.receives.push_back(std::move(x));
  }
  if (!rd.at_end()) return bad("trailing bytes");
  return r;
}

}  // namespace rebuild

}  // namespace vrdma::migration
