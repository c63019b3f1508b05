// The verbs provider's objects: thin owners of libibverbs objects. Each holds its parents
// (shared_ptr), so a parent's ibv_dealloc/ibv_destroy always runs after its children's.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "vrdma/nicdrv/device.hpp"

namespace vrdma::nicdrv::verbs {

class VerbsDevice;
class VerbsQp;

// The first SGE of posted receives, kept where a completion must find its buffer again: the NIC
// writes a UD sender's GRH into the first 40 bytes of the receive buffer, and verbs hands out
// only the wr_id (WorkCompletion::sgid is read from there). Receives of a QP complete in order,
// so a completion retires every older entry; an SRQ's complete in any order across its QPs.
class RecvLog {
 public:
  struct Entry {
    std::uint64_t wr_id;
    std::uint64_t addr;
    std::uint32_t length;
    std::uint32_t lkey;
  };
  explicit RecvLog(bool in_order, std::size_t bound) : in_order_(in_order), bound_(bound) {}
  void add(std::span<const RecvWr> wrs);
  std::optional<Entry> take(std::uint64_t wr_id);
  void undo_last();  // the NIC refused the receive just added
  void clear();

 private:
  std::mutex mu_;
  std::deque<Entry> q_;
  bool in_order_;
  std::size_t bound_;  // an SRQ entry whose receive failed is never taken: the oldest go first
};


// Owns an ibv_context; shared so CM code and objects can keep it alive.
struct Context {
  ibv_context* ctx = nullptr;
  std::string ibdev;
  // The context's QPs by number, for its asynchronous events (a QP's fatal error arrives there
  // when no completion reports it, e.g. an iWARP TERMINATE from the peer).
  std::mutex qps_mu;
  std::unordered_map<std::uint32_t, VerbsQp*> qps;
  explicit Context(ibv_context* c, std::string n) : ctx(c), ibdev(std::move(n)) {}
  // Reads every pending asynchronous event (the fd is non-blocking) and marks the QPs that
  // went to the error state.
  void drain_async_events();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() {
    if (ctx != nullptr) ibv_close_device(ctx);
  }
};

class VerbsDevice final : public Device {
 public:
  VerbsDevice(std::shared_ptr<Context> c, std::string name);
  const std::string& name() const noexcept override { return name_; }
  Result<DeviceAttr> query_device() const override;
  Result<PortAttr> query_port(std::uint8_t port) const override;
  Result<std::vector<GidEntry>> gid_table(std::uint8_t port) const override;
  Result<GidEntry> query_gid(std::uint32_t index, std::uint8_t port) const override;
  Result<std::shared_ptr<ProtectionDomain>> alloc_pd() override;
  Result<std::shared_ptr<CompletionQueue>> create_cq(std::uint32_t cqe) override;
  Status quiesce() override;
  Status resume() override;

  ibv_context* ctx() const noexcept { return c_->ctx; }
  const std::string& ibdev() const noexcept { return c_->ibdev; }
  bool iwarp() const noexcept { return c_->ctx->device->transport_type == IBV_TRANSPORT_IWARP; }
  Context& context() const noexcept { return *c_; }
  std::uint32_t vendor_id() const noexcept { return vendor_id_; }
  std::uint32_t max_sge_rd() const noexcept { return max_sge_rd_; }
  bool atomics() const noexcept { return atomics_; }
  Status check_port(std::uint8_t port) const;
  Result<LinkLayer> link_layer(std::uint8_t port) const;

 private:
  std::shared_ptr<Context> c_;
  std::string name_;
  std::uint8_t ports_ = 1;
  bool atomics_ = false;
  std::uint32_t vendor_id_ = 0, max_sge_rd_ = 0;
};

class VerbsPd final : public ProtectionDomain, public std::enable_shared_from_this<VerbsPd> {
 public:
  VerbsPd(std::shared_ptr<VerbsDevice> d, ibv_pd* pd) : dev_(std::move(d)), pd_(pd) {}
  ~VerbsPd() override { ibv_dealloc_pd(pd_); }
  Result<std::shared_ptr<MemoryRegion>> reg_mr(void* addr, std::size_t length, Access access,
                                               const MrOptions& opts) override;
  Result<std::shared_ptr<QueuePair>> create_qp(const QpInitAttr& attr, const QpOptions& opts) override;
  Result<std::shared_ptr<AddressHandle>> create_ah(const AhAttr& attr) override;
  Result<std::shared_ptr<SharedReceiveQueue>> create_srq(std::uint32_t max_wr, std::uint32_t max_sge) override;
  std::uint32_t handle() const noexcept override { return pd_->handle; }

  ibv_pd* pd() const noexcept { return pd_; }
  VerbsDevice& dev() const noexcept { return *dev_; }

  // The process address of [addr, addr + len) under `lkey` (addr in the MR's own address space,
  // its iova if it has one), or nullptr if no MR of this PD covers it.
  std::uint8_t* host_of(std::uint32_t lkey, std::uint64_t addr, std::uint64_t len) const;
  void forget_mr(std::uint32_t lkey);

 private:
  struct MrSpan {
    std::uint64_t addr;  // as work requests address it
    std::uint8_t* host;
    std::uint64_t length;
  };
  std::shared_ptr<VerbsDevice> dev_;
  ibv_pd* pd_;
  mutable std::mutex mr_mu_;
  std::unordered_map<std::uint32_t, MrSpan> mrs_;  // by lkey
};

class VerbsMr final : public MemoryRegion {
 public:
  VerbsMr(std::shared_ptr<VerbsPd> pd, ibv_mr* mr, std::uint64_t addr, Access a)
      : pd_(std::move(pd)), mr_(mr), addr_(addr), access_(a) {}
  ~VerbsMr() override {
    pd_->forget_mr(mr_->lkey);
    ibv_dereg_mr(mr_);
  }
  std::uint32_t lkey() const noexcept override { return mr_->lkey; }
  std::uint32_t rkey() const noexcept override { return mr_->rkey; }
  std::uint64_t addr() const noexcept override { return addr_; }
  std::uint64_t length() const noexcept override { return mr_->length; }
  Access access() const noexcept override { return access_; }

 private:
  std::shared_ptr<VerbsPd> pd_;
  ibv_mr* mr_;
  std::uint64_t addr_;
  Access access_;
};

class VerbsAh final : public AddressHandle {
 public:
  VerbsAh(std::shared_ptr<VerbsPd> pd, ibv_ah* ah, const AhAttr& a) : pd_(std::move(pd)), ah_(ah), attr_(a) {}
  ~VerbsAh() override { ibv_destroy_ah(ah_); }
  const AhAttr& attr() const noexcept override { return attr_; }
  ibv_ah* ah() const noexcept { return ah_; }
  const VerbsPd& pd() const noexcept { return *pd_; }

 private:
  std::shared_ptr<VerbsPd> pd_;
  ibv_ah* ah_;
  AhAttr attr_;
};

class VerbsCq final : public CompletionQueue, public std::enable_shared_from_this<VerbsCq> {
 public:
  VerbsCq(std::shared_ptr<VerbsDevice> d, ibv_comp_channel* ch, ibv_cq* cq) : dev_(std::move(d)), ch_(ch), cq_(cq) {}
  ~VerbsCq() override;
  Result<std::size_t> poll(std::span<WorkCompletion> out) override;
  Status req_notify(bool solicited_only) override;
  int event_fd() const noexcept override { return ch_->fd; }
  std::uint64_t ack_events() noexcept override;
  std::uint32_t capacity() const noexcept override { return static_cast<std::uint32_t>(cq_->cqe); }

  ibv_cq* cq() const noexcept { return cq_; }
  const VerbsDevice& dev() const noexcept { return *dev_; }
  // QPs completing here register while they live, so a completion finds its QP by number.
  void attach(VerbsQp* qp);
  void detach(std::uint32_t qp_num);

 private:
  void annotate(const ibv_wc& w, WorkCompletion& o);

  std::shared_ptr<VerbsDevice> dev_;
  ibv_comp_channel* ch_;
  ibv_cq* cq_;
  std::mutex mu_;  // ibv_poll_cq on one CQ from several threads must not interleave
  std::mutex qps_mu_;
  std::unordered_map<std::uint32_t, VerbsQp*> qps_;
};

class VerbsSrq final : public SharedReceiveQueue, public std::enable_shared_from_this<VerbsSrq> {
 public:
  VerbsSrq(std::shared_ptr<VerbsPd> pd, ibv_srq* srq, std::uint32_t max_wr, std::uint32_t max_sge)
      : pd_(std::move(pd)), srq_(srq), max_wr_(max_wr), max_sge_(max_sge), log_(false, 2 * std::size_t{max_wr} + 64) {}
  ~VerbsSrq() override { ibv_destroy_srq(srq_); }
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override;
  std::uint32_t max_wr() const noexcept override { return max_wr_; }
  Result<std::vector<std::uint8_t>> export_state() const override;
  Status import_state(std::span<const std::uint8_t> blob) override;
  ibv_srq* srq() const noexcept { return srq_; }
  const VerbsPd& pd() const noexcept { return *pd_; }
  RecvLog& log() noexcept { return log_; }

 private:
  std::shared_ptr<VerbsPd> pd_;
  ibv_srq* srq_;
  std::uint32_t max_wr_, max_sge_;
  RecvLog log_;
};

class VerbsQp final : public QueuePair {
 public:
  VerbsQp(std::shared_ptr<VerbsPd> pd, std::shared_ptr<VerbsCq> scq, std::shared_ptr<VerbsCq> rcq,
          std::shared_ptr<VerbsSrq> srq, ibv_qp* qp, QpType t, const QpCap& cap);
  ~VerbsQp() override;
  std::uint32_t qp_num() const noexcept override { return qp_->qp_num; }
  QpType type() const noexcept override { return type_; }
  Status modify(const QpAttr& attr, QpAttrMask mask) override;
  Result<QpAttr> query() const override;
  QpState state() const noexcept override;
  Status post_send(std::span<const SendWr> wrs, std::size_t* bad_index) override;
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override;
  Result<std::vector<std::uint8_t>> export_state() const override;
  Status import_state(std::span<const std::uint8_t> blob) override;

  ibv_qp* qp() const noexcept { return qp_; }
  VerbsDevice& dev() const noexcept { return pd_->dev(); }
  std::string what() const;  // "QP 123 on verbs:mlx5_0"
  // For the CM: applies attributes it computed (rdma_init_qp_attr) and records the state.
  Status modify_raw(ibv_qp_attr& a, int mask, const char* step);
  // For the CM: a state the connection manager moved the QP to itself (iWARP: RTS after MPA).
  void note_state(QpState s) noexcept { set_state_ = s; }
  // For the device's asynchronous events: the NIC moved the QP to the error state.
  void mark_failed() noexcept { failed_ = true; }
  // For the CQ: a completion of this QP. Returns the receive's buffer entry if one was logged.
  std::optional<RecvLog::Entry> completed(std::uint64_t wr_id, bool ok, bool recv);
  const VerbsPd& pd() const noexcept { return *pd_; }

 private:
  std::shared_ptr<VerbsPd> pd_;
  std::shared_ptr<VerbsCq> scq_, rcq_;
  std::shared_ptr<VerbsSrq> srq_;
  ibv_qp* qp_;
  QpType type_;
  QpCap cap_;
  // UD receives (their GRH) when the QP has its own receive queue; with an SRQ, the SRQ's log.
  std::unique_ptr<RecvLog> log_;
  // iWARP devices may not report QP state (siw's query_qp never fills it): then the state is
  // what modify and the CM set, and ERR once an error completion was polled (IBA 10.7.3.1, RFC
  // 5040 7.2: an RC QP whose work request failed is in the error state).
  std::atomic<bool> failed_{false};
  // The state our own modify calls set: lets post_send refuse RESET/INIT/RTR without a system
  // call (only modify leaves those states, except the iWARP CM's move to RTS, which a stale
  // value here would refuse wrongly, so a "not ready" answer is confirmed with the NIC).
  std::atomic<QpState> set_state_{QpState::reset};
};

// Copies the SGEs a work request's NIC entry needs (those of non-zero length) into `out`.
int copy_sges(std::span<const Sge> in, ibv_sge* out) noexcept;

// ibv <-> nicdrv value mapping (values are the same by construction; see types.hpp).
QpState from_ibv(ibv_qp_state s) noexcept;
Gid gid_of(const ibv_gid& g) noexcept;
ibv_gid ibv_gid_of(const Gid& g) noexcept;
// An address handle's attributes as libibverbs takes them (RoCE: always with a GRH); qp.cpp.
ibv_ah_attr ah_of(const AhAttr& a);
// The error for a failed libibverbs call that returned or set `err`.
Error verbs_error(int err, const std::string& what);

}  // namespace vrdma::nicdrv::verbs
