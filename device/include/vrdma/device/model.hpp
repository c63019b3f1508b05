// The virtio RDMA device model's objects and operations (see rdma_device.hpp for the threading
// and trust rules): what device/src implements, one file per role: device.cpp (queues,
// events, completions, pause/resume), commands.cpp (the control queue), datapath.cpp (doorbells,
// work requests), memory.cpp (memory regions over guest pages, the dirty-log observer),
// names.cpp (the guest's names for engine QPNs and keys).
//
// It is also the snapshot interface (docs/architecture.md): the code that moves a device
// (migration/, vrdma/migration/device_state.hpp) enumerates and re-creates these objects, reads
// and writes the name maps and holds send rings, with the rings stopped or on the loop thread,
// and hears of the device's stops, starts and resets through ModelHooks. The device itself
// knows no migration format, peer or state area.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/nicdrv/device.hpp"
#include "vrdma/device/rdma_device.hpp"
#include "vrdma/virtio_rdma.hpp"

namespace vrdma::device {

namespace vd = vrdma::vrdma_dev;

// The dirty log as the engine thread sees it: swapped whole on memory_changed().
struct LogRef {
  std::atomic<std::shared_ptr<vhost::DirtyLog>> log;
};

// Maps the engine's writes into a region back to guest pages and marks them dirty.
class MrObserver final : public nicdrv::WriteObserver {
 public:
  MrObserver(std::shared_ptr<LogRef> log, const std::uint8_t* base, std::uint64_t first_offset,
             std::uint32_t page_shift, std::vector<std::uint64_t> pages)
      : log_(std::move(log)), base_(base), off0_(first_offset), shift_(page_shift), pages_(std::move(pages)) {}
  void on_write(std::uint64_t addr, std::uint64_t len) noexcept override { mark(addr, len); }
  void mark(std::uint64_t addr, std::uint64_t len) const noexcept;
  [[nodiscard]] const std::vector<std::uint64_t>& pages() const { return pages_; }

 private:
  std::shared_ptr<LogRef> log_;
  const std::uint8_t* base_;
  std::uint64_t off0_;
  std::uint32_t shift_;
  std::vector<std::uint64_t> pages_;
};

// The observer of a fast-registration region: each REG_MR gives it another page list (the
// device's loop thread swaps it in; the engine's thread reads it), none before the first.
class FastMrObserver final : public nicdrv::WriteObserver {
 public:
  void on_write(std::uint64_t addr, std::uint64_t len) noexcept override {
    if (auto now = layout_.load(std::memory_order_acquire)) now->mark(addr, len);
  }
  void set(std::shared_ptr<const MrObserver> layout) { layout_.store(std::move(layout), std::memory_order_release); }
  [[nodiscard]] std::shared_ptr<const MrObserver> layout() const { return layout_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::shared_ptr<const MrObserver>> layout_;
};

// Marks the engine's writes through one part of a DMA memory region (a whole guest memory
// region, mapped linearly: host base + n is guest-physical gpa + n) in the dirty log.
class RegionObserver final : public nicdrv::WriteObserver {
 public:
  RegionObserver(std::shared_ptr<LogRef> log, const std::uint8_t* base, std::uint64_t gpa, std::uint64_t size)
      : log_(std::move(log)), base_(reinterpret_cast<std::uint64_t>(base)), gpa_(gpa), size_(size) {}
  void on_write(std::uint64_t addr, std::uint64_t len) noexcept override;

 private:
  std::shared_ptr<LogRef> log_;
  std::uint64_t base_, gpa_, size_;
};

// A PD's DMA memory region (REG_DMA_MR, docs/virtio-rdma.md "The DMA memory region"): its
// addresses are guest-physical, it covers every guest memory region and nothing else, local
// access only. One engine region per guest memory region (registered at iova = its first
// guest-physical address); the guest knows one lkey, which the data path turns into the
// engine key of the part holding a work request's address.
struct DmaMrObj {
  struct Part {
    std::uint64_t gpa = 0, size = 0;
    std::shared_ptr<const vhost::MappedRegion> region;  // keeps the mapping alive
    std::shared_ptr<nicdrv::MemoryRegion> eng;
  };
  std::uint32_t pd = 0, access = 0;
  std::uint32_t guest_lkey = 0;
  std::vector<Part> parts;
};

struct PdObj {
  std::shared_ptr<nicdrv::ProtectionDomain> eng;
  std::uint32_t users = 0;  // MRs, QPs, AHs, SRQs in it
  // Engine AHs of the address vectors UD sends carried inline (VIRTIO_RDMA_SEND_INLINE_AV), by
  // the vector's bytes; bounded (emptied when full). Not device state: made again on demand.
  std::unordered_map<std::string, std::shared_ptr<nicdrv::AddressHandle>> inline_ahs;
};

struct MrObj {
  std::uint32_t pd = 0;
  std::uint32_t page_shift = 12;
  std::uint64_t iova = 0, length = 0;
  std::uint32_t access = 0;
  MmapArea window;  // the alias mapping when the pages were scattered
  vhost::GuardedMapping window_guard;  // SIGBUS in it reported like one in guest memory (guest_fault.hpp)
  std::vector<std::shared_ptr<const vhost::MappedRegion>> regions;  // keeps the mapped pages alive
  std::shared_ptr<MrObserver> observer;
  std::shared_ptr<nicdrv::MemoryRegion> eng;
  // The keys the guest was given. They are the engine's, except after a move onto a NIC, which
  // picks its own keys when a region is registered again (migration/src/rebuild.cpp translates).
  std::uint32_t guest_lkey = 0, guest_rkey = 0;
};

// What a registration (REG_MR command or WQE, or a saved fast region) says of its bytes and pages.
struct PageLayout {
  std::uint64_t iova = 0, length = 0;
  std::uint32_t npages = 0, page_shift = 12, access = 0;
};

// A region for fast registration (ALLOC_MR, docs/virtio-rdma.md "Fast registration"): it holds
// no memory until a REG_MR send WQE gives it guest pages. Pages contiguous in one guest memory
// region are handed to the engine where the guest memory is mapped; scattered pages are mapped
// into its window, an address range reserved at ALLOC_MR for max_pages pages of the largest
// page size, at the doorbell that brings the WQE (as Linux rxe takes the page list at
// ib_map_mr_sg: the driver gives an invalid region new pages). A migration carries its key and,
// while it is valid, its registration (migration/src/state.cpp).
struct FastMrObj {
  std::uint32_t pd = 0, max_pages = 0;
  MmapArea window;
  vhost::GuardedMapping window_guard;
  std::vector<std::shared_ptr<const vhost::MappedRegion>> regions;  // every one its pages came from
  std::shared_ptr<FastMrObserver> observer = std::make_shared<FastMrObserver>();
  std::shared_ptr<nicdrv::MemoryRegion> eng;
  PageLayout last;  // the last registration mapped (its pages are the observer's)
};

// A process's doorbell ring (CREATE_DB_RING, docs/virtio-rdma.md "Doorbell rings"): records the
// guest writes in its own memory, taken at each doorbell-queue notification and while polling;
// a record acts only on an object created with this ring (CqObj/QpObj/SrqObj::db_ring).
struct DbRingObj {
  std::uint64_t gpa = 0;
  std::uint32_t depth = 0;
  std::uint32_t consumed = 0;  // records taken (free-running); the header's copy is informative
  std::uint32_t users = 0;     // CQs, QPs and SRQs created with it
};

struct CqObj {
  std::uint32_t depth = 0;
  std::uint32_t db_ring = 0;  // the doorbell ring whose records may arm it (0: the doorbell queue only)
  std::uint64_t ring_gpa = 0;
  std::shared_ptr<nicdrv::CompletionQueue> eng;
  std::uint32_t produced = 0;
  bool armed = false, solicited_only = false;
  bool event_queued = false;
  bool stalled = false;  // the guest's ring was full; retried by the timer
  std::uint32_t users = 0;
  std::deque<vd::Cqe> backlog;  // completions restored from a device state, written first
};

struct WorkRing {
  std::uint64_t gpa = 0;
  std::uint32_t depth = 0, stride = 0;
  std::uint32_t consumed = 0;  // WQEs taken (free-running)
  std::uint32_t produced = 0;  // last producer index the driver rang
};

struct QpObj {
  std::uint32_t pd = 0, send_cq = 0, recv_cq = 0, srq = 0;
  std::uint32_t db_ring = 0;  // the doorbell ring whose records may ring it (0: the doorbell queue only)
  nicdrv::QpType type = nicdrv::QpType::rc;
  bool sq_sig_all = false;
  std::uint32_t max_send_sge = 0, max_recv_sge = 0, max_inline = 0;
  WorkRing sq, rq;
  std::uint64_t status_gpa = 0;
  std::shared_ptr<nicdrv::QueuePair> eng;
  bool fatal_reported = false;
  // Its send ring is held (migration/ peer notices: paused for a moving peer): doorbells leave
  // its WQEs in the ring until it is let go.
  bool send_held = false;
  // The QPN the guest was given: the engine's, except after a move onto a NIC (migration/src/rebuild.cpp).
  std::uint32_t guest_qpn = 0;
  // Receive completions (any status) moved to the guest: with rq.consumed, the receives still
  // posted to the engine, which a move onto a NIC, or a re-point for a moved peer, posts again.
  std::uint32_t rq_done = 0;
  // Connected to another QP of this device (its destination QPN is one of ours, on our GID):
  // after a move onto a NIC its QPN and the rkeys it uses are translated too.
  bool local_peer = false;
  // Set by peer notices (migration/src/peer.cpp). guest_dest_qpn: the peer's QPN as the guest
  // knows it, when a re-pointed peer has another on the wire (0: the wire's). As the peer of a
  // QP that moved: the mover's token (a later re-point must carry it; opaque here) and its map
  // of rkeys (guest -> NIC), applied to this QP's RDMA and atomic work requests. A modify that
  // names another destination clears all three.
  std::uint32_t guest_dest_qpn = 0;
  std::uint64_t peer_token = 0;
  std::unordered_map<std::uint32_t, std::uint32_t> remote_rkeys;
};

struct AhObj {
  std::uint32_t pd = 0;
  vd::AhWire wire{};
  std::shared_ptr<nicdrv::AddressHandle> eng;
};

struct SrqObj {
  std::uint32_t pd = 0, max_sge = 0;
  std::uint32_t db_ring = 0;  // the doorbell ring whose records may ring it (0: the doorbell queue only)
  WorkRing ring;
  std::uint64_t status_gpa = 0;
  std::shared_ptr<nicdrv::SharedReceiveQueue> eng;
  std::uint32_t users = 0;
  // On an engine that rebuilds its objects at a move (a NIC, engine_rebuilds()): the receives
  // handed to the engine's SRQ and not yet completed, oldest first, as the guest wrote them. A
  // NIC cannot give back what was posted to an SRQ and the guest may reuse a slot once the
  // device took it, so a move (migration/src/rebuild.cpp) carries these and the destination
  // posts them again. Each went to the engine under its own `tag` (not the guest's wr_id,
  // which need not be unique): a completion names the tag, which gives back the guest's wr_id.
  struct Held {
    std::uint64_t tag = 0, wr_id = 0;
    std::uint32_t nsge = 0;
    std::array<vd::WireSge, 16> sge{};
  };
  std::deque<Held> held;
  std::uint64_t next_tag = 1;
};

// What the device tells the code that moves it (set with RdmaDevice::set_hooks; loop thread).
class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  // The rings stopped: the engine is quiesced (as far as it can be) and the device writes
  // nothing more to guest memory until every ring runs again.
  virtual void rings_stopped() = 0;
  // Every ring runs again after a stop: before the device takes up its rings.
  virtual void rings_running() = 0;
  // The device dropped every object (a reset, or its end).
  virtual void device_reset() = 0;
  // The state queue (kStateQueue) has buffers: the device has no use for them itself.
  virtual void state_queue(vhost::Queue& q) = 0;
  // Control commands made objects: the device state grew.
  virtual void objects_added() = 0;
};

struct DeviceModel {
  DeviceModel(std::shared_ptr<nicdrv::Device> e, vhost::EventLoop& l, RdmaDeviceOptions o);
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;
  ModelHooks* hooks = nullptr;  // RdmaDevice::set_hooks (migration::DeviceState), or nobody

  // device.cpp
  void queue_ready(vhost::Queue& q);
  void queue_stopped(std::uint16_t index);
  void reset();
  void memory_changed();
  void pause();
  void maybe_resume();
  void drain_cq(std::uint32_t handle);
  void drain_all();
  bool poll_round();
  void poll_idle();
  void retry_stalled();
  void arm_retry_timer();
  void queue_event(vd::EventType type, std::uint32_t handle, std::uint32_t info = 0);
  void deliver_events(vhost::Queue& q);
  bool write_cqe(std::uint32_t cq_handle, CqObj& cq, const vhost::GuestView& g, const vd::Cqe& cqe);
  [[nodiscard]] vhost::GuestView view() const;

  // commands.cpp, commands_qp.cpp
  void control(vhost::Queue& q);
  // One control command: the response's body, or (status not ok) the sentence why not; `made`:
  // it made an object (the state may have outgrown the state area).
  struct Executed {
    vd::Status status = vd::Status::ok;
    std::vector<std::uint8_t> body;
    std::string why;
    bool made = false;
  };
  Executed execute(const vhost::GuestView& g, std::span<const std::uint8_t> req);

  // datapath.cpp
  void doorbells(vhost::Queue& q);
  // `ring`: the doorbell ring the record came from (0: the doorbell queue); a record from a ring
  // acts only on an object created with that ring.
  void ring_doorbell(const vhost::GuestView& g, const vd::Doorbell& db, std::uint32_t ring = 0);
  // db_rings.cpp: every doorbell ring's new records taken (a doorbell-queue notification, a
  // polling round, the rings running again); and the rings told whether the device polls them.
  void ring_doorbell_rings(const vhost::GuestView& g);
  void set_db_rings_polled(const vhost::GuestView& g, bool polled);
  // A CQ, QP or SRQ created (+1) or destroyed (-1) with doorbell ring `ring` (0: none).
  void count_db_ring_user(std::uint32_t ring, int delta);
  // A new ring's number (1..65535, none in use): 0 when all are.
  std::uint32_t new_db_ring_number();
  // Why a doorbell ring of `depth` records at `gpa` cannot be one (CREATE_DB_RING and a loaded
  // device state check the same): its depth, alignment or place in guest memory; nullopt when it can.
  static std::optional<std::string> db_ring_layout_error(const vhost::GuestView& g, std::uint64_t gpa, std::uint32_t depth);
  static bool db_ring_depth_ok(std::uint32_t depth);
  void post_sq(const vhost::GuestView& g, std::uint32_t handle, QpObj& qp);
  void post_rq(const vhost::GuestView& g, std::uint32_t handle, QpObj& qp);
  void post_srq(const vhost::GuestView& g, std::uint32_t handle, SrqObj& srq);
  // A completion the device writes itself: a WQE it refused (local QP operation error) or a
  // receive it flushed.
  void error_cqe(const vhost::GuestView& g, std::uint32_t cq_handle, std::uint64_t wr_id, std::uint32_t qp_num, bool recv,
                 nicdrv::WcStatus status = nicdrv::WcStatus::loc_qp_op_err);
  void write_status(const vhost::GuestView& g, std::uint64_t gpa, std::uint32_t sq, std::uint32_t rq, std::uint32_t state);
  void retry_pending();
  // The engine AH of an inline address vector in PD `pd` (made on first use, then kept).
  Result<nicdrv::AddressHandle*> inline_ah(std::uint32_t pd, const vd::AhWire& av);

  // memory.cpp
  // The page list comes from guest memory (REG_MR) or from a saved device state.
  Result<MrObj> map_mr(const vhost::GuestView& g, const vd::RegMrReq& r, const std::vector<std::uint64_t>* saved_pages = nullptr);
  Status register_mr(const vhost::GuestView& g, const vd::RegMrReq& r, std::uint32_t requested_key, MrObj& out,
                     const std::vector<std::uint64_t>* saved_pages = nullptr);
  // The most pages a fast-registration region may have here (0: the engine has none).
  [[nodiscard]] std::uint32_t fast_mrs_allowed() const { return fast_reg_pages_; }
  std::uint32_t fast_reg_pages_ = 0;  // set at construction from the engine's DeviceAttr
  [[nodiscard]] static constexpr bool fast_reg_opcode(std::uint8_t op) {
    return op == vd::kWrLocalInv || op == vd::kWrSendWithInv || op == vd::kWrRegMr;
  }
  // A REG_MR send WQE of a QP in PD `pd`: its page list checked and mapped for the fast region
  // it names; `wr` gets the engine's REG_MR (its reg fields).
  Status fast_register(const vhost::GuestView& g, std::uint32_t pd, const vd::RegMrWqe& w, nicdrv::SendWr& wr);
  // A fast region of PD `pd` for max_pages pages (1..fast_mrs_allowed()), its window reserved;
  // its engine region is the caller's to make (alloc_mr with its observer).
  Result<FastMrObj> new_fast_mr(std::uint32_t pd, std::uint32_t max_pages);
  // `pages` (the layout's, checked here against the region's max_pages) mapped for `mr` and its
  // observer told: the host address of the region's first byte.
  Result<std::uint8_t*> map_fast(const vhost::GuestView& g, FastMrObj& mr, const PageLayout& l,
                                 std::vector<std::uint64_t> pages);
  // The engine regions of a DMA memory region over the guest memory there is now (the old
  // ones released first). keep_name: the guest already knows mr.guest_lkey (a loaded state, a
  // new memory table); an engine that can is asked for that key again, else it is translated.
  Status map_dma_mr(const vhost::GuestView& g, DmaMrObj& mr, bool keep_name);
  [[nodiscard]] std::uint32_t dma_engine_lkey(const DmaMrObj& mr, std::uint64_t addr) const;
  // commands.cpp: a CQ's engine object, zeroed guest ring and event-fd watch.
  // `made`: an engine CQ built ahead (a migration's pre-created objects) instead of a new one.
  Status add_cq(const vhost::GuestView& g, std::uint32_t handle, std::uint32_t depth, std::uint64_t ring_gpa, bool zero_ring,
                std::shared_ptr<nicdrv::CompletionQueue> made = {});

  // names.cpp. The attributes a QP was created with (its CQs and SRQ as they are now).
  [[nodiscard]] nicdrv::QpInitAttr init_attr_of(const QpObj& qp);
  // Drops the names of QP or MR `handle` from the maps below.
  void forget_names(std::uint32_t handle);
  // Whether an engine that could not keep the guest's names runs under this device (a NIC:
  // after a move its QPNs and keys are the guest's translated).
  [[nodiscard]] bool engine_rebuilds() const { return !engine_reports_writes; }
  // The engine's lkey for a work request's local key and address (a DMA region has one engine
  // key per guest memory region).
  [[nodiscard]] std::uint32_t engine_lkey(std::uint32_t guest_lkey, std::uint64_t addr) const {
    if (!dma_by_lkey.empty())
      if (auto d = dma_by_lkey.find(guest_lkey); d != dma_by_lkey.end()) return dma_engine_lkey(*d->second, addr);
    if (lkey_to_engine.empty()) return guest_lkey;
    auto it = lkey_to_engine.find(guest_lkey);
    return it == lkey_to_engine.end() ? guest_lkey : it->second;
  }
  [[nodiscard]] std::uint32_t guest_qpn_of(std::uint32_t engine_qpn) const {
    if (qpn_to_guest.empty()) return engine_qpn;
    auto it = qpn_to_guest.find(engine_qpn);
    return it == qpn_to_guest.end() ? engine_qpn : it->second;
  }
  [[nodiscard]] bool guest_name_taken(std::uint32_t qpn_or_key, bool qpn) const;
  // The guest's GID 0 is the device's address: the engine's RoCEv2 IPv4 GID (nicdrv::
  // preferred_gid; a NIC such as rxe lists its link-local IPv6 GID first, which a guest kernel
  // driver cannot take as the device's address), at the engine's index gid0_index (set at
  // construction). The guest's other GID indexes are the engine's own.
  std::uint8_t gid0_index = 0;
  [[nodiscard]] std::uint8_t engine_sgid(std::uint8_t guest) const { return guest == 0 ? gid0_index : guest; }
  // An address handle as the guest wrote it, for the engine (its GID index translated).
  [[nodiscard]] nicdrv::AhAttr engine_ah(const vd::AhWire& w) const;
  // A completion as the guest sees it: its QPN, and for a receive from an SRQ the device keeps
  // (SrqObj::held) the guest's wr_id for the engine's tag; that receive is no longer held.
  // `qp`: the completion's QP (qp_of_completion), or null.
  [[nodiscard]] vd::Cqe guest_cqe(const nicdrv::WorkCompletion& wc, const QpObj* qp);
  std::unordered_map<std::uint32_t, std::uint32_t> lkey_to_engine;  // guest lkey -> engine lkey (moved regions)
  std::unordered_map<std::uint32_t, std::uint32_t> rkey_to_engine;  // guest rkey -> engine rkey (moved regions)
  std::unordered_map<std::uint32_t, std::uint32_t> qpn_to_guest;    // engine QPN -> guest QPN (moved QPs)
  std::unordered_map<std::uint32_t, std::uint32_t> qpn_to_engine;   // guest QPN -> engine QPN (moved QPs)
  std::unordered_map<std::uint32_t, std::uint32_t> qp_by_engine_qpn;  // engine QPN -> handle
  // The QP a completion taken from an engine CQ belongs to, a receive's counted in its rq_done;
  // nullptr when no QP of the guest has that engine QPN (any more).
  QpObj* qp_of_completion(const nicdrv::WorkCompletion& wc);
  // The device's config space (virtio_rdma.hpp Config): GET_CONFIG and QUERY_CONFIG.
  [[nodiscard]] vd::Config config_space() const;

  std::uint32_t new_handle() {
    if (next_handle_ == 0) next_handle_ = 1;  // 0 is kNoHandle
    return next_handle_++;
  }
  // A hostile guest can make every command fail: log the first refusals of each kind
  // (commands, doorbells, work requests), then one in 1000.
  enum class Refused { command, doorbell, wqe };
  bool should_log_refusal(Refused kind) {
    auto& n = refusals_[static_cast<int>(kind)];
    return ++n <= 100 || n % 1000 == 0;
  }
  std::uint64_t refusals_[3] = {};

  std::shared_ptr<nicdrv::Device> engine;
  // DeviceAttr::reports_writes: false for a NIC (verbs), whose DMA writes no observer sees;
  // pause() then marks every page it may have written.
  bool engine_reports_writes = true;
  // DeviceAttr::reports_solicited: false for a NIC, whose completions do not say whether the
  // message was solicited; a solicited-only arm then wakes for every receive completion.
  bool engine_reports_solicited = true;
  void mark_dma_writable();
  void journal_objects() const;
  vhost::EventLoop& loop;
  RdmaDeviceOptions opts;
  vhost::DeviceHost* host = nullptr;
  std::shared_ptr<LogRef> log = std::make_shared<LogRef>();
  RdmaDeviceStats st;
  bool paused = false;
  bool polling = false;                        // poll_round() runs: engine CQs stay unarmed
  std::unordered_set<std::uint32_t> hot_cqs;   // CQs with work since polling began
  std::vector<std::uint32_t> hot_scratch;      // poll_round's copy of hot_cqs (no allocation per round)
  // The data path's working memory, grown to the largest QP seen and kept: a doorbell allocates
  // nothing (post_sq's SGEs and inline bytes, the receive rings' SGEs, retry_pending's handles).
  std::vector<nicdrv::Sge> send_sge_scratch, recv_sge_scratch;
  std::vector<std::uint8_t> inline_scratch;
  std::vector<std::uint32_t> retry_scratch;

  std::uint32_t next_handle_ = 1;
  std::unordered_map<std::uint32_t, PdObj> pds;
  std::unordered_map<std::uint32_t, MrObj> mrs;
  std::unordered_map<std::uint32_t, DmaMrObj> dma_mrs;
  std::unordered_map<std::uint32_t, const DmaMrObj*> dma_by_lkey;  // guest lkey -> its DMA region
  std::unordered_map<std::uint32_t, FastMrObj> fast_mrs;
  // Regions of every kind (REG_MR, REG_DMA_MR, ALLOC_MR): what max_mr bounds.
  [[nodiscard]] std::size_t mr_count() const { return mrs.size() + dma_mrs.size() + fast_mrs.size(); }
  // names.cpp: a fast region placed under `handle` (its PD counts it, its window is counted
  // against kMaxFastWindowBytes), and its removal.
  void add_fast_mr(std::uint32_t handle, FastMrObj mr);
  void forget_fast_mr(std::uint32_t handle);
  // The fast regions' windows together: address space only, but a guest's ALLOC_MRs must not
  // exhaust its backend's (16 TiB: some 16,000 regions of 512 pages).
  static constexpr std::uint64_t kMaxFastWindowBytes = std::uint64_t{1} << 44;
  std::uint64_t fast_window_bytes = 0;
  // names.cpp: a DMA region placed under `handle` (its PD counts it, its lkey names it), its
  // removal, and the handle of the one a PD has (nullopt: none).
  void add_dma_mr(std::uint32_t handle, DmaMrObj mr);
  void forget_dma_mr(std::uint32_t handle);
  [[nodiscard]] std::optional<std::uint32_t> dma_mr_of_pd(std::uint32_t pd) const;
  std::unordered_map<std::uint32_t, CqObj> cqs;
  std::unordered_map<std::uint32_t, QpObj> qps;
  std::unordered_map<std::uint32_t, AhObj> ahs;
  std::unordered_map<std::uint32_t, SrqObj> srqs;
  std::map<std::uint32_t, DbRingObj> db_rings;  // by number, 1..65535 (ordered: taken in turn)
  std::uint32_t next_db_ring_ = 1;
  bool db_rings_polled = false;  // the rings' headers say NO_KICK
  std::unordered_map<int, std::uint32_t> cq_by_fd;  // engine CQ event fd -> CQ handle
  std::unordered_set<std::uint32_t> pending_sq;     // QPs whose send ring waits for engine room
  std::unordered_set<std::uint32_t> pending_rq;
  std::unordered_set<std::uint32_t> pending_srq;

  struct PendingEvent {
    vd::EventType type;
    std::uint32_t handle, info;
  };
  std::deque<PendingEvent> events;
  static constexpr std::size_t kMaxEvents = 4096;
  UniqueFd retry_timer;
  bool retry_armed = false;
};

}  // namespace vrdma::device
