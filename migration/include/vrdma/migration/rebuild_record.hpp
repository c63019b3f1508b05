// The record a source writes for each QP it stopped on a NIC (rebuild.cpp): what the
// destination needs to create the QP anew and take it to the same state with the same PSNs.
// It arrives inside a device state from the frontend, so decode() checks every field
// (tests/fuzz/migration/rebuild_record_fuzzer.cpp). Internal to migration/, published for its
// test and fuzzer, as peer_notice.hpp is.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "vrdma/common/result.hpp"

namespace vrdma::migration::rebuild {

struct Record {
  std::uint8_t state = 0;  // QpState before the stop (SQD: RTS)
  std::uint8_t type = 0;
  std::uint8_t path_mtu = 0;
  std::uint32_t qkey = 0, rq_psn = 0, sq_psn = 0, dest_qp_num = 0;  // dest as the guest named it
  std::uint32_t access = 0;
  std::uint16_t pkey_index = 0;
  std::uint8_t port = 1, max_rd_atomic = 0, max_dest_rd_atomic = 0, min_rnr_timer = 0, timeout = 0, retry_cnt = 0,
               rnr_retry = 0;
  std::array<std::uint8_t, 16> dgid{}, sgid{};
  std::uint8_t hop_limit = 0, traffic_class = 0, sl = 0, local_peer = 0;
  std::uint32_t flow_label = 0;
  std::uint32_t recv_outstanding = 0;  // receives the NIC held at the stop, posted again after
  // Version 2: the peer backend paused for this QP (peer_notice.hpp), re-pointed once the QP
  // exists again; token 0: none. guest_dest_qpn: the peer's QPN as the guest knows it (a
  // re-pointed peer has another on the wire); 0: the wire's.
  std::uint64_t notice_token = 0;
  std::array<std::uint8_t, 16> notice_addr{};  // as a GID holds it (version 2: IPv4 only)
  std::uint16_t notice_port = 0;
  std::uint32_t guest_dest_qpn = 0;
  // As the peer of a guest that moved onto a NIC: its rkeys as that guest knows them -> the
  // NIC's, applied to this QP's RDMA and atomic work requests (peer.cpp).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> remote_rkeys;
  bool operator==(const Record&) const = default;
};

std::vector<std::uint8_t> encode(const Record& r);
Result<Record> decode(std::span<const std::uint8_t> b);

// The record of an SRQ on a NIC: the receives the device handed to the NIC's SRQ and saw no
// completion for, oldest first, as the guest wrote them (its wr_id; its SGEs, with the guest's
// keys). A NIC cannot give back what was posted to an SRQ, and the guest may reuse a slot of the
// SRQ's ring once the device took it, so the device keeps these itself (vrdma/device/model.hpp
// SrqObj::held); the destination posts them again, before what the ring holds.
struct SrqSge {
  std::uint64_t addr = 0;
  std::uint32_t length = 0, lkey = 0;
  bool operator==(const SrqSge&) const = default;
};
struct SrqReceive {
  std::uint64_t wr_id = 0;
  std::vector<SrqSge> sges;
  bool operator==(const SrqReceive&) const = default;
};
struct SrqRecord {
  std::uint32_t max_sge = 0;  // the SRQ's: each receive has at most this many SGEs
  std::vector<SrqReceive> receives;
  bool operator==(const SrqRecord&) const = default;
};
// At most this many SGEs a receive (the device contract's limit of a receive WQE).
inline constexpr std::uint32_t kSrqMaxSge = 16;
// At most this many receives (an SRQ's ring is at most this deep).
inline constexpr std::uint32_t kSrqMaxReceives = 1u << 16;

std::vector<std::uint8_t> encode_srq(const SrqRecord& r);
Result<SrqRecord> decode_srq(std::span<const std::uint8_t> b);

}  // namespace vrdma::migration::rebuild
