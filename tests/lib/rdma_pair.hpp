// Two connected RDMA endpoints over any nicdrv provider, for tests that move real data.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "vrdma/nicdrv/device.hpp"
#include "vrdma/nicdrv/registry.hpp"

namespace vrdma::nicdrv {
// Boost.Test prints these in failure messages.
inline std::ostream& operator<<(std::ostream& o, WcStatus s) { return o << to_string(s); }
inline std::ostream& operator<<(std::ostream& o, WcOpcode s) { return o << to_string(s); }
inline std::ostream& operator<<(std::ostream& o, QpState s) { return o << to_string(s); }
}  // namespace vrdma::nicdrv

namespace vrdma::test {

// A registered buffer from Device::alloc_buffer (so endpoints work over every provider, pv
// included), with the vector-like accessors tests use.
struct DeviceBuffer {
  std::shared_ptr<nicdrv::Buffer> mem;
  [[nodiscard]] std::uint8_t* data() const { return mem->data(); }
  [[nodiscard]] std::size_t size() const { return mem ? mem->size() : 0; }
  [[nodiscard]] std::uint8_t* begin() const { return data(); }
  [[nodiscard]] std::uint8_t* end() const { return data() + size(); }
  std::uint8_t& operator[](std::size_t i) const { return data()[i]; }
};

struct Endpoint {
  std::shared_ptr<nicdrv::Device> dev;
  std::shared_ptr<nicdrv::ProtectionDomain> pd;
  std::shared_ptr<nicdrv::CompletionQueue> cq;
  std::shared_ptr<nicdrv::QueuePair> qp;
  DeviceBuffer buf;
  std::shared_ptr<nicdrv::MemoryRegion> mr;  // declared after buf: deregistered before it is freed
  nicdrv::Gid gid;
};

struct PairOptions {
  nicdrv::QpType type = nicdrv::QpType::rc;
  nicdrv::Mtu mtu = nicdrv::Mtu::mtu1024;
  std::size_t buf_bytes = 1 << 20;
  std::uint32_t sq_depth = 256, rq_depth = 256, cq_depth = 4096;
  std::uint32_t max_sge = 4;
  std::uint8_t timeout = 14;  // ~67 ms local ACK timeout: robust on a loaded 2-core machine under ASan
  std::uint8_t retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 1;
  std::uint8_t rd_atomic = 16;
  std::uint32_t qkey = 0x11111111;
  nicdrv::Access access = nicdrv::Access::local_write | nicdrv::Access::remote_write |
                          nicdrv::Access::remote_read | nicdrv::Access::remote_atomic;
  std::uint32_t psn_a = 0x123456, psn_b = 0xfffff0;  // near the 24-bit wrap on purpose
  std::uint8_t gid_index = 0;  // the source GID (rxe: 1 is the RoCEv2 IPv4 GID)
};

// Opens PD/CQ/QP/MR on `dev`.
Result<Endpoint> make_endpoint(std::shared_ptr<nicdrv::Device> dev, const PairOptions& o);
// RESET -> INIT -> RTR -> RTS on both sides, pointing at each other.
Status connect(Endpoint& a, Endpoint& b, const PairOptions& o);

// What one side needs of a peer in another process (exchanged out of band).
struct PeerInfo {
  std::uint32_t qpn = 0;
  nicdrv::Gid gid{};
  std::uint32_t psn = 0;  // the peer's send PSN (our receive PSN)
};
// RESET -> INIT -> RTR -> RTS on one side, pointing at `peer`, sending from `my_psn`.
Status bring_up(nicdrv::QueuePair& qp, const PeerInfo& peer, std::uint32_t my_psn, const PairOptions& o);
Status connect_to(Endpoint& self, const PeerInfo& peer, std::uint32_t my_psn, const PairOptions& o);

// Polls until n completions arrive or the deadline passes; returns what arrived.
std::vector<nicdrv::WorkCompletion> wait_cq(nicdrv::CompletionQueue& cq, std::size_t n,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(20));

// One signaled RDMA WRITE of n patterned bytes (`seed`) from the start of a's buffer to the start
// of b's, waited for: an error saying what went wrong (refused, no completion within `timeout`, a
// failed completion, other bytes at the target) unless the data arrived.
Status write_checked(Endpoint& a, const Endpoint& b, std::size_t n, std::uint64_t seed,
                     std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Deterministic pattern for end-to-end data checks.
void fill_pattern(std::uint8_t* p, std::size_t n, std::uint64_t seed);
bool check_pattern(const std::uint8_t* p, std::size_t n, std::uint64_t seed);

}  // namespace vrdma::test
