// The virtio RDMA device model (vrdmad's heart): a vhost::Device that serves the contract in
// virtio_rdma.hpp (docs/virtio-rdma.md) on top of one nicdrv engine device.
//
// Threads: every call runs on the backend's event-loop thread (the vhost::Device rule), and so
// do the device's own callbacks (engine CQ event fds, the retry timer), which it registers on
// the same loop. The only code that runs elsewhere is the write observer of each memory region,
// called by the soft engine's thread for every byte it writes into guest memory: it marks the
// dirty log (atomically) and touches nothing else.
//
// Trust: the guest (or the libpvverbs process acting as one) is untrusted. Every handle, key,
// index, length and guest address in a command, doorbell or work request is checked; a bad one
// gets an error status (or an error completion for a work request) and one log sentence, never
// a crash and never an access outside guest memory. Per-guest limits bound what a guest can make
// the host allocate.
//
// Zero copy: memory regions are registered with the engine in place over the guest's own pages
// (mapped a second time, contiguously, from the guest memory fds when the pages are scattered);
// the engine moves payload straight between guest memory and the wire or NIC.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "vrdma/common/result.hpp"
#include "vrdma/nicdrv/device.hpp"
#include "vrdma/vhost/device.hpp"
#include "vrdma/vhost/event_loop.hpp"

namespace vrdma::device {

struct RdmaLimits {
  std::uint32_t max_pd = 1024;
  std::uint32_t max_mr = 65536;
  std::uint32_t max_cq = 16384;
  std::uint32_t max_qp = 16384;
  std::uint32_t max_ah = 16384;
  std::uint32_t max_srq = 1024;
  std::uint32_t max_qp_wr = 4096;
  std::uint32_t max_cqe = 65536;
  std::uint32_t max_sge = 16;
  std::uint32_t max_inline = 256;
  std::uint32_t max_mr_pages = 1u << 20;              // pages in one registration
  std::uint64_t max_registered_bytes = 16ull << 30;   // all MRs of the guest together
};

struct RdmaDeviceOptions {
  RdmaLimits limits;
  std::uint8_t mac[6] = {0x52, 0x54, 0x00, 0x00, 0x00, 0x01};
};

// Counters for the control socket and tests (loop thread).
struct RdmaDeviceStats {
  std::uint64_t commands = 0, command_errors = 0;
  std::uint64_t doorbells = 0, doorbell_errors = 0;
  std::uint64_t ring_doorbells = 0;  // of `doorbells`, those a process wrote into a doorbell ring
  std::uint64_t send_wqes = 0, recv_wqes = 0, wqe_errors = 0;
  std::uint64_t cqes = 0, cq_overruns = 0;
  std::uint64_t events = 0, events_dropped = 0;
  std::uint32_t pds = 0, mrs = 0, cqs = 0, qps = 0, ahs = 0, srqs = 0, db_rings = 0;
  std::uint64_t registered_bytes = 0;
  bool paused = false;  // rings stopped: the engine is quiesced and nothing is written
};

struct DeviceModel;
class ModelHooks;

class RdmaDevice final : public vhost::Device {
 public:
  RdmaDevice(std::shared_ptr<nicdrv::Device> engine, vhost::EventLoop& loop, RdmaDeviceOptions opts = {});
  ~RdmaDevice() override;
  RdmaDevice(const RdmaDevice&) = delete;
  RdmaDevice& operator=(const RdmaDevice&) = delete;

  // vhost::Device
  [[nodiscard]] vhost::DeviceInfo info() const override;
  [[nodiscard]] std::vector<std::uint8_t> config() const override;
  void attach(vhost::DeviceHost* host) override;
  void memory_changed() override;
  void queue_ready(vhost::Queue& q) override;
  void queue_stopped(std::uint16_t index) override;
  void reset() override;
  // The device state is saved and loaded by the code that moves devices
  // (vrdma/migration/device_state.hpp, over model() with the rings stopped), which the frontend
  // reaches through migration::MigratingDevice. The device alone answers not_supported.
  Result<std::vector<std::uint8_t>> save_state() override;
  Status load_state(std::span<const std::uint8_t> blob) override;

  // Tells the guest's driver that its objects are gone (DEVICE_FATAL, kFatalObjectsLost).
  void report_objects_lost();
  // Tells the guest's driver that this backend is a restarted one that holds none of its
  // objects (DEVICE_FATAL, kFatalBackendRestarted; fatal to a driver that had any).
  void report_backend_restarted();

  // Polling (vrdmad --poll-us): one round over the doorbell ring, without waiting for its kick,
  // and the engine CQs of the CQs that had work since polling began, left unarmed (the soft
  // engine then receives on this thread instead of waking its own). true: it moved something.
  bool poll_round();
  // The end of a polling stretch: those CQs armed again, so that their events wake the loop.
  void poll_idle();

  [[nodiscard]] RdmaDeviceStats stats() const;
  [[nodiscard]] const nicdrv::Device& engine() const;

  // The snapshot interface (vrdma/device/model.hpp): the objects, for the code that moves
  // the device; and who hears of its stops, starts and resets (nullptr: nobody).
  [[nodiscard]] DeviceModel& model();
  void set_hooks(ModelHooks* hooks);

 private:
  std::unique_ptr<DeviceModel> impl_;
};

}  // namespace vrdma::device
