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
#include "vrdma/vhost/peer_notice.hpp"

namespace vrdma::vhost {

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
  // On a NIC, how long the stop waits for the sends already posted to finish (and then for the
  // NIC to flush the receives it holds) before it gives up and the guest carries on here.
  std::uint32_t drain_timeout_ms = 2000;
  // Peer notices on a NIC (peer_notice.hpp, docs/migration.md): at a stop, ask the backends of
  // the guest's QPs' peers to pause, and re-point them once the QPs exist again; answer other
  // backends' notices (vrdmad --notices). A pause this device grants ends by itself after
  // hold_timeout_ms without a re-point.
  bool notices = false;
  std::uint16_t notice_port = notice::kDefaultPort;
  std::uint32_t hold_timeout_ms = 10000;
  std::uint8_t mac[6] = {0x52, 0x54, 0x00, 0x00, 0x00, 0x01};
};

// Counters for the control socket and tests (loop thread).
struct RdmaDeviceStats {
  std::uint64_t commands = 0, command_errors = 0;
  std::uint64_t doorbells = 0, doorbell_errors = 0;
  std::uint64_t send_wqes = 0, recv_wqes = 0, wqe_errors = 0;
  std::uint64_t cqes = 0, cq_overruns = 0;
  std::uint64_t events = 0, events_dropped = 0;
  std::uint32_t pds = 0, mrs = 0, cqs = 0, qps = 0, ahs = 0, srqs = 0;
  std::uint64_t registered_bytes = 0;
  bool paused = false;  // rings stopped: the engine is quiesced and nothing is written
  std::uint32_t precreated = 0;  // engine objects built ahead for an incoming guest (precreate)
  std::uint32_t adopted = 0;     // of those, how many the last load_state() used
  // Peer notices: as the mover, peers paused and re-pointed; as the peer, notices answered,
  // refused, and this device's QPs paused and re-pointed for a moving peer.
  std::uint64_t peers_paused = 0, peers_repointed = 0;
  std::uint64_t notices_answered = 0, notices_refused = 0, qps_paused = 0, qps_repointed = 0;
};

class RdmaDevice final : public Device {
 public:
  // The format version of save_state()'s blob. Version 2 adds, after the QPs, what a QP on an
  // engine that keeps its QPNs (soft) carries beside the engine's own state: the receives
  // completed, and a re-pointed peer's QPN and rkeys as the guest knows them (a NIC's QPs carry
  // those in their re-creation records). Version 3 adds, at the end, the PDs' DMA memory
  // regions (REG_DMA_MR: handle, PD, access, the lkey the guest knows); a destination registers
  // them over the guest memory it has. A destination reads kOldestStateVersion and later.
  static constexpr std::uint32_t kStateVersion = 3;
  static constexpr std::uint32_t kOldestStateVersion = 1;
  static constexpr bool state_version_readable(std::uint32_t v) { return v >= kOldestStateVersion && v <= kStateVersion; }

  RdmaDevice(std::shared_ptr<nicdrv::Device> engine, EventLoop& loop, RdmaDeviceOptions opts = {});
  ~RdmaDevice() override;
  RdmaDevice(const RdmaDevice&) = delete;
  RdmaDevice& operator=(const RdmaDevice&) = delete;

  // vhost::Device
  [[nodiscard]] DeviceInfo info() const override;
  [[nodiscard]] std::vector<std::uint8_t> config() const override;
  void attach(DeviceHost* host) override;
  void memory_changed() override;
  void queue_ready(Queue& q) override;
  void queue_stopped(std::uint16_t index) override;
  void reset() override;
  // The device's objects (handles, keys, QPNs, ring positions, QP engine state, completions not
  // yet in the guest's rings) as a versioned blob. Saving needs the rings stopped (the engine
  // quiesced); loading needs the guest memory table and a device with no objects. The blob
  // comes from the frontend on load and is checked field by field.
  Result<std::vector<std::uint8_t>> save_state() override;
  Status load_state(std::span<const std::uint8_t> blob) override;
  // Migration ahead of the stop (docs/migration.md "Pre-created objects"): the object layout
  // (PDs, CQs, QPs: handles, sizes, QPNs; no engine state, no ring positions), readable while
  // the guest runs; and, on a destination with no objects yet, the engine objects of such a
  // layout built now (checked as load_state() checks the state). load_state() then adopts each
  // one whose handle and parameters match and creates the rest; what it leaves is destroyed.
  [[nodiscard]] std::vector<std::uint8_t> save_layout() const;
  Status precreate(std::span<const std::uint8_t> layout);
  void drop_precreated();

  // The state area (virtio_rdma.hpp kStateQueue; docs/virtio-rdma.md "State in guest memory").
  // Source, every ring stopped while the frontend dirty-logs: writes the state (or a header
  // saying it did not fit, or that it could not be saved, with the reason) into the area the
  // driver keeps posted, through the dirty log.
  // Errors: no area posted, the state cannot be saved, or it does not fit.
  Status save_state_to_guest();
  // Destination: reads the area the driver kept posted (in flight from the source). true: the
  // state was loaded (its magic is then cleared); false: the driver posted no area, or the area
  // holds no state. Errors: the state queue is not set up yet (Errc::bad_state: try again when
  // it starts), or the area's state is foreign, torn or refused by load_state().
  Result<bool> load_state_from_guest();
  // After load_state_from_guest() answered false: why the guest's objects were lost on the way
  // (the source said the state did not fit or could not be saved), empty when there were none.
  [[nodiscard]] std::string state_lost() const;
  // Tells the guest's driver that its objects are gone (DEVICE_FATAL, kFatalObjectsLost).
  void report_objects_lost();
  // Tells the guest's driver that this backend is a restarted one that holds none of its
  // objects (DEVICE_FATAL, kFatalBackendRestarted; fatal to a driver that had any).
  void report_backend_restarted();
  [[nodiscard]] bool has_state_area() const;
  // How large the device state of the objects there are now may be (an upper bound, bytes).
  [[nodiscard]] std::uint64_t state_bound_bytes() const;
  [[nodiscard]] std::uint64_t state_area_bytes() const;
  // Bytes of the state last written into or loaded from the state area.
  [[nodiscard]] std::uint64_t state_area_state_bytes() const;

  // Polling (vrdmad --poll-us): one round over the doorbell ring, without waiting for its kick,
  // and the engine CQs of the CQs that had work since polling began, left unarmed (the soft
  // engine then receives on this thread instead of waking its own). true: it moved something.
  bool poll_round();
  // The end of a polling stretch: those CQs armed again, so that their events wake the loop.
  void poll_idle();

  // A notice from another backend, sent from `from` (the listener is vrdmad's): the answer to
  // send back (REFUSED with a sentence for anything not in order).
  notice::Message peer_notice(const notice::Message& m, const notice::Address& from);

  [[nodiscard]] RdmaDeviceStats stats() const;
  [[nodiscard]] const nicdrv::Device& engine() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace vrdma::vhost
