// Connection setup (RDMA-CM semantics): an RC QP connected to a peer named by IPv4 address and
// port, the way librdmacm does it (RDMA_PS_TCP). One API for every provider:
//   soft   our own IB CM (IBA vol 1 ch. 12) over QP1 of the soft engine (MADs in RoCEv2 UD packets)
//   verbs  librdmacm on the kernel's CM (verbs.hpp)
//   pv     not supported (the virtio device has no CM yet)
//
// Flow (both sides open their device first and create their RC QP on it):
//   client: cm_resolve(dev, ip, port) -> CmConnection::connect(qp)   QP ends in RTS
//   server: cm_listen(dev, port) -> get_request() -> accept(qp)      QP ends in RTS
// Either side: disconnect() (DREQ/DREP); the peer's disconnect moves our QP to ERR, so posted
// work completes with wr_flush_err, which is how an application sees it.
//
// Ownership: connections and listeners are unique_ptrs owned by the caller; they keep their
// device alive. Destroying a connected CmConnection disconnects it. Errors: Result with a
// sentence; a peer's rejection is Errc::connection_lost naming the IBA reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/nicdrv/device.hpp"

namespace vrdma::nicdrv {

struct CmParams {
  std::uint8_t responder_resources = 1;  // incoming READ/atomic the local QP accepts at once
  std::uint8_t initiator_depth = 1;      // outgoing READ/atomic the local QP issues at once
  std::uint8_t retry_count = 7;
  std::uint8_t rnr_retry_count = 7;
  std::chrono::milliseconds timeout{5000};  // for each step (resolution, connection, request)
  // The following are honoured by the soft provider (the kernel's CM chooses its own on verbs).
  std::uint8_t local_ack_timeout = 17;      // QP ACK timeout, 4.096 us * 2^n (IBA 9.7.6.1.3)
  std::uint8_t cm_response_timeout = 18;    // CM MAD resend interval, 4.096 us * 2^n (IBA 12.7.26)
  std::uint8_t max_cm_retries = 15;         // resends of REQ/REP/DREQ before giving up (IBA 12.7.27)
  std::vector<std::uint8_t> private_data;   // after the RDMA-CM header in REQ/REP (up to 56/196 bytes)
};

class CmConnection {
 public:
  virtual ~CmConnection() = default;  // disconnects if connected
  // The device that owns the route ("verbs:<ibdev>", "soft:<ip>"): open it and create the PD,
  // CQs and the RC QP for this connection there, then call connect() or accept().
  [[nodiscard]] virtual const std::string& device_name() const noexcept = 0;
  // Client side (after cm_resolve): the QP must be an RC QP on device_name() in RESET (soft
  // also takes INIT, so receives can be posted before the connection exists). Returns once the
  // QP is in RTS and the peer has accepted.
  virtual Status connect(QueuePair& qp, const CmParams& params = {}) = 0;
  // Server side (a request from CmListener::get_request): same QP rules as connect().
  virtual Status accept(QueuePair& qp, const CmParams& params = {}) = 0;
  virtual Status reject() = 0;
  virtual Status disconnect() = 0;
};

class CmListener {
 public:
  virtual ~CmListener() = default;
  // Waits up to `timeout` for the next connection request.
  virtual Result<std::unique_ptr<CmConnection>> get_request(std::chrono::milliseconds timeout) = 0;
  [[nodiscard]] virtual std::uint16_t port() const noexcept = 0;
};

// Provider-neutral entry points on an open device: the request goes out from (or is taken on)
// that device's address. not_supported for providers without a connection manager.
Result<std::unique_ptr<CmConnection>> cm_resolve(const std::shared_ptr<Device>& dev, std::string_view dst_ip,
                                                 std::uint16_t port, const CmParams& params = {});
Result<std::unique_ptr<CmListener>> cm_listen(const std::shared_ptr<Device>& dev, std::uint16_t port, int backlog = 16);

// RDMA-CM service IDs (librdmacm's port spaces): 0x0000000001000000 | ps << 16 | port.
inline constexpr std::uint16_t kRdmaPsTcp = 0x0106;
constexpr std::uint64_t rdma_cm_service_id(std::uint16_t port_space, std::uint16_t port) noexcept {
  return 0x0000000001000000ull | (std::uint64_t{port_space} << 16) | port;
}

}  // namespace vrdma::nicdrv
