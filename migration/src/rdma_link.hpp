// The device state over RDMA (private to migration/): one RC QP between the source's and the
// destination's migration engines (vrdmad --migration-engine: a NIC or VF on the migration
// network, or the soft engine on a host address). The destination exposes a buffer; the source
// RDMA-WRITEs the state into it and says so over the TCP link, which carries every other frame.
// With a NIC the state moves without either host's CPU copying it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "vrdma/common/result.hpp"
#include "vrdma/migration/stream.hpp"
#include "vrdma/nicdrv/device.hpp"

namespace vrdma::migration {

class RdmaLink {
 public:
  // A QP on `engine`, not connected yet. `expose_bytes` > 0 (destination): a registered buffer
  // of that size the peer may write.
  static Result<std::unique_ptr<RdmaLink>> create(std::shared_ptr<nicdrv::Device> engine, std::uint64_t expose_bytes);
  ~RdmaLink();
  RdmaLink(const RdmaLink&) = delete;
  RdmaLink& operator=(const RdmaLink&) = delete;

  [[nodiscard]] const RdmaPeer& local() const noexcept { return local_; }
  // INIT -> RTR -> RTS towards the peer.
  Status connect(const RdmaPeer& peer);
  // Source: writes `blob` into the peer's buffer and waits (at most `timeout`) until the peer
  // acknowledged every byte (an RC write's completion: the data is placed).
  Status write(std::span<const std::uint8_t> blob, std::chrono::milliseconds timeout);
  // Destination: the first `bytes` of the exposed buffer (bytes <= its size, checked by the caller).
  [[nodiscard]] std::span<const std::uint8_t> received(std::uint64_t bytes) const;

 private:
  RdmaLink() = default;
  Status post_and_wait(std::span<const std::uint8_t> blob, std::chrono::milliseconds timeout);
  std::shared_ptr<nicdrv::Device> engine_;
  std::shared_ptr<nicdrv::ProtectionDomain> pd_;
  std::shared_ptr<nicdrv::CompletionQueue> cq_;
  std::shared_ptr<nicdrv::QueuePair> qp_;
  std::shared_ptr<nicdrv::Buffer> buf_;
  std::shared_ptr<nicdrv::MemoryRegion> mr_;
  RdmaPeer local_, peer_;
  nicdrv::Mtu mtu_ = nicdrv::Mtu::mtu1024;
  std::uint8_t sgid_index_ = 0;  // the GID of local_.gid (preferred_gid())
};

}  // namespace vrdma::migration
