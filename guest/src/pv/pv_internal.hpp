// Inside the pv provider (docs/virtio-rdma.md): the device and its objects, shared by the files
// that implement them. Not an API; applications use vrdma/guest/pv.hpp or vrdma/pvverbs.h.
//   pv_device.cpp   open, the config, the device's queries, PDs, CQs and buffers
//   pv_command.cpp  control commands and doorbells
//   pv_events.cpp   the event queue (its thread) and the state area
//   pv_switch.cpp   moving the device to another backend (suspend, resume_on, migrate)
//   pv_objects.cpp  PD: memory registration, QP, AH and SRQ creation
//   pv_datapath.cpp posting (QP, SRQ) and polling (CQ)
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "vrdma/guest/pv.hpp"
#include "vrdma/virtio_rdma.hpp"

namespace vrdma::pv::detail {

namespace vd = vrdma::vrdma_dev;
using namespace vrdma::nicdrv;

inline constexpr int kCommandTimeoutMs = 10000;
inline constexpr std::uint16_t kEventBuffers = 64;
inline constexpr std::size_t kInitialStateArea = 256u << 10;

// The Errc for a status the device answered a command with.
Errc errc_of(std::uint32_t status);

// DMA memory owned by an object; freed with it.
struct Dma {
  PvTransport* t = nullptr;
  DmaArea a;
  Dma() = default;
  Dma(PvTransport* tr, DmaArea area) : t(tr), a(area) {}
  Dma(Dma&& o) noexcept : t(o.t), a(std::exchange(o.a, DmaArea{})) {}
  Dma& operator=(Dma&& o) noexcept {
    if (this != &o) {
      release();
      t = o.t;
      a = std::exchange(o.a, DmaArea{});
    }
    return *this;
  }
  ~Dma() { release(); }
  void release() {
    if (t != nullptr && a.host != nullptr) t->free_dma(a);
    a = DmaArea{};
  }
};

class PvDevice;
class PvCq;

class PvBuffer final : public Buffer {
 public:
  PvBuffer(std::shared_ptr<PvDevice> d, Dma m) : dev_(std::move(d)), m_(std::move(m)) {}
  std::uint8_t* data() const noexcept override { return m_.a.host; }
  std::size_t size() const noexcept override { return m_.a.len; }

 private:
  std::shared_ptr<PvDevice> dev_;
  Dma m_;
};

class PvDevice final : public Device {
 public:
  PvDevice(std::unique_ptr<PvTransport> t, std::string name) : t_(std::move(t)), name_(std::move(name)) {}
  // An empty CQ poll yields the core (option yield=1; the default for a vrdmad on this host).
  void set_yield_when_idle(bool y) noexcept { yield_when_idle_ = y; }
  [[nodiscard]] bool yield_when_idle() const noexcept { return yield_when_idle_; }
  // The device said it lost every object (DEVICE_FATAL): commands, doorbells and empty CQ polls
  // fail with the reason from then on; the application closes the device and opens it again.
  [[nodiscard]] bool fatal() const noexcept { return fatal_.load(std::memory_order_acquire); }
  [[nodiscard]] Error fatal_error() const {
    return make_error(Errc::io_error, name_ + ": " + fatal_why_ + "; close the device and open it again");
  }
  ~PvDevice() override;

  Status init();

  // ---- Device ----
  const std::string& name() const noexcept override { return name_; }
  Result<DeviceAttr> query_device() const override;
  Result<PortAttr> query_port(std::uint8_t port) const override;
  Result<std::vector<GidEntry>> gid_table(std::uint8_t port) const override;
  Result<GidEntry> query_gid(std::uint32_t index, std::uint8_t port) const override;
  Result<std::shared_ptr<ProtectionDomain>> alloc_pd() override;
  Result<std::shared_ptr<CompletionQueue>> create_cq(std::uint32_t cqe) override;
  Result<std::shared_ptr<Buffer>> alloc_buffer(std::size_t length) override;
  Status quiesce() override { return make_error(Errc::not_supported, name_ + ": a pv device is migrated by its backend"); }
  Status resume() override { return make_error(Errc::not_supported, name_ + ": a pv device is migrated by its backend"); }

  // ---- For the objects ----
  std::shared_ptr<PvDevice> self() { return std::static_pointer_cast<PvDevice>(shared_from_this()); }
  PvTransport& transport() { return *t_; }
  const vd::Config& config() const { return cfg_; }

  // One control command; returns the response body (pv_command.cpp).
  Result<std::vector<std::uint8_t>> command(vd::Cmd cmd, const void* body, std::size_t len, std::size_t resp_len,
                                            int timeout_ms = kCommandTimeoutMs) const;
  template <class Resp, class Req>
  Result<Resp> call(vd::Cmd cmd, const Req& req) const {
    auto r = command(cmd, &req, sizeof req, sizeof(Resp));
    if (!r) return std::move(r).error();
    Resp out;
    std::memcpy(&out, r->data(), sizeof out);
    return out;
  }
  template <class Req>
  Status call_void(vd::Cmd cmd, const Req& req) const {
    auto r = command(cmd, &req, sizeof req, 0);
    if (!r) return std::move(r).error();
    return {};
  }
  void destroy(vd::Cmd cmd, std::uint32_t handle) const;

  // One doorbell record through the shared doorbell queue, or the device's doorbell ring when
  // the device was opened with doorbells=ring (pv_command.cpp).
  Status ring(vd::DoorbellKind kind, std::uint32_t handle, std::uint32_t value);
  // Doorbells through a doorbell ring of our own from now on (docs/virtio-rdma.md "Doorbell
  // rings"): the way a process's doorbells reach the device under the guest kernel driver,
  // here for tests of the device's side. Before any CQ, QP or SRQ is made.
  Status use_db_ring();
  [[nodiscard]] std::uint32_t db_ring() const noexcept { return db_ring_; }

  // Moving to another backend (pv_switch.cpp).
  Result<std::vector<std::uint8_t>> suspend();
  Status resume_on(const std::string& socket, std::span<const std::uint8_t> state);
  Status migrate(const std::string& socket, std::chrono::milliseconds probe, bool logged);

  // The event thread (pv_events.cpp).
  void stop_events();
  void start_events() { events_ = std::thread([this] { event_thread(); }); }

  // Every other object lives in a PD: with no PD and no CQ the driver has no objects.
  void pd_opened() { ++pds_; }
  void pd_closed() { --pds_; }
  bool has_objects() {
    if (pds_.load() > 0) return true;
    std::lock_guard lk(cq_mu_);
    return !cq_by_handle_.empty();
  }

  void register_cq(std::uint32_t h, PvCq* cq) {
    std::lock_guard lk(cq_mu_);
    cq_by_handle_[h] = cq;
  }
  void unregister_cq(std::uint32_t h) {
    std::lock_guard lk(cq_mu_);
    cq_by_handle_.erase(h);
  }

 private:
  // The state area (docs/virtio-rdma.md "State in guest memory"): one zeroed, physically
  // contiguous DMA buffer kept posted on the state queue; the device returns the previous one
  // when a larger one arrives. Init and the event thread only.
  // The state area is for a migration that may never come: it takes at most an eighth of the
  // DMA memory, so that it never stands in the way of the objects the application creates.
  Status post_state_area(std::size_t bytes);
  void reap_state_areas();
  Status post_event_buffer(std::uint16_t i);
  void event_thread();

  std::unique_ptr<PvTransport> t_;
  std::string name_;
  vd::Config cfg_{};
  mutable std::mutex cmd_mu_;
  Dma cmd_;
  std::mutex db_mu_;
  Dma db_;
  std::uint32_t db_slot_ = 0;
  Status ring_record(const vd::Doorbell& d);  // under db_mu_
  static constexpr std::uint32_t kDbRingDepth = 64;
  Dma dbr_;
  std::uint32_t db_ring_ = 0, dbr_prod_ = 0;
  Dma ev_;
  std::unordered_map<std::uint16_t, std::uint16_t> ev_slot_;  // descriptor id -> event slot
  std::map<std::uint16_t, Dma> state_areas_;                  // descriptor id -> state area (posted, not returned)
  std::size_t state_area_refused_ = 0;                        // the last size that could not be posted
  bool yield_when_idle_ = false;
  int stop_fd_ = -1;
  std::thread events_;
  std::mutex cq_mu_;
  std::unordered_map<std::uint32_t, PvCq*> cq_by_handle_;
  std::atomic<int> pds_{0};
  std::string fatal_why_;  // written once, before fatal_ is set
  std::atomic<bool> fatal_{false};
};

// ---- CQ (pv_datapath.cpp) -------------------------------------------------------------------
class PvCq final : public CompletionQueue, public std::enable_shared_from_this<PvCq> {
 public:
  PvCq(std::shared_ptr<PvDevice> d, Dma ring, std::uint32_t depth, std::uint32_t handle, int efd)
      : dev_(std::move(d)), ring_(std::move(ring)), depth_(depth), handle_(handle), efd_(efd) {
    dev_->register_cq(handle_, this);
  }
  ~PvCq() override;
  Result<std::size_t> poll(std::span<WorkCompletion> out) override;
  std::size_t take(std::span<WorkCompletion> out);
  Status req_notify(bool solicited_only) override {
    return dev_->ring(vd::DoorbellKind::cq_arm, handle_, solicited_only ? 1 : 0);
  }
  int event_fd() const noexcept override { return efd_; }
  std::uint64_t ack_events() noexcept override;
  std::uint32_t capacity() const noexcept override { return depth_; }
  [[nodiscard]] std::uint32_t handle() const { return handle_; }
  [[nodiscard]] const PvDevice& device() const { return *dev_; }
  void signal();

 private:
  std::shared_ptr<PvDevice> dev_;
  Dma ring_;
  std::uint32_t depth_, handle_;
  int efd_;
  std::mutex mu_;
  std::uint32_t consumer_ = 0;
};

// ---- PD, MR, AH (pv_objects.cpp) ------------------------------------------------------------
// Page lists the device reads (REG_MR's command and WQE): the pages of 1 << shift bytes that
// hold `len` bytes (at least one) from guest-physical `gpa`...
inline std::uint64_t pages_spanned(std::uint64_t gpa, std::uint64_t len, std::uint32_t shift) {
  return ((gpa + std::max<std::uint64_t>(len, 1) - 1) >> shift) - (gpa >> shift) + 1;
}
// ...written at `out` as the device's little-endian u64 addresses.
inline void write_page_list(std::uint8_t* out, std::uint64_t gpa, std::uint64_t npages, std::uint32_t shift) {
  const std::uint64_t first = gpa >> shift << shift;
  for (std::uint64_t i = 0; i < npages; ++i) {
    const std::uint64_t p = first + (i << shift);
    std::memcpy(out + i * 8, &p, 8);
  }
}
// A region's first byte keeps its offset within the first page (the device's page arithmetic):
// iova and the buffer's guest-physical address must share it.
inline Status same_page_offset(const std::string& who, std::uint64_t iova, std::uint64_t gpa, std::uint32_t shift) {
  const std::uint64_t mask = (std::uint64_t{1} << shift) - 1;
  if ((iova & mask) == (gpa & mask)) return {};
  return make_error(Errc::invalid_argument, fmt::format("{}: iova {:#x} must have the same offset within a {}-byte page "
                                                        "as the buffer ({:#x})", who, iova, mask + 1, gpa & mask));
}
// requested_key and observer are a backend's (vrdmad's) options.
inline Status no_backend_options(const std::string& who, const MrOptions& opts) {
  if (opts.requested_key == 0 && !opts.observer) return {};
  return make_error(Errc::not_supported, who + ": requested keys and write observers are backend features, not "
                                               "available to a pv guest");
}

class PvPd;

class PvMr final : public MemoryRegion {
 public:
  PvMr(std::shared_ptr<PvPd> pd, std::shared_ptr<PvDevice> d, vd::RegMrResp r, std::uint64_t addr, std::uint64_t len,
       Access acc)
      : pd_(std::move(pd)), dev_(std::move(d)), r_(r), addr_(addr), len_(len), acc_(acc) {}
  ~PvMr() override { dev_->destroy(vd::Cmd::dereg_mr, r_.mr); }
  std::uint32_t lkey() const noexcept override { return r_.lkey; }
  std::uint32_t rkey() const noexcept override { return r_.rkey; }
  std::uint64_t addr() const noexcept override { return addr_; }
  std::uint64_t length() const noexcept override { return len_; }
  Access access() const noexcept override { return acc_; }

 private:
  std::shared_ptr<PvPd> pd_;
  std::shared_ptr<PvDevice> dev_;
  vd::RegMrResp r_;
  std::uint64_t addr_, len_;
  Access acc_;
};

// A region for fast registration (ALLOC_MR, docs/virtio-rdma.md "Fast registration"). Its page
// list lives in DMA memory of its own, which the device reads when a REG_MR WQE naming the
// region is rung in: as with Linux's ib_map_mr_sg, a region is given new pages only after its
// previous REG_MR completed. Its key and extent are those of the last REG_MR posted.
class PvFastMr final : public MemoryRegion {
 public:
  PvFastMr(std::shared_ptr<PvPd> pd, std::shared_ptr<PvDevice> d, vd::RegMrResp r, std::uint32_t max_pages, Dma list)
      : pd_(std::move(pd)), dev_(std::move(d)), r_(r), max_pages_(max_pages), list_(std::move(list)), key_(r.lkey) {}
  ~PvFastMr() override { dev_->destroy(vd::Cmd::dereg_mr, r_.mr); }
  std::uint32_t lkey() const noexcept override { return key_.load(std::memory_order_acquire); }
  std::uint32_t rkey() const noexcept override { return key_.load(std::memory_order_acquire); }
  std::uint64_t addr() const noexcept override { return iova_.load(std::memory_order_acquire); }
  std::uint64_t length() const noexcept override { return len_.load(std::memory_order_acquire); }
  Access access() const noexcept override { return acc_.load(std::memory_order_acquire); }
  [[nodiscard]] std::uint32_t handle() const { return r_.mr; }
  [[nodiscard]] std::uint32_t max_pages() const { return max_pages_; }
  [[nodiscard]] const PvDevice& device() const { return *dev_; }
  [[nodiscard]] const PvPd& pd() const { return *pd_; }
  [[nodiscard]] const Dma& page_list() const { return list_; }
  void registered(std::uint32_t key, std::uint64_t iova, std::uint64_t len, Access a) {
    iova_.store(iova, std::memory_order_release);
    len_.store(len, std::memory_order_release);
    acc_.store(a, std::memory_order_release);
    key_.store(key, std::memory_order_release);
  }

 private:
  std::shared_ptr<PvPd> pd_;
  std::shared_ptr<PvDevice> dev_;
  vd::RegMrResp r_;
  std::uint32_t max_pages_;
  Dma list_;
  std::atomic<std::uint32_t> key_;
  std::atomic<std::uint64_t> iova_{0}, len_{0};
  std::atomic<Access> acc_{Access::none};
};

class PvAh final : public AddressHandle {
 public:
  PvAh(std::shared_ptr<PvPd> pd, std::shared_ptr<PvDevice> d, std::uint32_t h, AhAttr a)
      : pd_(std::move(pd)), dev_(std::move(d)), h_(h), a_(a) {}
  ~PvAh() override { dev_->destroy(vd::Cmd::destroy_ah, h_); }
  const AhAttr& attr() const noexcept override { return a_; }
  [[nodiscard]] std::uint32_t handle() const { return h_; }
  [[nodiscard]] const PvDevice& device() const { return *dev_; }

 private:
  std::shared_ptr<PvPd> pd_;
  std::shared_ptr<PvDevice> dev_;
  std::uint32_t h_;
  AhAttr a_;
};

// A ring of WQEs the driver produces and the device consumes (send, receive, SRQ).
struct WqRing {
  Dma mem;
  std::uint32_t depth = 0, stride = 0;
  std::uint32_t produced = 0;
  std::uint8_t* slot(std::uint32_t i) const { return mem.a.host + std::uint64_t{i & (depth - 1)} * stride; }
};

// Writes receive WQEs into a receive ring or an SRQ's ring (pv_datapath.cpp).
Result<std::size_t> write_recv_wqes(WqRing& ring, const vd::QpStatus* status, bool rq, std::uint32_t max_sge,
                                    std::span<const RecvWr> wrs, std::size_t* bad, const std::string& what);

// ---- SRQ and QP (pv_datapath.cpp) -----------------------------------------------------------
class PvSrq final : public SharedReceiveQueue, public std::enable_shared_from_this<PvSrq> {
 public:
  PvSrq(std::shared_ptr<PvPd> pd, std::shared_ptr<PvDevice> d, std::uint32_t h, WqRing ring, Dma status,
        std::uint32_t max_sge)
      : pd_(std::move(pd)), dev_(std::move(d)), h_(h), ring_(std::move(ring)), status_(std::move(status)),
        max_sge_(max_sge) {}
  ~PvSrq() override { dev_->destroy(vd::Cmd::destroy_srq, h_); }
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override;
  std::uint32_t max_wr() const noexcept override { return ring_.depth; }
  Result<std::vector<std::uint8_t>> export_state() const override {
    return make_error(Errc::not_supported, dev_->name() + ": a pv SRQ's state lives in its backend (vrdmad), which migrates it");
  }
  Status import_state(std::span<const std::uint8_t>) override {
    return make_error(Errc::not_supported, dev_->name() + ": a pv SRQ's state lives in its backend (vrdmad), which migrates it");
  }
  [[nodiscard]] std::uint32_t handle() const { return h_; }
  [[nodiscard]] const PvDevice& device() const { return *dev_; }

 private:
  std::shared_ptr<PvPd> pd_;
  std::shared_ptr<PvDevice> dev_;
  std::uint32_t h_;
  WqRing ring_;
  Dma status_;
  std::uint32_t max_sge_;
  std::mutex mu_;
};

class PvQp final : public QueuePair {
 public:
  PvQp(std::shared_ptr<PvPd> pd, std::shared_ptr<PvDevice> d, std::shared_ptr<CompletionQueue> scq,
       std::shared_ptr<CompletionQueue> rcq, std::shared_ptr<SharedReceiveQueue> srq, vd::CreateQpResp r, QpType type,
       QpCap cap, WqRing sq, WqRing rq, Dma status)
      : pd_(std::move(pd)), dev_(std::move(d)), scq_(std::move(scq)), rcq_(std::move(rcq)), srq_(std::move(srq)), r_(r),
        type_(type), cap_(cap), sq_(std::move(sq)), rq_(std::move(rq)), status_(std::move(status)) {}
  ~PvQp() override { dev_->destroy(vd::Cmd::destroy_qp, r_.qp); }

  std::uint32_t qp_num() const noexcept override { return r_.qp_num; }
  QpType type() const noexcept override { return type_; }
  Status modify(const QpAttr& attr, QpAttrMask mask) override;
  Result<QpAttr> query() const override;
  // The engine changes a QP's state on its own (to ERR on a fatal error, on either side of a
  // connection), so the true state is the device's: asked over the control queue.
  QpState state() const noexcept override;
  // What posting checks without a round trip: our last modify, or ERR from the status block.
  QpState known_state() const noexcept {
    const auto* st = reinterpret_cast<const vd::QpStatus*>(status_.a.host);
    const auto dev_state = std::atomic_ref<const std::uint32_t>(st->state).load(std::memory_order_acquire);
    if (dev_state == static_cast<std::uint32_t>(QpState::err)) return QpState::err;
    return state_.load();
  }
  Status post_send(std::span<const SendWr> wrs, std::size_t* bad_index) override;
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override;
  Result<std::vector<std::uint8_t>> export_state() const override {
    return make_error(Errc::not_supported, dev_->name() + ": a pv QP's state lives in its backend (vrdmad), which migrates it");
  }
  Status import_state(std::span<const std::uint8_t>) override {
    return make_error(Errc::not_supported, dev_->name() + ": a pv QP's state lives in its backend (vrdmad), which migrates it");
  }

 private:
  std::string qp_name() const;

  std::shared_ptr<PvPd> pd_;
  std::shared_ptr<PvDevice> dev_;
  std::shared_ptr<CompletionQueue> scq_, rcq_;
  std::shared_ptr<SharedReceiveQueue> srq_;
  vd::CreateQpResp r_;
  QpType type_;
  QpCap cap_;
  WqRing sq_, rq_;
  Dma status_;
  std::mutex mu_;
  std::atomic<QpState> state_{QpState::reset};
};

// ---- PD (pv_objects.cpp) --------------------------------------------------------------------
class PvPd final : public ProtectionDomain, public std::enable_shared_from_this<PvPd> {
 public:
  PvPd(std::shared_ptr<PvDevice> d, std::uint32_t h) : dev_(std::move(d)), h_(h) { dev_->pd_opened(); }
  ~PvPd() override {
    dev_->destroy(vd::Cmd::destroy_pd, h_);
    dev_->pd_closed();
  }
  std::uint32_t handle() const noexcept override { return h_; }

  Result<std::shared_ptr<MemoryRegion>> reg_mr(void* addr, std::size_t length, Access access,
                                               const MrOptions& opts) override;
  // ALLOC_MR: a PvFastMr (the device's max_fast_reg_pages bounds max_pages).
  Result<std::shared_ptr<MemoryRegion>> alloc_mr(std::uint32_t max_pages, const MrOptions& opts) override;
  // REG_DMA_MR (pv.hpp reg_dma_mr): addr() 0 and length() the whole guest memory.
  Result<std::shared_ptr<MemoryRegion>> reg_dma_mr(Access access);
  Result<std::shared_ptr<QueuePair>> create_qp(const QpInitAttr& attr, const QpOptions& opts) override;
  Result<std::shared_ptr<AddressHandle>> create_ah(const AhAttr& attr) override;
  Result<std::shared_ptr<SharedReceiveQueue>> create_srq(std::uint32_t max_wr, std::uint32_t max_sge) override;

 private:
  std::shared_ptr<PvDevice> dev_;
  std::uint32_t h_;
};

}  // namespace vrdma::pv::detail
