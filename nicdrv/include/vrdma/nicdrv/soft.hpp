// The soft provider: our userspace RoCEv2 engine (IBA vol 1 + Annex A17) over a UDP socket.
//
// Open it through the registry as "soft:<IPv4 or ifname>[?options]". Options:
//   busy_poll=1        the engine thread spins instead of sleeping in epoll (lowest latency)
//   port=N             UDP port to bind and send to (default 4791; tests only)
//   mtu=N              cap the port's active MTU (256..4096)
//   verify_icrc=0      accept packets without checking the ICRC (default: check)
//
// Tests can put a deterministic fault-injecting link between the engine and its socket.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/nicdrv/cm.hpp"
#include "vrdma/nicdrv/device.hpp"
#include "vrdma/nicdrv/registry.hpp"

namespace vrdma::nicdrv::soft {

// Seeded, deterministic faults applied to packets the engine transmits. Each probability is in
// parts per million; the same seed and traffic give the same decisions.
struct FaultConfig {
  std::uint64_t seed = 1;
  std::uint32_t drop_ppm = 0;
  std::uint32_t duplicate_ppm = 0;
  std::uint32_t reorder_ppm = 0;   // hold a packet back and send it after the next one
  std::uint32_t corrupt_ppm = 0;   // flip one byte (the receiver's ICRC check must catch it)
  // Drop every packet whose sequence number (count of packets sent so far, from 0) is listed.
  std::uint64_t drop_first_n = 0;  // drop the first N packets outright
  std::vector<std::uint64_t> drop_seq;  // and these (e.g. {1}: the second packet, a CM test's RTU)
};

struct EngineStats {
  std::uint64_t tx_packets = 0, rx_packets = 0;
  std::uint64_t tx_bytes = 0, rx_bytes = 0;
  // UDP segmentation runs sent (UDP_SEGMENT) and received whole (cut back into packets here).
  std::uint64_t tx_gso_runs = 0, rx_gso_runs = 0;
  std::uint64_t rx_dropped_icrc = 0, rx_dropped_malformed = 0, rx_dropped_no_qp = 0, rx_dropped_qkey = 0;
  std::uint64_t rx_dropped_pkey = 0;  // BTH P_Key not matching the device's partition (IBA 9.6.1.1)
  // UD datagrams that found no receive posted (UD has no RNR: IBA 9.6.3 drops them silently).
  std::uint64_t rx_dropped_no_recv = 0;
  // Packets whose payload is longer than their QP's path MTU (a peer configured with a larger
  // one), IBA's length error: an RC request is refused with a NAK (Invalid Request) and the QP
  // fails, an RC READ response fails its READ (bad response), a UD datagram is dropped silently.
  std::uint64_t rx_longer_than_mtu = 0;
  std::uint64_t retransmits = 0, timeouts = 0, rnr_naks_sent = 0, rnr_naks_received = 0;
  // READ requests sent again for responses that were lost, each for the lost packets only.
  std::uint64_t read_rereads = 0;
  // Resends from the oldest unacknowledged PSN after a few round trips without progress (a lost
  // tail), before the local ACK timeout.
  std::uint64_t tail_probes = 0;
  std::uint64_t seq_naks_sent = 0, seq_naks_received = 0, duplicates_received = 0;
  std::uint64_t acks_sent = 0;
  // Regions invalidated by a peer's SEND with Invalidate.
  std::uint64_t remote_invalidations = 0;
  // LOCAL_INV and REG_MR work requests executed (fast registration); refused ones complete in
  // error and are not counted.
  std::uint64_t local_invalidations = 0, fast_registrations = 0;
  std::uint64_t faults_dropped = 0, faults_duplicated = 0, faults_reordered = 0, faults_corrupted = 0;
  // QP1: CM MADs received, sent, dropped (malformed, not CM, unknown connection), resent.
  std::uint64_t cm_mads_received = 0, cm_mads_sent = 0, cm_mads_dropped = 0, cm_resends = 0;
};

// Opens a soft device (what the registry's "soft:" prefix calls).
Result<std::shared_ptr<Device>> open(std::string_view spec, const DeviceOptions& opts);

// Connection setup on a soft device: our IB CM on QP1 (see cm.hpp; what cm_resolve/cm_listen
// call for "soft:" devices). invalid_argument if `dev` is not a soft device.
Result<std::unique_ptr<CmConnection>> cm_resolve(const std::shared_ptr<Device>& dev, std::string_view dst_ip,
                                                 std::uint16_t port, const CmParams& params);
Result<std::unique_ptr<CmListener>> cm_listen(const std::shared_ptr<Device>& dev, std::uint16_t port, int backlog);

// Test and diagnostics hooks on a device opened by this provider (invalid_argument otherwise).
Status set_faults(Device& dev, const FaultConfig& cfg);
Result<EngineStats> stats(const Device& dev);

}  // namespace vrdma::nicdrv::soft
