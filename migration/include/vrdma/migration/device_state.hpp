// The device state of a virtio RDMA device (device::RdmaDevice) and what moves it: the state
// codec (save_state/load_state), the object layout built ahead at a destination (precreate),
// the state area in guest memory, QPs re-created on a NIC under the guest's names, and the
// notices that pause and re-point peer backends (peer_notice.hpp). It works on the device
// through its snapshot interface (vrdma/device/model.hpp) and hears of the device's stops,
// starts and resets as its ModelHooks; the device knows none of this (docs/architecture.md).
//
// One DeviceState per RdmaDevice, made after it and destroyed before it; every call on the
// device's event-loop thread. MigratingDevice (switchover.hpp) owns one; a test or fuzzer that
// drives an RdmaDevice without the switchover may make its own.
//
// Trust: a state, layout or state area comes from the frontend or the guest's memory and is
// checked field by field, as the commands check theirs; a notice comes from the network
// (peer_notice.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/migration/peer_notice.hpp"
#include "vrdma/device/rdma_device.hpp"

namespace vrdma::migration {

struct DeviceStateOptions {
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
};

struct DeviceStateStats {
  std::uint32_t precreated = 0;  // engine objects built ahead for an incoming guest (precreate)
  std::uint32_t adopted = 0;     // of those, how many the last load_state() used
  // Peer notices: as the mover, peers paused and re-pointed; as the peer, notices answered,
  // refused, and this device's QPs paused and re-pointed for a moving peer.
  std::uint64_t peers_paused = 0, peers_repointed = 0;
  std::uint64_t notices_answered = 0, notices_refused = 0, qps_paused = 0, qps_repointed = 0;
};

class DeviceState {
 public:
  // The format version of save_state()'s blob. Version 2 adds, after the QPs, what a QP on an
  // engine that keeps its QPNs (soft) carries beside the engine's own state: the receives
  // completed, and a re-pointed peer's QPN and rkeys as the guest knows them (a NIC's QPs carry
  // those in their re-creation records). Version 3 adds, at the end, the PDs' DMA memory
  // regions (REG_DMA_MR: handle, PD, access, the lkey the guest knows); a destination registers
  // them over the guest memory it has. Version 4 adds, at the end, the fast-registration
  // regions (ALLOC_MR: handle, PD, max_pages, key, and while valid their iova, length, rights,
  // page size and pages); a destination allocates them under the same key, registered again
  // over the same guest pages. Version 5 adds, at the end, the doorbell rings and which CQs and
  // QPs were made with each. Version 6 adds the SRQs (after the AHs: handle, PD, SGEs, ring,
  // status block and the engine's receives not yet taken), each QP's SRQ (after its QPN), and
  // at the end the SRQs made with a doorbell ring; SRQs move on engines that keep their state
  // (soft), not onto a NIC. A destination reads kOldestStateVersion and later.
  static constexpr std::uint32_t kStateVersion = 6;
  static constexpr std::uint32_t kOldestStateVersion = 1;
  static constexpr bool state_version_readable(std::uint32_t v) { return v >= kOldestStateVersion && v <= kStateVersion; }

  explicit DeviceState(device::RdmaDevice& device, DeviceStateOptions opts = {});
  ~DeviceState();
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  // The device's objects (handles, keys, QPNs, ring positions, QP engine state, completions not
  // yet in the guest's rings) as a versioned blob. Saving needs the rings stopped (the engine
  // quiesced); loading needs the guest memory table and a device with no objects. The blob
  // comes from the frontend on load and is checked field by field.
  Result<std::vector<std::uint8_t>> save_state();
  Status load_state(std::span<const std::uint8_t> blob);
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
  [[nodiscard]] bool has_state_area() const;
  // How large the device state of the objects there are now may be (an upper bound, bytes).
  [[nodiscard]] std::uint64_t state_bound_bytes() const;
  [[nodiscard]] std::uint64_t state_area_bytes() const;
  // Bytes of the state last written into or loaded from the state area.
  [[nodiscard]] std::uint64_t state_area_state_bytes() const;

  // A notice from another backend, sent from `from` (the listener is vrdmad's): the answer to
  // send back (REFUSED with a sentence for anything not in order).
  notice::Message peer_notice(const notice::Message& m, const notice::Address& from);

  [[nodiscard]] DeviceStateStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace vrdma::migration
