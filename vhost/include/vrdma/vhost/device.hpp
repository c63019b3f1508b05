// The narrow interface between the vhost-user backend and a device model (STYLE.md: the
// protocol library owns the protocol; a device says which queues, features and config it has
// and handles queue events; it never sees a vhost-user message).
//
// Threads: every Device call is made on the backend's event-loop thread, one at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/vhost/features.hpp"
#include "vrdma/vhost/guest_memory.hpp"
#include "vrdma/vhost/virtqueue.hpp"

namespace vrdma::vhost {

// A device's handle on one running virtqueue, valid for the duration of one callback.
class Queue {
 public:
  Queue(std::uint16_t index, Ring& ring, GuestView view) : index_(index), ring_(ring), view_(std::move(view)) {}

  // Next available request; nullopt when the ring is empty or broken.
  std::optional<DescChain> pop();
  // Returns the request to the driver with `written` bytes of device-written data.
  Status push(const DescChain& c, std::uint32_t written);
  // Guest memory for reading requests and writing replies (dirty-logged when logging is on).
  [[nodiscard]] const GuestView& memory() const { return view_; }
  [[nodiscard]] std::uint16_t index() const { return index_; }
  [[nodiscard]] std::uint32_t pushed() const { return pushed_; }

 private:
  std::uint16_t index_;
  Ring& ring_;
  GuestView view_;
  std::uint32_t pushed_ = 0;
};

struct DeviceInfo {
  std::uint16_t num_queues = 1;
  std::uint16_t max_queue_size = 1024;
  VirtioFeatures features;  // device-specific bits; ring and transport bits are added by the backend
  // What a GET_CONFIG at offset 0 reading fewer bytes than config() holds gets instead of
  // config() (empty: config() as usual). A device riding another device type's frontend (QEMU's
  // vhost-user-blk reads only a blk-sized config) describes itself in that smaller window.
  std::vector<std::uint8_t> compact_config;
};

// What the backend offers a device outside its queue callbacks (loop thread only): the
// current guest memory and a way to run a queue now (after an event of the device's own, such
// as a completion from its engine).
class DeviceHost {
 public:
  virtual ~DeviceHost() = default;
  // Guest memory as it is now, dirty-logged when logging is on.
  [[nodiscard]] virtual GuestView memory() const = 0;
  // Runs queue_ready() for `index` now if the queue is running, then notifies the driver if
  // anything was pushed and it wants an interrupt. No-op for a stopped queue.
  virtual void run_queue(std::uint16_t index) = 0;
  // Is the queue running (started and enabled)?
  [[nodiscard]] virtual bool queue_running(std::uint16_t index) const = 0;
  // Kicks for the queue wanted or not (Ring::set_notification): a device that polls a ring
  // turns them off; turning them back on runs the queue once (a buffer may have come without
  // a kick). A queue that is not running ignores it; a ring started later begins with them on.
  virtual void set_queue_notification(std::uint16_t /*index*/, bool /*on*/) {}
  // The chain the driver made available last before the ring's current position: a buffer a
  // device keeps across a migration without returning it (the frontend moves the ring position
  // with the guest, so on a destination it is in flight from before). Split rings only: the head
  // at avail.ring[(base - 1) mod size], walked with every check a pop makes. Errors: the ring is
  // not set up, packed, at position 0, or the chain is bad.
  [[nodiscard]] virtual Result<DescChain> last_avail_chain(std::uint16_t index) const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // A frontend session began (host non-null) or ended (nullptr).
  virtual void attach(DeviceHost* /*host*/) {}
  // The memory table, the dirty log or LOG_ALL changed: memory() now returns a new view.
  virtual void memory_changed() {}
  [[nodiscard]] virtual DeviceInfo info() const = 0;
  // Config space (virtio §4.1.4.3 device-specific configuration), read by GET_CONFIG.
  [[nodiscard]] virtual std::vector<std::uint8_t> config() const { return {}; }
  virtual Status write_config(std::uint32_t /*offset*/, std::span<const std::uint8_t> /*data*/) {
    return make_error(Errc::not_supported, "device config space is read-only");
  }
  virtual void features_acked(VirtioFeatures /*acked*/) {}
  // The queue was kicked (or just started): handle what is available. The backend notifies the
  // driver afterwards if anything was pushed and the driver wants an interrupt.
  virtual void queue_ready(Queue& q) = 0;
  // GET_VRING_BASE: when this returns the device must hold no reference into the queue and
  // write nothing more for it (finish or drop in-flight requests first).
  virtual void queue_stopped(std::uint16_t /*index*/) {}
  virtual void reset() {}
  // Device state for VHOST_USER_PROTOCOL_F_DEVICE_STATE (migration through QEMU's stream).
  virtual Result<std::vector<std::uint8_t>> save_state() { return std::vector<std::uint8_t>{}; }
  virtual Status load_state(std::span<const std::uint8_t> /*blob*/) { return {}; }
};

}  // namespace vrdma::vhost
