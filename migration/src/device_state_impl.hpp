// Private to migration/: DeviceState's state and which file implements which of its members.
// state.cpp (the state codec, the layout and pre-created objects), state_area.cpp (the state
// area on kStateQueue), rebuild.cpp (QPs re-created on a NIC), peer.cpp (peer notices),
// device_state.cpp (the public face and the device's hooks). Everything runs on the device's
// loop thread; `d` is the device model, read and changed through its snapshot interface.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/migration/device_state.hpp"
#include "vrdma/migration/peer_notice.hpp"
#include "vrdma/migration/rebuild_record.hpp"
#include "vrdma/device/model.hpp"

namespace vrdma::migration {

namespace vd = vrdma::vrdma_dev;
using device::AhObj;
using device::CqObj;
using vhost::DescChain;
using device::DmaMrObj;
using vhost::GuestView;
using device::MrObj;
using device::PdObj;
using vhost::prefixed;
using device::QpObj;
using vhost::Queue;
using device::RdmaLimits;

// What a saved QP (state or layout) may ask for: an RC, UD or GSI QP (the engine refuses a GSI
// QP it cannot make) within the device's SGE and inline limits.
inline bool qp_shape_ok(const RdmaLimits& lim, std::uint8_t type, std::uint32_t send_sge, std::uint32_t recv_sge,
                        std::uint32_t max_inline) {
  const bool known = type == VIRTIO_RDMA_QPT_RC || type == VIRTIO_RDMA_QPT_UD || type == VIRTIO_RDMA_QPT_GSI;
  return known && send_sge != 0 && send_sge <= lim.max_sge && recv_sge != 0 && recv_sge <= lim.max_sge &&
         max_inline <= lim.max_inline;
}
using device::SrqObj;
using device::WorkRing;

// Engine objects built during pre-copy from a source's object layout (state.cpp precreate()),
// adopted by load_state() when the state names the same handle with the same parameters, so
// that the switchover window only imports QP state instead of creating every object.
struct Precreated {
  struct Cq {
    std::uint32_t depth = 0;
    std::shared_ptr<nicdrv::CompletionQueue> eng;
  };
  struct Qp {
    std::uint32_t pd = 0, send_cq = 0, recv_cq = 0, qpn = 0;
    const nicdrv::ProtectionDomain* pd_eng = nullptr;  // what it was created in
    nicdrv::QpInitAttr attr;                            // with the pre-created CQs
    std::shared_ptr<nicdrv::QueuePair> eng;
  };
  std::unordered_map<std::uint32_t, std::shared_ptr<nicdrv::ProtectionDomain>> pds;
  std::unordered_map<std::uint32_t, Cq> cqs;
  std::unordered_map<std::uint32_t, Qp> qps;
  void clear() {  // QPs before the CQs and PDs they were created with
    qps.clear();
    cqs.clear();
    pds.clear();
  }
  [[nodiscard]] std::uint32_t count() const { return static_cast<std::uint32_t>(pds.size() + cqs.size() + qps.size()); }
};

struct DeviceState::Impl final : device::ModelHooks {
  Impl(device::RdmaDevice& device, DeviceStateOptions o);
  ~Impl() override;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  device::RdmaDevice& device;
  device::DeviceModel& d;
  DeviceStateOptions opts;
  DeviceStateStats st;

  // device::ModelHooks (device_state.cpp)
  void rings_stopped() override;
  void rings_running() override;
  void device_reset() override;
  void state_queue(Queue& q) override;
  void objects_added() override { check_state_area(); }

  // rebuild.cpp: moving QPs whose state a NIC keeps (export_state() not_supported): drained
  // and stopped at the save, re-created from their attributes and PSNs at the load, the guest's
  // QPNs and keys kept by translation.
  Status stop_for_rebuild();
  [[nodiscard]] rebuild::Record record_of(const QpObj& qp, const nicdrv::QpAttr& before, const nicdrv::QpAttr& after);
  // After QPs in `stopped` went to ERR: completions produced before go to the CQ backlogs, their
  // flushes are dropped; waits for `expect_flush` receive flushes per QP (or quiet CQs).
  Status collect_after_stop(const std::unordered_map<std::uint32_t, std::uint32_t>& expect_flush,
                            const std::unordered_set<std::uint32_t>& stopped);
  Result<std::vector<std::uint8_t>> rebuild_record(std::uint32_t handle, const QpObj& qp);
  Status rebuild_qp(std::uint32_t handle, QpObj& qp, nicdrv::ProtectionDomain& pd, const nicdrv::QpInitAttr& ia,
                    std::span<const std::uint8_t> record);
  // The same on the QP the engine has (ERR -> RESET): it keeps its QPN, on any engine.
  Status reset_for_rebuild(std::uint32_t handle, QpObj& qp, std::span<const std::uint8_t> record);
  Status receives_fit(const QpObj& qp, const rebuild::Record& r) const;
  void adopt_record(std::uint32_t handle, QpObj& qp, const rebuild::Record& r, std::span<const std::uint8_t> record);
  Status finish_rebuilds();
  // The rings run here again after a save that stopped the QPs (the move failed): re-create
  // them on this NIC the same way.
  void rebuild_here();
  struct PendingRebuild {
    std::uint32_t handle;
    std::vector<std::uint8_t> record;
  };
  std::vector<PendingRebuild> rebuilds;  // load_state(): modified once every QP exists
  // A NIC's SRQs: the record of the receives the device held (save), posting them again (load;
  // and here, for those the stop flushed, when the move fails: srq_flushed, SRQ and tag).
  Result<std::vector<std::uint8_t>> srq_record(const SrqObj& s) const;
  Status rebuild_srq(std::uint32_t handle, SrqObj& s, std::span<const std::uint8_t> blob);
  Status post_held(SrqObj& s, SrqObj::Held h);
  std::vector<std::pair<std::uint32_t, std::uint64_t>> srq_flushed;
  std::unordered_map<std::uint32_t, std::vector<std::uint8_t>> stopped_for_rebuild;  // save: handle -> record

  // peer.cpp: notices between backends (peer_notice.hpp, peer_notice.cpp for the bytes). As the mover: pause the peers of the
  // QPs at a stop, release them if the stop is abandoned, re-point them once a QP exists again.
  struct PausedPeer {
    std::uint32_t handle = 0;
    notice::Address from{}, to{};
    std::uint32_t peer_qpn = 0, mover_qpn = 0;
    std::array<std::uint8_t, 16> mover_gid{};
    std::uint64_t token = 0;
  };
  std::vector<PausedPeer> pause_peers(const std::unordered_map<std::uint32_t, nicdrv::QpAttr>& attrs);
  void release_peers(const std::vector<PausedPeer>& peers);
  std::optional<std::uint32_t> repoint_peer(std::uint32_t handle, const QpObj& qp, const rebuild::Record& r);
  // As the peer: answer another backend's notice.
  notice::Message answer_notice(const notice::Message& m, const notice::Address& from);
  // `attr`: the QP's attributes as the notice came.
  notice::Message pause_for_peer(std::uint32_t handle, QpObj& qp, const nicdrv::QpAttr& attr, const notice::Message& m,
                                 const notice::Address& from);
  notice::Message repoint_for_peer(std::uint32_t handle, QpObj& qp, const nicdrv::QpAttr& attr, const notice::Message& m);
  // Holds the QP's send ring and drains its NIC (RTS -> SQD); the reason when it cannot.
  std::optional<std::string> hold_and_drain(std::uint32_t handle, QpObj& qp);
  Status resume_after_hold(std::uint32_t handle, QpObj& qp);
  // The QP's send ring held until hold_timeout_ms from now (QpObj::send_held), and let go.
  void hold(std::uint32_t handle, QpObj& qp);
  void let_go(std::uint32_t handle, QpObj& qp);
  void expire_holds();
  void arm_hold_timer();
  std::unordered_map<std::uint32_t, std::chrono::steady_clock::time_point> held_for_peer;  // QP handle -> hold until
  UniqueFd hold_timer;

  // state.cpp (device state for migration)
  Result<std::vector<std::uint8_t>> save_state();
  Status load_state(std::span<const std::uint8_t> blob);
  // The object layout (PDs, CQs, QPs with their handles, sizes and QPNs; no engine state),
  // readable while the guest runs; and the destination's side: build those engine objects now.
  [[nodiscard]] std::vector<std::uint8_t> save_layout() const;
  Status precreate(std::span<const std::uint8_t> layout);
  // The QP precreate() built for `handle` if it was built with these parameters (and, with
  // `qpn`, under that QPN; a NIC picks its own); the entry goes either way, so that a mismatch
  // frees its QPN for the QP created instead.
  std::shared_ptr<nicdrv::QueuePair> take_precreated_qp(std::uint32_t handle, const QpObj& qp,
                                                        const nicdrv::ProtectionDomain* pd,
                                                        const nicdrv::QpInitAttr& ia, std::optional<std::uint32_t> qpn);
  Precreated pre;
  std::uint32_t adopted = 0;  // pre-created objects the last load_state() used

  // state_area.cpp (the state area on kStateQueue; state_queue() above)
  [[nodiscard]] vd::StateCensus census() const;
  void check_state_area();
  Status save_state_to_guest();
  Status write_state_area(const vd::StateAreaHeader& h, const void* body, std::uint64_t len);
  Status clear_state_magic(const GuestView& g, const DescChain& c) const;
  void withdraw_state_from_guest();  // rings run again where the state was written: zero its magic
  Result<bool> load_state_from_guest();
  Status read_chain(const GuestView& g, const DescChain& c, std::uint64_t off, void* dst, std::uint64_t len) const;
  Status write_chain(const GuestView& g, const DescChain& c, std::uint64_t off, const void* src, std::uint64_t len) const;
  std::optional<DescChain> state_area;  // the newest area the driver posted (held, never returned while newest)
  std::uint64_t state_area_asked = 0;    // bytes last asked for with a state_area_small event
  std::uint64_t state_saved_bytes = 0;     // the last state written to or read from the area
  bool state_in_area = false;              // this process wrote a state there at the last stop
  std::string state_lost;                  // the area said the source's state did not come, and why

};

}  // namespace vrdma::migration
