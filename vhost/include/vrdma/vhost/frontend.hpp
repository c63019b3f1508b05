// The vhost-user frontend (driver/VMM side): what QEMU does for a VM, done for a container
// or process (libpvverbs) and for our tests. Synchronous: each call sends its messages and,
// when a request has a reply (or REPLY_ACK was negotiated), waits for it. Calls that send
// several messages (start_queues, get_vring_bases, requests) send them all before reading the
// replies: one round trip to a busy backend instead of one per message, which is what a
// migration's switchover waits on.
//
// Threading: one thread at a time. Owns the socket and every kick/call eventfd it creates.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/channel.hpp"
#include "vrdma/vhost/driver_queue.hpp"
#include "vrdma/vhost/features.hpp"
#include "vrdma/vhost/guest_ram.hpp"

namespace vrdma::vhost {

class Frontend {
 public:
  // Connects, retrying until timeout_ms (the backend may still be starting).
  static Result<Frontend> connect(const std::string& path, int timeout_ms = 5000);
  // Uses an already-connected socket (socketpair to a backend process).
  static Result<Frontend> adopt(UniqueFd sock);

  // GET_FEATURES / SET_FEATURES and, if offered, the protocol-feature handshake. Acks
  // want & offered; returns what was acked.
  Result<VirtioFeatures> negotiate(VirtioFeatures want, ProtocolFeatures pwant);
  Status set_features(VirtioFeatures f);  // e.g. to switch LOG_ALL on for migration
  [[nodiscard]] VirtioFeatures features() const { return features_; }
  [[nodiscard]] ProtocolFeatures protocol_features() const { return pfeatures_; }

  Status set_owner();
  Result<std::uint64_t> get_queue_num();
  Result<std::vector<std::uint8_t>> get_config(std::uint32_t offset, std::uint32_t size);
  // The whole table in one SET_MEM_TABLE, or region by region with ADD_MEM_REG.
  Status set_mem_table(const GuestRam& ram);
  Status add_mem_regions(const GuestRam& ram);
  // Dirty log: a memfd of `bytes`, mapped by the backend (SET_LOG_BASE).
  Status set_log_base(int memfd, std::uint64_t bytes);

  // NUM, BASE, ADDR, CALL, KICK (fresh eventfds), ENABLE.
  Status start_queue(std::uint16_t index, const DriverQueue& q, std::optional<std::uint32_t> base = std::nullopt);
  struct QueueStart {
    std::uint16_t index;
    const DriverQueue* queue;
    std::optional<std::uint32_t> base;  // none: the queue's initial base
  };
  // start_queue for several queues in one batch, in the order given.
  Status start_queues(std::span<const QueueStart> starts);
  // The stop protocol: returns the ring's base; the backend writes nothing more to the ring.
  Result<std::uint32_t> get_vring_base(std::uint16_t index);
  // GET_VRING_BASE for several rings in one batch, in the order given; their bases in that order.
  Result<std::vector<std::uint32_t>> get_vring_bases(std::span<const std::uint16_t> indices);
  Status kick(std::uint16_t index);
  // Waits for a call on index; false on timeout.
  Result<bool> wait_call(std::uint16_t index, int timeout_ms);
  [[nodiscard]] int call_fd(std::uint16_t index) const;

  // Inflight area for reconnect (GET_INFLIGHT_FD / SET_INFLIGHT_FD).
  struct Inflight {
    UniqueFd fd;
    InflightInfo info{};
  };
  Result<Inflight> get_inflight_fd(std::uint16_t num_queues, std::uint16_t queue_size);
  Status set_inflight_fd(const Inflight& inf);

  // Sends one request; waits for the reply when it has one (returned), or for the REPLY_ACK
  // ack when negotiated. A non-zero ack is an error.
  Result<std::optional<Message>> request(Message m);
  // Sends every request, then reads their replies in order (one per request that has one);
  // the first failure fails the batch, whose later requests the backend may still have applied.
  Result<std::vector<std::optional<Message>>> requests(std::vector<Message> ms);
  Channel& channel() { return chan_; }

 private:
  struct QueueFds {
    UniqueFd kick, call;
  };
  Status simple(Request r, std::uint64_t v);
  static Result<Message> vring_fd(Request r, std::uint16_t index, int fd);

  Channel chan_;
  VirtioFeatures features_;
  ProtocolFeatures pfeatures_;
  std::vector<QueueFds> queues_;
};

}  // namespace vrdma::vhost
