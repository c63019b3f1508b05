// The verbs provider's objects: thin owners of libibverbs objects. Each holds its parents
// (shared_ptr), so a parent's ibv_dealloc/ibv_destroy always runs after its children's.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "vrdma/nicdrv/device.hpp"

namespace vrdma::nicdrv::verbs {

class VerbsDevice;

// Owns an ibv_context; shared so CM code and objects can keep it alive.
struct Context {
  ibv_context* ctx = nullptr;
  std::string ibdev;
  explicit Context(ibv_context* c, std::string n) : ctx(c), ibdev(std::move(n)) {}
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
  Status check_port(std::uint8_t port) const;
  Result<LinkLayer> link_layer(std::uint8_t port) const;

 private:
  std::shared_ptr<Context> c_;
  std::string name_;
  std::uint8_t ports_ = 1;
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

 private:
  std::shared_ptr<VerbsDevice> dev_;
  ibv_pd* pd_;
};

class VerbsMr final : public MemoryRegion {
 public:
  VerbsMr(std::shared_ptr<VerbsPd> pd, ibv_mr* mr, std::uint64_t addr, Access a)
      : pd_(std::move(pd)), mr_(mr), addr_(addr), access_(a) {}
  ~VerbsMr() override { ibv_dereg_mr(mr_); }
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

 private:
  std::shared_ptr<VerbsDevice> dev_;
  ibv_comp_channel* ch_;
  ibv_cq* cq_;
  std::mutex mu_;  // ibv_poll_cq on one CQ from several threads must not interleave
};

class VerbsSrq final : public SharedReceiveQueue, public std::enable_shared_from_this<VerbsSrq> {
 public:
  VerbsSrq(std::shared_ptr<VerbsPd> pd, ibv_srq* srq, std::uint32_t max_wr, std::uint32_t max_sge)
      : pd_(std::move(pd)), srq_(srq), max_wr_(max_wr), max_sge_(max_sge) {}
  ~VerbsSrq() override { ibv_destroy_srq(srq_); }
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override;
  std::uint32_t max_wr() const noexcept override { return max_wr_; }
  ibv_srq* srq() const noexcept { return srq_; }
  const VerbsPd& pd() const noexcept { return *pd_; }

 private:
  std::shared_ptr<VerbsPd> pd_;
  ibv_srq* srq_;
  std::uint32_t max_wr_, max_sge_;
};

class VerbsQp final : public QueuePair {
 public:
  VerbsQp(std::shared_ptr<VerbsPd> pd, std::shared_ptr<VerbsCq> scq, std::shared_ptr<VerbsCq> rcq,
          std::shared_ptr<VerbsSrq> srq, ibv_qp* qp, QpType t, const QpCap& cap)
      : pd_(std::move(pd)), scq_(std::move(scq)), rcq_(std::move(rcq)), srq_(std::move(srq)), qp_(qp), type_(t),
        cap_(cap) {}
  ~VerbsQp() override { ibv_destroy_qp(qp_); }
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

 private:
  std::shared_ptr<VerbsPd> pd_;
  std::shared_ptr<VerbsCq> scq_, rcq_;
  std::shared_ptr<VerbsSrq> srq_;
  ibv_qp* qp_;
  QpType type_;
  QpCap cap_;
  // The state our own modify calls set: lets post_send refuse RESET/INIT/RTR without a system
  // call (only modify leaves those states, except the iWARP CM's move to RTS, which a stale
  // value here would refuse wrongly, so a "not ready" answer is confirmed with the NIC).
  std::atomic<QpState> set_state_{QpState::reset};
};

// ibv <-> nicdrv value mapping (values are the same by construction; see types.hpp).
QpState from_ibv(ibv_qp_state s) noexcept;
Gid gid_of(const ibv_gid& g) noexcept;
ibv_gid ibv_gid_of(const Gid& g) noexcept;
// The error for a failed libibverbs call that returned or set `err`.
Error verbs_error(int err, const std::string& what);

}  // namespace vrdma::nicdrv::verbs
