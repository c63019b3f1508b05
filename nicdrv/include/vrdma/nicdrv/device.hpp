// The nicdrv engine API: one verbs-shaped interface that every provider (soft, verbs, pv)
// implements and every other module uses.
//
// Ownership: objects are handed out as std::shared_ptr. A child keeps its parents alive
// (an MR keeps its PD, a QP its PD and CQs, everything its Device), so destruction order is
// always safe; an object is destroyed when its last owner lets go. Providers fill every call
// they lack with Errc::not_supported naming the device (see ProviderBase in provider.hpp).
//
// Threading: every object may be used from any thread. Posting and polling on one QP/CQ from
// several threads at once is safe but serialises on that object.
//
// Errors: every fallible call returns Result<T> (vrdma/common/result.hpp) with an Errc and a
// sentence. Post calls report the index of the first work request that was not posted.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/nicdrv/types.hpp"

namespace vrdma::nicdrv {

class Device;
class ProtectionDomain;

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  [[nodiscard]] virtual std::uint32_t lkey() const noexcept = 0;
  [[nodiscard]] virtual std::uint32_t rkey() const noexcept = 0;
  [[nodiscard]] virtual std::uint64_t addr() const noexcept = 0;
  [[nodiscard]] virtual std::uint64_t length() const noexcept = 0;
  [[nodiscard]] virtual Access access() const noexcept = 0;
  // Whether its keys name it now: false for a fast-registration region (alloc_mr) before its
  // first REG_MR, after a LOCAL_INV or a peer's SEND with Invalidate.
  [[nodiscard]] virtual bool valid() const noexcept { return true; }
};

class AddressHandle {
 public:
  virtual ~AddressHandle() = default;
  [[nodiscard]] virtual const AhAttr& attr() const noexcept = 0;
};

class CompletionQueue {
 public:
  virtual ~CompletionQueue() = default;
  // Moves up to out.size() completions into `out`, oldest first; returns how many.
  // Fails only if the CQ overflowed (completions were produced with no room: an application
  // error, as ibv's IBV_EVENT_CQ_ERR).
  virtual Result<std::size_t> poll(std::span<WorkCompletion> out) = 0;
  // Arms the CQ: the next completion (or the next solicited one) makes event_fd() readable.
  virtual Status req_notify(bool solicited_only = false) = 0;
  // A non-blocking eventfd to wait on with epoll/poll; read it (or call ack_events) to clear.
  [[nodiscard]] virtual int event_fd() const noexcept = 0;
  // Clears the event fd; returns the number of events consumed.
  virtual std::uint64_t ack_events() noexcept = 0;
  [[nodiscard]] virtual std::uint32_t capacity() const noexcept = 0;
};

class SharedReceiveQueue {
 public:
  virtual ~SharedReceiveQueue() = default;
  virtual Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index = nullptr) = 0;
  [[nodiscard]] virtual std::uint32_t max_wr() const noexcept = 0;

  // Live migration: the receives posted and not yet taken by a QP, in the order QPs take them,
  // as a versioned, provider-defined blob (a receive a QP is filling travels in that QP's
  // export_state()). Quiesced first (Device::quiesce), as for a QP. import_state() on an empty
  // SRQ of the same max_wr and max_sge restores them.
  virtual Result<std::vector<std::uint8_t>> export_state() const = 0;
  virtual Status import_state(std::span<const std::uint8_t> blob) = 0;
};

class QueuePair {
 public:
  virtual ~QueuePair() = default;
  [[nodiscard]] virtual std::uint32_t qp_num() const noexcept = 0;
  [[nodiscard]] virtual QpType type() const noexcept = 0;
  // ibv_modify_qp: checks the transition and the attribute mask exactly as IBA 11.2.5
  // (table of required and optional attributes per transition); a wrong mask is invalid_argument.
  virtual Status modify(const QpAttr& attr, QpAttrMask mask) = 0;
  virtual Result<QpAttr> query() const = 0;
  [[nodiscard]] virtual QpState state() const noexcept = 0;
  virtual Status post_send(std::span<const SendWr> wrs, std::size_t* bad_index = nullptr) = 0;
  virtual Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index = nullptr) = 0;

  // Live migration: the QP's complete state (attributes, PSNs, posted and unacknowledged work,
  // responder resources, timers) as a versioned, provider-defined blob. The QP must be quiesced
  // (Device::quiesce) for the export to be a consistent point. import_state() on a QP created
  // with the same QPN (QpCreateOptions::requested_qpn) in RESET restores it.
  virtual Result<std::vector<std::uint8_t>> export_state() const = 0;
  virtual Status import_state(std::span<const std::uint8_t> blob) = 0;
};

// Told of every byte range the engine itself writes into a region (RDMA WRITE and READ-response
// data, received SENDs, atomic results): how the vhost backend keeps the migration dirty log
// exact. Called on the engine thread; must be cheap and must not call back into nicdrv.
class WriteObserver {
 public:
  virtual ~WriteObserver() = default;
  virtual void on_write(std::uint64_t addr, std::uint64_t len) noexcept = 0;
};

// Handles that must be identical after a migration are requested explicitly.
struct MrOptions {
  std::uint32_t requested_key = 0;  // 0: the provider picks; else lkey == rkey == this value
  std::shared_ptr<WriteObserver> observer;  // optional
  // The address work requests and peers use for the region's first byte (ibv_reg_mr_iova);
  // none means the host address itself. Lets a backend register guest memory under guest
  // addresses, which stay the same when the guest migrates (guest-physical 0 included).
  std::optional<std::uint64_t> iova;
  // A peer's SEND with Invalidate naming this region's R_Key (from a QP in the same PD) makes
  // the region invalid: no local or remote access by its keys from then on. What a fast-
  // registered region allows (IBA 10.6.6); a region registered without it refuses such a SEND.
  bool remote_invalidate = false;
  // alloc_mr only, to carry a region across a migration: requested_key is its whole key (low
  // byte included) and, with `registered`, it starts valid as a REG_MR would have left it: the
  // `length` bytes at `addr`, named from `iova`, with `access`.
  struct Registered {
    void* addr = nullptr;
    std::uint64_t iova = 0, length = 0;
    Access access = Access::none;
  };
  std::optional<Registered> registered;
};
struct QpOptions {
  std::uint32_t requested_qpn = 0;  // 0: the provider picks
};

class ProtectionDomain {
 public:
  virtual ~ProtectionDomain() = default;
  // Registers [addr, addr+length) in place (never copied). Remote rights require local_write
  // for remote_write/remote_atomic, as in IBA 10.6.3.1.
  virtual Result<std::shared_ptr<MemoryRegion>> reg_mr(void* addr, std::size_t length, Access access,
                                                       const MrOptions& opts = {}) = 0;
  virtual Result<std::shared_ptr<QueuePair>> create_qp(const QpInitAttr& attr, const QpOptions& opts = {}) = 0;
  virtual Result<std::shared_ptr<AddressHandle>> create_ah(const AhAttr& attr) = 0;
  virtual Result<std::shared_ptr<SharedReceiveQueue>> create_srq(std::uint32_t max_wr, std::uint32_t max_sge) = 0;
  // A region for fast registration (IBA 10.6.3.4; Linux ib_alloc_mr(IB_MR_TYPE_MEM_REG)): it
  // starts invalid, holding no memory, and is given memory, rights and a key by a REG_MR work
  // request on a QP of this PD, up to `max_pages` pages (DeviceAttr::max_fast_reg_pages);
  // LOCAL_INV or a peer's SEND with Invalidate makes it invalid again. `opts` may carry an
  // observer; its keys are the provider's. Providers without it answer not_supported.
  virtual Result<std::shared_ptr<MemoryRegion>> alloc_mr(std::uint32_t max_pages, const MrOptions& opts = {}) {
    (void)max_pages, (void)opts;
    return make_error(Errc::not_supported, "alloc_mr: this provider has no fast registration (max_fast_reg_pages is 0)");
  }
  [[nodiscard]] virtual std::uint32_t handle() const noexcept = 0;
};

// Memory a device can register and move data in place. For soft and verbs these are anonymous
// pages of this process; for pv they are pages of the shared memory the virtio device sees (the
// guest RAM of a libpvverbs process), the only memory that provider can register. Code that
// allocates its buffers here runs unchanged over every provider. Page-aligned, zero-filled.
class Buffer {
 public:
  virtual ~Buffer() = default;
  [[nodiscard]] virtual std::uint8_t* data() const noexcept = 0;
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
  [[nodiscard]] std::span<std::uint8_t> bytes() const noexcept { return {data(), size()}; }
};

// Anonymous, page-aligned, zero-filled memory of this process (what soft and verbs hand out).
Result<std::shared_ptr<Buffer>> make_host_buffer(std::size_t length);

class Device : public std::enable_shared_from_this<Device> {
 public:
  virtual ~Device() = default;
  [[nodiscard]] virtual const std::string& name() const noexcept = 0;
  virtual Result<DeviceAttr> query_device() const = 0;
  virtual Result<PortAttr> query_port(std::uint8_t port = 1) const = 0;
  virtual Result<std::vector<GidEntry>> gid_table(std::uint8_t port = 1) const = 0;
  virtual Result<GidEntry> query_gid(std::uint32_t index, std::uint8_t port = 1) const = 0;
  virtual Result<std::shared_ptr<ProtectionDomain>> alloc_pd() = 0;
  virtual Result<std::shared_ptr<CompletionQueue>> create_cq(std::uint32_t cqe) = 0;
  // Memory this device can register (see Buffer). `length` is rounded up to whole pages.
  virtual Result<std::shared_ptr<Buffer>> alloc_buffer(std::size_t length) { return make_host_buffer(length); }

  // Live migration: stop sending and answering at a consistent point (every in-flight
  // packet either acknowledged or remembered for retransmission) / start again.
  virtual Status quiesce() = 0;
  virtual Status resume() = 0;
};

// The GID peers reach `dev` at: a RoCE v2 IPv4-mapped one where the device has it (a verbs
// device such as rxe lists its link-local IPv6 GID first, which a peer elsewhere may not
// route to), else the first entry of the table.
Result<GidEntry> preferred_gid(const Device& dev, std::uint8_t port = 1);

}  // namespace vrdma::nicdrv
