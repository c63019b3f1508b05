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

}  // namespace vrdma::migration::rebuild
