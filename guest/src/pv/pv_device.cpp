// The pv provider: nicdrv objects as a driver of the virtio RDMA device (docs/virtio-rdma.md).
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "vrdma/common/log.hpp"
#include "vrdma/guest/pv.hpp"
#include "vrdma/vhost/virtio_rdma.hpp"
#include "vrdma/vhost/virtio_rdma_conv.hpp"

namespace vrdma::pv {
namespace {

namespace vd = vrdma::vrdma_dev;
using namespace vrdma::nicdrv;

constexpr int kCommandTimeoutMs = 10000;
constexpr std::uint16_t kEventBuffers = 64;
constexpr std::size_t kInitialStateArea = 256u << 10;

Errc errc_of(std::uint32_t status) {
  switch (static_cast<vd::Status>(status)) {
    case vd::Status::perm: return Errc::access_denied;
    case vd::Status::not_found: return Errc::not_found;
    case vd::Status::no_memory: return Errc::no_memory;
    case vd::Status::fault: return Errc::invalid_argument;
    case vd::Status::busy: return Errc::busy;
    case vd::Status::invalid: return Errc::invalid_argument;
    case vd::Status::no_space: return Errc::limit_exceeded;
    case vd::Status::not_supported: return Errc::not_supported;
    default: return Errc::io_error;
  }
}

class PvDevice;

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

class PvBuffer final : public Buffer {
 public:
  PvBuffer(std::shared_ptr<PvDevice> d, Dma m) : dev_(std::move(d)), m_(std::move(m)) {}
  std::uint8_t* data() const noexcept override { return m_.a.host; }
  std::size_t size() const noexcept override { return m_.a.len; }

 private:
  std::shared_ptr<PvDevice> dev_;
  Dma m_;
};

class PvCq;

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
  ~PvDevice() override {
    if (stop_fd_ >= 0) {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto w = ::write(stop_fd_, &one, sizeof one);
    }
    if (events_.joinable()) events_.join();
    if (stop_fd_ >= 0) ::close(stop_fd_);
  }

  Status init() {
    auto cfg = t_->read_config(0, sizeof(vd::Config));
    if (!cfg) return std::move(cfg).error();
    // Behind a carrier (QEMU's vhost-user-blk) the config space is a blk-sized window with our
    // signature at offset 8; the whole Config then comes from QUERY_CONFIG (docs/virtio-rdma.md).
    bool carrier = false;
    std::uint32_t sig0 = 0;
    if (cfg->size() >= sizeof sig0) std::memcpy(&sig0, cfg->data(), sizeof sig0);
    if (sig0 != vd::kSignature && cfg->size() >= sizeof(vd::CarrierConfig)) {
      vd::CarrierConfig w;
      std::memcpy(&w, cfg->data(), sizeof w);
      if (w.signature != vd::kSignature || w.blk_capacity != 0)
        return make_error(Errc::no_device, fmt::format("{} is not a virtio RDMA device (config signature {:#x}, carrier "
                                                       "signature {:#x})", name_, sig0, w.signature));
      if (w.config_size < sizeof(vd::Config))
        return make_error(Errc::protocol_error, fmt::format("{}: the carrier window announces a {}-byte config; a virtio "
                                                            "RDMA config has {}", name_, w.config_size, sizeof(vd::Config)));
      carrier = true;
    } else {
      if (cfg->size() < sizeof(vd::Config))
        return make_error(Errc::protocol_error, "the device's config space is too short for a virtio RDMA device");
      std::memcpy(&cfg_, cfg->data(), sizeof cfg_);
    }
    auto req = t_->alloc_dma(4096);
    if (!req) return std::move(req).error();
    cmd_ = Dma(t_.get(), *req);
    if (carrier) {
      auto full = command(vd::Cmd::query_config, nullptr, 0, sizeof(vd::Config));
      if (!full) return std::move(full).error();
      std::memcpy(&cfg_, full->data(), sizeof cfg_);
    }
    if (cfg_.signature != vd::kSignature)
      return make_error(Errc::no_device, fmt::format("{} is not a virtio RDMA device (config signature {:#x})", name_,
                                                     cfg_.signature));
    if (cfg_.version != vd::kVersion)
      return make_error(Errc::not_supported, fmt::format("{} speaks virtio RDMA version {}; this driver speaks {}", name_,
                                                         cfg_.version, vd::kVersion));
    auto db = t_->alloc_dma(256 * sizeof(vd::Doorbell));
    if (!db) return std::move(db).error();
    db_ = Dma(t_.get(), *db);
    auto ev = t_->alloc_dma(kEventBuffers * sizeof(vd::Event));
    if (!ev) return std::move(ev).error();
    ev_ = Dma(t_.get(), *ev);
    for (std::uint16_t i = 0; i < kEventBuffers; ++i) VRDMA_TRY(post_event_buffer(i));
    VRDMA_TRY(t_->publish_and_kick(vd::kEventQueue));
    if (const std::size_t room = t_->dma_bytes() / 8 / 4096 * 4096;
        t_->num_queues() > vd::kStateQueue && room >= vd::kMinStateArea)
      VRDMA_TRY(post_state_area(std::min(kInitialStateArea, room)));
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd_ < 0) return errno_error(errno, "eventfd");
    events_ = std::thread([this] { event_thread(); });
    return {};
  }

  // ---- Device ----
  const std::string& name() const noexcept override { return name_; }
  Result<DeviceAttr> query_device() const override;
  Result<PortAttr> query_port(std::uint8_t port) const override;
  Result<std::vector<GidEntry>> gid_table(std::uint8_t port) const override;
  Result<GidEntry> query_gid(std::uint32_t index, std::uint8_t port) const override;
  Result<std::shared_ptr<ProtectionDomain>> alloc_pd() override;
  Result<std::shared_ptr<CompletionQueue>> create_cq(std::uint32_t cqe) override;
  Result<std::shared_ptr<Buffer>> alloc_buffer(std::size_t length) override {
    auto a = t_->alloc_dma(length);
    if (!a) return std::move(a).error();
    return std::shared_ptr<Buffer>(std::make_shared<PvBuffer>(self(), Dma(t_.get(), *a)));
  }
  Status quiesce() override { return make_error(Errc::not_supported, name_ + ": a pv device is migrated by its backend"); }
  Status resume() override { return make_error(Errc::not_supported, name_ + ": a pv device is migrated by its backend"); }

  // ---- For the objects ----
  std::shared_ptr<PvDevice> self() { return std::static_pointer_cast<PvDevice>(shared_from_this()); }
  PvTransport& transport() { return *t_; }
  const vd::Config& config() const { return cfg_; }

  // One control command; returns the response body.
  Result<std::vector<std::uint8_t>> command(vd::Cmd cmd, const void* body, std::size_t len, std::size_t resp_len,
                                            int timeout_ms = kCommandTimeoutMs) const {
    if (fatal()) return fatal_error();
    std::lock_guard lk(cmd_mu_);
    const std::size_t req_len = sizeof(vd::CmdHeader) + len;
    const std::size_t rsp_len = sizeof(vd::RespHeader) + std::max<std::size_t>(resp_len, vd::kMaxErrorMessage);
    if (req_len + rsp_len > cmd_.a.len) return make_error(Errc::invalid_argument, "control command too large");
    vd::CmdHeader h{static_cast<std::uint32_t>(cmd), 0};
    std::memcpy(cmd_.a.host, &h, sizeof h);
    if (len > 0) std::memcpy(cmd_.a.host + sizeof h, body, len);
    std::memset(cmd_.a.host + 2048, 0, rsp_len);
    const ChainBuf bufs[2] = {{cmd_.a.gpa, static_cast<std::uint32_t>(req_len), false},
                              {cmd_.a.gpa + 2048, static_cast<std::uint32_t>(rsp_len), true}};
    auto id = t_->add(vd::kControlQueue, bufs);
    if (!id) return std::move(id).error();
    VRDMA_TRY(t_->publish_and_kick(vd::kControlQueue));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      if (auto u = t_->get_used(vd::kControlQueue)) {
        if (u->second < sizeof(vd::RespHeader))
          return make_error(Errc::protocol_error, fmt::format("{}: the device answered {} with {} bytes", name_,
                                                              vd::cmd_name(static_cast<std::uint32_t>(cmd)), u->second));
        vd::RespHeader r;
        std::memcpy(&r, cmd_.a.host + 2048, sizeof r);
        if (r.status != 0) {
          std::string why;
          if (r.msg_len > 0 && u->second >= sizeof r)
            why.assign(reinterpret_cast<const char*>(cmd_.a.host + 2048 + sizeof r),
                       std::min<std::size_t>({r.msg_len, u->second - sizeof r, vd::kMaxErrorMessage}));
          return make_error(errc_of(r.status),
                            fmt::format("{}: the device refused {} ({}): {}", name_,
                                        vd::cmd_name(static_cast<std::uint32_t>(cmd)), std::strerror(static_cast<int>(r.status)),
                                        why.empty() ? std::string("see vrdmad's log") : why));
        }
        const std::size_t got = u->second - sizeof r;
        std::vector<std::uint8_t> out(resp_len, 0);
        if (resp_len > 0) std::memcpy(out.data(), cmd_.a.host + 2048 + sizeof r, std::min(got, resp_len));
        return out;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        return make_error(Errc::timeout, fmt::format("{}: the device did not answer {} within {} ms; is vrdmad alive?", name_,
                                                     vd::cmd_name(static_cast<std::uint32_t>(cmd)), timeout_ms));
      pollfd p{t_->call_fd(vd::kControlQueue), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 100))) > 0) {
        std::uint64_t n;
        [[maybe_unused]] auto r = ::read(p.fd, &n, sizeof n);
      }
    }
  }
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
  void destroy(vd::Cmd cmd, std::uint32_t handle) const {
    if (fatal()) return;  // the device has no objects any more
    auto s = call_void(cmd, vd::HandleReq{handle, 0});
    if (!s.ok()) log::warn("pv: {} {} failed: {}", vd::cmd_name(static_cast<std::uint32_t>(cmd)), handle, s.error().message);
  }

  // One doorbell record through the shared doorbell queue.
  Status ring(vd::DoorbellKind kind, std::uint32_t handle, std::uint32_t value) {
    if (fatal()) return fatal_error();
    std::lock_guard lk(db_mu_);
    while (t_->get_used(vd::kDoorbellQueue)) {
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kCommandTimeoutMs);
    while (t_->free_slots(vd::kDoorbellQueue) == 0) {
      if (t_->get_used(vd::kDoorbellQueue)) continue;
      if (std::chrono::steady_clock::now() > deadline)
        return make_error(Errc::timeout, name_ + ": the device takes no doorbells; is vrdmad alive?");
      pollfd p{t_->call_fd(vd::kDoorbellQueue), POLLIN, 0};
      (void)::poll(&p, 1, 10);
    }
    // Doorbell slots are reused round-robin: the queue has 256 descriptors and 256 slots, and
    // the device returns chains in order, so with a free descriptor the slot 256 doorbells back
    // has been consumed.
    const std::uint32_t slot = db_slot_++ % 256;
    vd::Doorbell d{handle, static_cast<std::uint16_t>(kind), 0, value, 0};
    std::memcpy(db_.a.host + slot * sizeof d, &d, sizeof d);
    const ChainBuf b{db_.a.gpa + slot * sizeof d, sizeof d, false};
    auto id = t_->add(vd::kDoorbellQueue, std::span(&b, 1));
    if (!id) return std::move(id).error();
    return t_->publish_and_kick(vd::kDoorbellQueue);
  }

  Result<std::vector<std::uint8_t>> suspend() {
    std::lock_guard lk(cmd_mu_);
    return t_->suspend();
  }
  Status resume_on(const std::string& socket, std::span<const std::uint8_t> state) {
    std::lock_guard lk(cmd_mu_);
    stop_events();
    std::lock_guard dk(db_mu_);
    auto s = t_->resume_on(socket, state);
    start_events();
    return s;
  }
  Status migrate(const std::string& socket, std::chrono::milliseconds probe, bool logged) {
    {
      std::lock_guard lk(cmd_mu_);
      // Connected and given the memory while the guest still runs here: the switch itself only
      // stops the rings here and starts them there.
      if (auto s = t_->prepare_on(socket); !s.ok())
        return make_error(Errc::io_error, "the new backend at " + socket + " could not take the device (nothing was "
                                          "stopped; it runs on here): " + s.error().message);
      stop_events();
      std::lock_guard dk(db_mu_);  // posting waits meanwhile, like a stopped vCPU
      if (auto s = t_->stop_rings(logged); !s.ok()) {
        start_events();
        return s;
      }
      if (auto s = t_->start_on(socket); !s.ok()) {
        auto back = t_->restart_here();
        start_events();
        if (!back.ok()) return make_error(Errc::io_error, s.error().message + "; and restarting here failed too: " + back.error().message);
        return make_error(Errc::io_error, "the new backend at " + socket + " could not take the device (it runs on here): " + s.error().message);
      }
      start_events();
    }
    // The new backend answers commands only once it holds the device state.
    auto q = command(vd::Cmd::query_config, nullptr, 0, sizeof(vd::Config), static_cast<int>(probe.count()));
    if (q) {
      std::lock_guard lk(cmd_mu_);
      t_->commit_switch();
      return {};
    }
    std::lock_guard lk(cmd_mu_);
    stop_events();
    std::lock_guard dk(db_mu_);
    auto back = t_->restart_here();
    if (back.ok()) {
      // The unanswered probe now runs here: take its answer off the ring before anything else.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!t_->get_used(vd::kControlQueue) && std::chrono::steady_clock::now() < until) ::usleep(1000);
    }
    start_events();
    if (!back.ok()) return make_error(Errc::io_error, q.error().message + "; and restarting here failed too: " + back.error().message);
    return make_error(Errc::timeout, "the new backend at " + socket + " did not run the device within " +
                                         std::to_string(probe.count()) + " ms (see its log); it runs on here: " +
                                         q.error().message);
  }
  void stop_events() {
    if (!events_.joinable()) return;
    const std::uint64_t one = 1;
    [[maybe_unused]] auto w = ::write(stop_fd_, &one, sizeof one);
    events_.join();
    std::uint64_t n;
    [[maybe_unused]] auto r = ::read(stop_fd_, &n, sizeof n);
  }
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
  Status post_state_area(std::size_t bytes) {
    if (bytes > t_->dma_bytes() / 8)
      return make_error(Errc::no_memory,
                        fmt::format("a state area may take an eighth of the device's DMA memory ({} KiB of {} MiB); "
                                    "open the device with a larger ram_mib",
                                    t_->dma_bytes() / 8 >> 10, t_->dma_bytes() >> 20));
    auto a = t_->alloc_dma(bytes);
    if (!a) return std::move(a).error();
    Dma area(t_.get(), *a);
    const ChainBuf b{area.a.gpa, static_cast<std::uint32_t>(area.a.len), true};
    auto id = t_->add(vd::kStateQueue, std::span(&b, 1));
    if (!id) return std::move(id).error();
    state_areas_[*id] = std::move(area);
    return t_->publish_and_kick(vd::kStateQueue);
  }
  void reap_state_areas() {
    if (t_->num_queues() <= vd::kStateQueue) return;
    while (auto u = t_->get_used(vd::kStateQueue)) state_areas_.erase(u->first);
  }
  Status post_event_buffer(std::uint16_t i) {
    const ChainBuf b{ev_.a.gpa + i * sizeof(vd::Event), sizeof(vd::Event), true};
    auto id = t_->add(vd::kEventQueue, std::span(&b, 1));
    if (!id) return std::move(id).error();
    ev_slot_[*id] = i;
    return {};
  }
  void event_thread();

  std::unique_ptr<PvTransport> t_;
  std::string name_;
  vd::Config cfg_{};
  mutable std::mutex cmd_mu_;
  Dma cmd_;
  std::mutex db_mu_;
  Dma db_;
  std::uint32_t db_slot_ = 0;
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

// ---- CQ -------------------------------------------------------------------------------------
class PvCq final : public CompletionQueue, public std::enable_shared_from_this<PvCq> {
 public:
  PvCq(std::shared_ptr<PvDevice> d, Dma ring, std::uint32_t depth, std::uint32_t handle, int efd)
      : dev_(std::move(d)), ring_(std::move(ring)), depth_(depth), handle_(handle), efd_(efd) {
    dev_->register_cq(handle_, this);
  }
  ~PvCq() override {
    dev_->unregister_cq(handle_);
    dev_->destroy(vd::Cmd::destroy_cq, handle_);
    ::close(efd_);
  }
  Result<std::size_t> poll(std::span<WorkCompletion> out) override {
    const std::size_t n = take(out);
    if (n == 0 && dev_->fatal()) return dev_->fatal_error();
    // Nothing yet: the backend that produces it may be waiting for this core (vrdmad and the
    // engine's thread on a host whose cores are shared). An empty poll hands the core over.
    if (n == 0 && !out.empty() && dev_->yield_when_idle()) ::sched_yield();
    return n;
  }
  std::size_t take(std::span<WorkCompletion> out) {
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    auto* ctl = reinterpret_cast<vd::CqControl*>(ring_.a.host);
    auto* cqes = reinterpret_cast<vd::Cqe*>(ring_.a.host + vd::kCqeOffset);
    while (n < out.size()) {
      vd::Cqe& c = cqes[consumer_ & (depth_ - 1)];
      const auto owner = std::atomic_ref<std::uint8_t>(c.owner).load(std::memory_order_acquire);
      if (owner != vd::cqe_phase(consumer_, depth_)) break;
      WorkCompletion& wc = out[n++];
      wc = WorkCompletion{};
      wc.wr_id = c.wr_id;
      wc.status = static_cast<WcStatus>(c.status);
      wc.opcode = static_cast<WcOpcode>(c.opcode);
      wc.vendor_err = c.vendor_err;
      wc.byte_len = c.byte_len;
      wc.imm_data = c.imm_data;
      wc.qp_num = c.qp_num;
      wc.src_qp = c.src_qp;
      wc.wc_flags = ((c.wc_flags & vd::kWcWithImm) ? WcFlags::with_imm : WcFlags::none) |
                    ((c.wc_flags & vd::kWcGrh) ? WcFlags::grh : WcFlags::none);
      ++consumer_;
    }
    if (n > 0) std::atomic_ref<std::uint32_t>(ctl->consumer).store(consumer_, std::memory_order_release);
    return n;
  }
  Status req_notify(bool solicited_only) override {
    return dev_->ring(vd::DoorbellKind::cq_arm, handle_, solicited_only ? 1 : 0);
  }
  int event_fd() const noexcept override { return efd_; }
  std::uint64_t ack_events() noexcept override {
    std::uint64_t n = 0;
    if (::read(efd_, &n, sizeof n) != sizeof n) return 0;
    return n;
  }
  std::uint32_t capacity() const noexcept override { return depth_; }
  [[nodiscard]] std::uint32_t handle() const { return handle_; }
  [[nodiscard]] const PvDevice& device() const { return *dev_; }
  void signal() {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto w = ::write(efd_, &one, sizeof one);
  }

 private:
  std::shared_ptr<PvDevice> dev_;
  Dma ring_;
  std::uint32_t depth_, handle_;
  int efd_;
  std::mutex mu_;
  std::uint32_t consumer_ = 0;
};

void PvDevice::event_thread() {
  const int call = t_->call_fd(vd::kEventQueue);
  for (;;) {
    pollfd p[2] = {{call, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, 200) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if (p[0].revents != 0) {
      std::uint64_t n;
      [[maybe_unused]] auto r = ::read(call, &n, sizeof n);
    }
    bool reposted = false;
    while (auto u = t_->get_used(vd::kEventQueue)) {
      auto it = ev_slot_.find(u->first);
      if (it == ev_slot_.end()) continue;
      const std::uint16_t slot = it->second;
      ev_slot_.erase(it);
      vd::Event e{};
      if (u->second >= sizeof e) std::memcpy(&e, ev_.a.host + slot * sizeof e, sizeof e);
      if (e.type == static_cast<std::uint32_t>(vd::EventType::cq_completion) ||
          e.type == static_cast<std::uint32_t>(vd::EventType::cq_error)) {
        std::lock_guard ck(cq_mu_);
        if (auto c = cq_by_handle_.find(e.handle); c != cq_by_handle_.end()) c->second->signal();
      } else if (e.type == static_cast<std::uint32_t>(vd::EventType::device_fatal) &&
                 e.info == vd::kFatalBackendRestarted && !has_objects()) {
        log::info("pv: {}: the device's backend restarted; this driver had no RDMA objects, so nothing was lost", name_);
      } else if (e.type == static_cast<std::uint32_t>(vd::EventType::device_fatal)) {
        if (!fatal()) {
          fatal_why_ = e.info == vd::kFatalObjectsLost
                           ? "the device lost every RDMA object in a migration (the state could not come; the "
                             "backend's log says why)"
                       : e.info == vd::kFatalBackendRestarted
                           ? "the device's backend restarted (it was killed or crashed) and every RDMA object died "
                             "with it; the RDMA peers see their connections fail"
                           : fmt::format("the device failed (DEVICE_FATAL, info {})", e.info);
          fatal_.store(true, std::memory_order_release);
          log::error("pv: {}: {}", name_, fatal_why_);
        }
        std::lock_guard ck(cq_mu_);
        for (auto& [h, cq] : cq_by_handle_) cq->signal();  // waiters wake and see the error
      } else if (e.type == static_cast<std::uint32_t>(vd::EventType::state_area_small)) {
        const std::size_t want = std::clamp<std::size_t>(std::size_t{e.info} << 10, vd::kMinStateArea, vd::kMaxStateArea);
        if (auto s = post_state_area(want); !s.ok() && want != state_area_refused_) {
          state_area_refused_ = want;  // said once per size
          log::error("pv: {}: the device needs a {} KiB state area for live migration, but: {}", name_, want >> 10,
                     s.error().message);
        }
      } else if (e.type != 0) {
        log::info("pv: {}: device event {} for object {} (info {})", name_, e.type, e.handle, e.info);
      }
      if (post_event_buffer(slot).ok()) reposted = true;
    }
    if (reposted) (void)t_->publish_and_kick(vd::kEventQueue);
    reap_state_areas();
  }
}

// ---- PD, MR, AH -----------------------------------------------------------------------------
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

Result<std::size_t> write_recv_wqes(WqRing& ring, const vd::QpStatus* status, bool rq, std::uint32_t max_sge,
                                    std::span<const RecvWr> wrs, std::size_t* bad, const std::string& what) {
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const std::uint32_t consumed =
        std::atomic_ref<const std::uint32_t>(rq ? status->rq_consumed : status->rq_consumed).load(std::memory_order_acquire);
    if (ring.produced - consumed >= ring.depth) {
      if (bad) *bad = i;
      return make_error(Errc::no_memory, fmt::format("{}: receive ring is full ({} work requests)", what, ring.depth));
    }
    if (wrs[i].sg_list.size() > max_sge) {
      if (bad) *bad = i;
      return make_error(Errc::invalid_argument, fmt::format("{}: {} SGEs exceed max_recv_sge {}", what,
                                                            wrs[i].sg_list.size(), max_sge));
    }
    auto* p = ring.slot(ring.produced);
    vd::RecvWqe w{wrs[i].wr_id, static_cast<std::uint32_t>(wrs[i].sg_list.size()), 0};
    std::memcpy(p, &w, sizeof w);
    for (std::size_t k = 0; k < wrs[i].sg_list.size(); ++k) {
      const auto& s = wrs[i].sg_list[k];
      vd::WireSge ws{s.addr, s.length, s.lkey};
      std::memcpy(p + sizeof w + k * sizeof ws, &ws, sizeof ws);
    }
    ++ring.produced;
  }
  return wrs.size();
}

class PvSrq final : public SharedReceiveQueue, public std::enable_shared_from_this<PvSrq> {
 public:
  PvSrq(std::shared_ptr<PvPd> pd, std::shared_ptr<PvDevice> d, std::uint32_t h, WqRing ring, Dma status,
        std::uint32_t max_sge)
      : pd_(std::move(pd)), dev_(std::move(d)), h_(h), ring_(std::move(ring)), status_(std::move(status)),
        max_sge_(max_sge) {}
  ~PvSrq() override { dev_->destroy(vd::Cmd::destroy_srq, h_); }
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override {
    std::lock_guard lk(mu_);
    const auto* st = reinterpret_cast<const vd::QpStatus*>(status_.a.host);
    auto n = write_recv_wqes(ring_, st, true, max_sge_, wrs, bad_index, dev_->name() + " SRQ");
    Status s = dev_->ring(vd::DoorbellKind::srq, h_, ring_.produced);
    if (!n) return std::move(n).error();
    return s;
  }
  std::uint32_t max_wr() const noexcept override { return ring_.depth; }
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
  Status modify(const QpAttr& attr, QpAttrMask mask) override {
    vd::ModifyQpReq m{};
    m.qp = r_.qp;
    m.mask = static_cast<std::uint32_t>(mask);
    m.attr = vd::qp_attr_to_wire(attr);
    VRDMA_TRY(dev_->call_void(vd::Cmd::modify_qp, m));
    if (any(mask & QpAttrMask::state)) state_.store(attr.qp_state);
    return {};
  }
  Result<QpAttr> query() const override {
    auto w = dev_->call<vd::QpAttrWire>(vd::Cmd::query_qp, vd::HandleReq{r_.qp, 0});
    if (!w) return std::move(w).error();
    auto a = vd::qp_attr_from_wire(*w);
    if (!a) return make_error(Errc::protocol_error, dev_->name() + ": the device answered QUERY_QP with bad values");
    return *a;
  }
  // The engine changes a QP's state on its own (to ERR on a fatal error, on either side of a
  // connection), so the true state is the device's: asked over the control queue.
  QpState state() const noexcept override {
    auto w = dev_->call<vd::QpAttrWire>(vd::Cmd::query_qp, vd::HandleReq{r_.qp, 0});
    if (w && w->qp_state <= static_cast<std::uint8_t>(QpState::err)) return static_cast<QpState>(w->qp_state);
    return known_state();
  }
  // What posting checks without a round trip: our last modify, or ERR from the status block.
  QpState known_state() const noexcept {
    const auto* st = reinterpret_cast<const vd::QpStatus*>(status_.a.host);
    const auto dev_state = std::atomic_ref<const std::uint32_t>(st->state).load(std::memory_order_acquire);
    if (dev_state == static_cast<std::uint32_t>(QpState::err)) return QpState::err;
    return state_.load();
  }
  Status post_send(std::span<const SendWr> wrs, std::size_t* bad_index) override;
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override {
    if (srq_) {
      if (bad_index) *bad_index = 0;
      return make_error(Errc::invalid_argument, qp_name() + " takes its receives from an SRQ; post to the SRQ");
    }
    if (known_state() == QpState::reset) {
      if (bad_index) *bad_index = 0;
      return make_error(Errc::bad_state, qp_name() + " is in RESET; post_recv needs INIT or later");
    }
    std::lock_guard lk(mu_);
    const auto* st = reinterpret_cast<const vd::QpStatus*>(status_.a.host);
    auto n = write_recv_wqes(rq_, st, true, cap_.max_recv_sge, wrs, bad_index, qp_name());
    Status s = dev_->ring(vd::DoorbellKind::rq, r_.qp, rq_.produced);
    if (!n) return std::move(n).error();
    return s;
  }
  Result<std::vector<std::uint8_t>> export_state() const override {
    return make_error(Errc::not_supported, dev_->name() + ": a pv QP's state lives in its backend (vrdmad), which migrates it");
  }
  Status import_state(std::span<const std::uint8_t>) override {
    return make_error(Errc::not_supported, dev_->name() + ": a pv QP's state lives in its backend (vrdmad), which migrates it");
  }

 private:
  std::string qp_name() const { return fmt::format("{} QP {:#x}", dev_->name(), r_.qp_num); }

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

Status PvQp::post_send(std::span<const SendWr> wrs, std::size_t* bad_index) {
  auto fail = [&](std::size_t i, Error e) -> Status {
    if (bad_index) *bad_index = i;
    return e;
  };
  const QpState s = known_state();
  if (s == QpState::reset || s == QpState::init || s == QpState::rtr)
    return fail(0, make_error(Errc::bad_state, qp_name() + " is in " + std::string(to_string(s)) +
                                                   "; post_send needs RTS (move the QP through INIT, RTR, RTS first)"));
  std::lock_guard lk(mu_);
  const auto* st = reinterpret_cast<const vd::QpStatus*>(status_.a.host);
  std::size_t i = 0;
  Status result;
  for (; i < wrs.size(); ++i) {
    const SendWr& wr = wrs[i];
    const std::uint32_t consumed = std::atomic_ref<const std::uint32_t>(st->sq_consumed).load(std::memory_order_acquire);
    if (sq_.produced - consumed >= sq_.depth) {
      result = fail(i, make_error(Errc::no_memory, fmt::format("{}: send queue is full ({} work requests); poll the CQ "
                                                               "before posting more", qp_name(), sq_.depth)));
      break;
    }
    const bool inl = has(wr.flags, SendFlags::inline_data);
    std::uint64_t total = 0;
    for (const auto& g : wr.sg_list) total += g.length;
    if (inl && total > cap_.max_inline_data) {
      result = fail(i, make_error(Errc::invalid_argument, fmt::format("{}: inline data of {} bytes exceeds max_inline_data {}",
                                                                      qp_name(), total, cap_.max_inline_data)));
      break;
    }
    if (!inl && wr.sg_list.size() > cap_.max_send_sge) {
      result = fail(i, make_error(Errc::invalid_argument, fmt::format("{}: {} SGEs exceed max_send_sge {}", qp_name(),
                                                                      wr.sg_list.size(), cap_.max_send_sge)));
      break;
    }
    if (type_ == QpType::ud && (wr.opcode != WrOpcode::send && wr.opcode != WrOpcode::send_with_imm)) {
      result = fail(i, make_error(Errc::invalid_argument, qp_name() + ": UD QPs carry only SEND and SEND_WITH_IMM, not " +
                                                              std::string(to_string(wr.opcode))));
      break;
    }
    if (type_ == QpType::ud && wr.ud.ah == nullptr) {
      result = fail(i, make_error(Errc::invalid_argument, qp_name() + ": a UD send needs an address handle"));
      break;
    }
    auto* p = sq_.slot(sq_.produced);
    vd::SendWqe w{};
    w.wr_id = wr.wr_id;
    w.opcode = static_cast<std::uint8_t>(wr.opcode);
    w.flags = static_cast<std::uint8_t>((has(wr.flags, SendFlags::fence) ? vd::kSendFence : 0) |
                                        (has(wr.flags, SendFlags::signaled) ? vd::kSendSignaled : 0) |
                                        (has(wr.flags, SendFlags::solicited) ? vd::kSendSolicited : 0) |
                                        (inl ? vd::kSendInline : 0));
    w.imm_data = wr.imm_data;
    const bool atomic = wr.opcode == WrOpcode::atomic_cmp_and_swp || wr.opcode == WrOpcode::atomic_fetch_and_add;
    w.remote_addr = atomic ? wr.atomic.remote_addr : wr.rdma.remote_addr;
    w.rkey = atomic ? wr.atomic.rkey : wr.rdma.rkey;
    w.compare_add = wr.atomic.compare_add;
    w.swap = wr.atomic.swap;
    if (type_ == QpType::ud) {
      const auto* ah = dynamic_cast<const PvAh*>(wr.ud.ah);
      if (ah == nullptr || &ah->device() != dev_.get()) {
        result = fail(i, make_error(Errc::invalid_argument, qp_name() + ": the address handle belongs to another device"));
        break;
      }
      w.ah = ah->handle();
      w.remote_qpn = wr.ud.remote_qpn;
      w.remote_qkey = wr.ud.remote_qkey;
    }
    if (inl) {
      std::uint32_t off = 0;
      for (const auto& g : wr.sg_list) {
        if (g.length > 0) std::memcpy(p + sizeof w + off, reinterpret_cast<const void*>(g.addr), g.length);
        off += g.length;
      }
      w.inline_len = off;
    } else {
      w.num_sge = static_cast<std::uint8_t>(wr.sg_list.size());
      for (std::size_t k = 0; k < wr.sg_list.size(); ++k) {
        const auto& g = wr.sg_list[k];
        vd::WireSge ws{g.addr, g.length, g.lkey};
        std::memcpy(p + sizeof w + k * sizeof ws, &ws, sizeof ws);
      }
    }
    std::memcpy(p, &w, sizeof w);
    ++sq_.produced;
  }
  if (i > 0) {
    std::atomic_thread_fence(std::memory_order_release);
    auto d = dev_->ring(vd::DoorbellKind::sq, r_.qp, sq_.produced);
    if (!d.ok() && result.ok()) return d;
  }
  return result;
}

class PvPd final : public ProtectionDomain, public std::enable_shared_from_this<PvPd> {
 public:
  PvPd(std::shared_ptr<PvDevice> d, std::uint32_t h) : dev_(std::move(d)), h_(h) { dev_->pd_opened(); }
  ~PvPd() override {
    dev_->destroy(vd::Cmd::destroy_pd, h_);
    dev_->pd_closed();
  }
  std::uint32_t handle() const noexcept override { return h_; }

  Result<std::shared_ptr<MemoryRegion>> reg_mr(void* addr, std::size_t length, Access access,
                                               const MrOptions& opts) override {
    if (opts.requested_key != 0 || opts.observer)
      return make_error(Errc::not_supported, dev_->name() + ": requested keys and write observers are backend features, "
                                                            "not available to a pv guest");
    auto& t = dev_->transport();
    auto gpa = t.gpa_of(addr, length);
    if (!gpa)
      return make_error(Errc::invalid_argument, fmt::format("{}: {} bytes at {} are not device memory; allocate buffers "
                                                            "to register with Device::alloc_buffer()", dev_->name(), length,
                                                            addr));
    const std::uint64_t first = *gpa & ~std::uint64_t{4095};
    const std::uint64_t last = (*gpa + std::max<std::size_t>(length, 1) + 4095) & ~std::uint64_t{4095};
    const auto npages = static_cast<std::uint32_t>((last - first) / 4096);
    auto list = t.alloc_dma(std::size_t{npages} * 8);
    if (!list) return std::move(list).error();
    Dma pages(&t, *list);
    for (std::uint32_t i = 0; i < npages; ++i) {
      const std::uint64_t p = first + std::uint64_t{i} * 4096;
      std::memcpy(pages.a.host + i * 8, &p, 8);
    }
    vd::RegMrReq r{};
    r.pd = h_;
    r.access = static_cast<std::uint32_t>(access);
    // The region's first byte is `iova` (the caller's own address by default) and keeps its
    // offset within the first page, so the device's page arithmetic matches.
    const std::uint64_t iova = opts.iova != 0 ? opts.iova : reinterpret_cast<std::uint64_t>(addr);
    if ((iova & 4095) != (*gpa & 4095))
      return make_error(Errc::invalid_argument, fmt::format("{}: iova {:#x} must have the same offset within a 4 KiB page "
                                                            "as the buffer ({:#x})", dev_->name(), iova, *gpa & 4095));
    r.iova = iova;
    r.length = length;
    r.pages_gpa = pages.a.gpa;
    r.npages = npages;
    r.page_shift = 12;
    auto resp = dev_->call<vd::RegMrResp>(vd::Cmd::reg_mr, r);
    if (!resp) return std::move(resp).error();
    return std::shared_ptr<MemoryRegion>(std::make_shared<PvMr>(shared_from_this(), dev_, *resp, r.iova, length, access));
  }

  Result<std::shared_ptr<QueuePair>> create_qp(const QpInitAttr& attr, const QpOptions& opts) override {
    if (opts.requested_qpn != 0) return make_error(Errc::not_supported, dev_->name() + ": a pv guest cannot request QPNs");
    auto* scq = dynamic_cast<PvCq*>(attr.send_cq);
    auto* rcq = dynamic_cast<PvCq*>(attr.recv_cq);
    if (scq == nullptr || rcq == nullptr || &scq->device() != dev_.get() || &rcq->device() != dev_.get())
      return make_error(Errc::invalid_argument, dev_->name() + ": create_qp needs send and receive CQs of this device");
    auto* srq = attr.srq != nullptr ? dynamic_cast<PvSrq*>(attr.srq) : nullptr;
    if (attr.srq != nullptr && (srq == nullptr || &srq->device() != dev_.get()))
      return make_error(Errc::invalid_argument, dev_->name() + ": the SRQ belongs to another device");
    auto& t = dev_->transport();
    QpCap cap = attr.cap;
    cap.max_send_sge = std::max(1u, cap.max_send_sge);
    cap.max_recv_sge = std::max(1u, cap.max_recv_sge);
    WqRing sq, rq;
    sq.depth = std::bit_ceil(std::max(1u, cap.max_send_wr));
    sq.stride = vd::send_stride(cap.max_send_sge, cap.max_inline_data);
    auto sqm = t.alloc_dma(std::size_t{sq.depth} * sq.stride);
    if (!sqm) return std::move(sqm).error();
    sq.mem = Dma(&t, *sqm);
    if (srq == nullptr) {
      rq.depth = std::bit_ceil(std::max(1u, cap.max_recv_wr));
      rq.stride = vd::recv_stride(cap.max_recv_sge);
      auto rqm = t.alloc_dma(std::size_t{rq.depth} * rq.stride);
      if (!rqm) return std::move(rqm).error();
      rq.mem = Dma(&t, *rqm);
    }
    auto stm = t.alloc_dma(sizeof(vd::QpStatus));
    if (!stm) return std::move(stm).error();
    Dma status(&t, *stm);
    vd::CreateQpReq r{};
    r.pd = h_;
    r.send_cq = scq->handle();
    r.recv_cq = rcq->handle();
    r.srq = srq != nullptr ? srq->handle() : vd::kNoHandle;
    r.qp_type = static_cast<std::uint8_t>(attr.type);
    r.sq_sig_all = attr.sq_sig_all ? 1 : 0;
    r.sq_depth = sq.depth;
    r.rq_depth = rq.depth;
    r.max_send_sge = cap.max_send_sge;
    r.max_recv_sge = cap.max_recv_sge;
    r.max_inline = cap.max_inline_data;
    r.sq_gpa = sq.mem.a.gpa;
    r.rq_gpa = rq.mem.a.gpa;
    r.status_gpa = status.a.gpa;
    auto resp = dev_->call<vd::CreateQpResp>(vd::Cmd::create_qp, r);
    if (!resp) return std::move(resp).error();
    if (resp->sq_stride != sq.stride || (srq == nullptr && resp->rq_stride != rq.stride))
      return make_error(Errc::protocol_error, dev_->name() + ": the device computed different WQE strides");
    cap.max_send_wr = sq.depth;
    cap.max_recv_wr = rq.depth;
    // The CQs and SRQ stay alive with the QP, as nicdrv's ownership rule says.
    std::shared_ptr<SharedReceiveQueue> srq_sp;
    if (srq != nullptr) srq_sp = srq->shared_from_this();
    return std::shared_ptr<QueuePair>(std::make_shared<PvQp>(shared_from_this(), dev_, scq->shared_from_this(),
                                                             rcq->shared_from_this(), std::move(srq_sp), *resp, attr.type,
                                                             cap, std::move(sq), std::move(rq), std::move(status)));
  }

  Result<std::shared_ptr<AddressHandle>> create_ah(const AhAttr& attr) override {
    vd::CreateAhReq r{};
    r.pd = h_;
    r.ah = vd::ah_to_wire(attr);
    auto resp = dev_->call<vd::HandleResp>(vd::Cmd::create_ah, r);
    if (!resp) return std::move(resp).error();
    return std::shared_ptr<AddressHandle>(std::make_shared<PvAh>(shared_from_this(), dev_, resp->handle, attr));
  }

  Result<std::shared_ptr<SharedReceiveQueue>> create_srq(std::uint32_t max_wr, std::uint32_t max_sge) override {
    auto& t = dev_->transport();
    WqRing ring;
    ring.depth = std::bit_ceil(std::max(1u, max_wr));
    ring.stride = vd::recv_stride(std::max(1u, max_sge));
    auto m = t.alloc_dma(std::size_t{ring.depth} * ring.stride);
    if (!m) return std::move(m).error();
    ring.mem = Dma(&t, *m);
    auto stm = t.alloc_dma(sizeof(vd::QpStatus));
    if (!stm) return std::move(stm).error();
    Dma status(&t, *stm);
    vd::CreateSrqReq r{};
    r.pd = h_;
    r.depth = ring.depth;
    r.max_sge = std::max(1u, max_sge);
    r.ring_gpa = ring.mem.a.gpa;
    r.status_gpa = status.a.gpa;
    auto resp = dev_->call<vd::CreateSrqResp>(vd::Cmd::create_srq, r);
    if (!resp) return std::move(resp).error();
    return std::shared_ptr<SharedReceiveQueue>(
        std::make_shared<PvSrq>(shared_from_this(), dev_, resp->srq, std::move(ring), std::move(status), r.max_sge));
  }

 private:
  std::shared_ptr<PvDevice> dev_;
  std::uint32_t h_;
};

// ---- Device methods -------------------------------------------------------------------------
Result<DeviceAttr> PvDevice::query_device() const {
  auto r = command(vd::Cmd::query_device, nullptr, 0, sizeof(vd::DeviceAttrResp));
  if (!r) return std::move(r).error();
  vd::DeviceAttrResp w;
  std::memcpy(&w, r->data(), sizeof w);
  DeviceAttr a;
  a.name = name_;
  a.provider = "pv";
  a.transport = static_cast<Transport>(std::min<std::uint8_t>(w.transport, 3));
  a.node_guid = w.node_guid;
  a.vendor_id = w.vendor_id;
  a.vendor_part_id = w.vendor_part_id;
  a.fw_ver = std::string(w.fw_ver, strnlen(w.fw_ver, sizeof w.fw_ver));
  a.max_mr_size = w.max_mr_size;
  a.max_qp = w.max_qp;
  a.max_qp_wr = w.max_qp_wr;
  a.max_sge = w.max_sge;
  a.max_cq = w.max_cq;
  a.max_cqe = w.max_cqe;
  a.max_mr = w.max_mr;
  a.max_pd = w.max_pd;
  a.max_ah = w.max_ah;
  a.max_srq = w.max_srq;
  a.max_srq_wr = w.max_srq_wr;
  a.max_qp_rd_atom = w.max_qp_rd_atom;
  a.max_qp_init_rd_atom = w.max_qp_init_rd_atom;
  a.max_inline_data = w.max_inline_data;
  a.atomic_cap = static_cast<AtomicCap>(std::min<std::uint8_t>(w.atomic_cap, 2));
  a.phys_port_cnt = w.phys_port_cnt;
  return a;
}

Result<PortAttr> PvDevice::query_port(std::uint8_t port) const {
  if (port != 1) return make_error(Errc::invalid_argument, fmt::format("{} has one port; port {} does not exist", name_, port));
  auto r = command(vd::Cmd::query_port, nullptr, 0, sizeof(vd::PortAttrResp));
  if (!r) return std::move(r).error();
  vd::PortAttrResp w;
  std::memcpy(&w, r->data(), sizeof w);
  PortAttr a;
  a.state = static_cast<PortState>(w.state);
  a.max_mtu = static_cast<Mtu>(w.max_mtu);
  a.active_mtu = static_cast<Mtu>(w.active_mtu);
  a.link_layer = static_cast<LinkLayer>(w.link_layer);
  a.gid_tbl_len = w.gid_tbl_len;
  a.max_msg_sz = w.max_msg_sz;
  a.active_speed_mbps = w.active_speed_mbps;
  return a;
}

Result<GidEntry> PvDevice::query_gid(std::uint32_t index, std::uint8_t port) const {
  if (port != 1) return make_error(Errc::invalid_argument, fmt::format("{} has one port; port {} does not exist", name_, port));
  auto g = call<vd::GidResp>(vd::Cmd::query_gid, vd::QueryGidReq{index, 0});
  if (!g) return std::move(g).error();
  GidEntry e;
  std::memcpy(e.gid.raw.data(), g->gid, 16);
  e.type = static_cast<GidType>(std::min<std::uint32_t>(g->type, 3));
  e.index = index;
  return e;
}

Result<std::vector<GidEntry>> PvDevice::gid_table(std::uint8_t port) const {
  auto p = query_port(port);
  if (!p) return std::move(p).error();
  std::vector<GidEntry> out;
  for (std::uint32_t i = 0; i < p->gid_tbl_len; ++i) {
    auto g = query_gid(i, port);
    if (!g) break;
    out.push_back(*g);
  }
  return out;
}

Result<std::shared_ptr<ProtectionDomain>> PvDevice::alloc_pd() {
  auto r = command(vd::Cmd::create_pd, nullptr, 0, sizeof(vd::HandleResp));
  if (!r) return std::move(r).error();
  vd::HandleResp h;
  std::memcpy(&h, r->data(), sizeof h);
  return std::shared_ptr<ProtectionDomain>(std::make_shared<PvPd>(self(), h.handle));
}

Result<std::shared_ptr<CompletionQueue>> PvDevice::create_cq(std::uint32_t cqe) {
  const std::uint32_t depth = std::bit_ceil(std::max(2u, cqe));
  auto m = t_->alloc_dma(vd::kCqeOffset + std::size_t{depth} * sizeof(vd::Cqe));
  if (!m) return std::move(m).error();
  Dma ring(t_.get(), *m);
  vd::CreateCqReq r{depth, 0, ring.a.gpa};
  auto resp = call<vd::HandleResp>(vd::Cmd::create_cq, r);
  if (!resp) return std::move(resp).error();
  const int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) {
    destroy(vd::Cmd::destroy_cq, resp->handle);
    return errno_error(errno, "eventfd for a CQ");
  }
  return std::shared_ptr<CompletionQueue>(std::make_shared<PvCq>(self(), std::move(ring), depth, resp->handle, efd));
}

}  // namespace

Result<std::shared_ptr<nicdrv::Device>> open(std::unique_ptr<PvTransport> t, std::string name) {
  auto d = std::make_shared<PvDevice>(std::move(t), std::move(name));
  VRDMA_TRY(d->init());
  return std::shared_ptr<nicdrv::Device>(std::move(d));
}

Result<std::vector<std::uint8_t>> suspend(nicdrv::Device& dev) {
  auto* d = dynamic_cast<PvDevice*>(&dev);
  if (d == nullptr) return make_error(Errc::invalid_argument, dev.name() + " is not a pv device");
  return d->suspend();
}

Status resume_on(nicdrv::Device& dev, const std::string& socket, std::span<const std::uint8_t> state) {
  auto* d = dynamic_cast<PvDevice*>(&dev);
  if (d == nullptr) return make_error(Errc::invalid_argument, dev.name() + " is not a pv device");
  return d->resume_on(socket, state);
}

Status migrate(nicdrv::Device& dev, const std::string& socket, std::chrono::milliseconds probe, StateVia via) {
  auto* d = dynamic_cast<PvDevice*>(&dev);
  if (d == nullptr) return make_error(Errc::invalid_argument, dev.name() + " is not a pv device");
  return d->migrate(socket, probe, via == StateVia::guest_memory);
}

Result<std::shared_ptr<nicdrv::Device>> open(std::string_view spec, const nicdrv::DeviceOptions& o) {
  if (spec.empty())
    return make_error(Errc::invalid_argument,
                      "a pv device name is pv:<vrdmad socket path>[?ram_mib=N][&yield=0|1] or "
                      "pv:pci:<PCI address|auto>[?ram_mib=N][&yield=0|1]");
  const bool pci = spec.starts_with("pci:");
  std::uint64_t mib = pci ? 64 : 256;
  if (auto v = o.get("ram_mib"); !v.empty()) mib = std::strtoull(std::string(v).c_str(), nullptr, 10);
  // A vrdmad on this host may share our cores; the backend of a virtio-pci device runs outside
  // the VM, where yielding a vCPU's thread gives it nothing.
  bool yield = !pci;
  if (auto v = o.get("yield"); !v.empty()) {
    if (v != "0" && v != "1") return make_error(Errc::invalid_argument, "pv option yield is 0 or 1, not '" + std::string(v) + "'");
    yield = v == "1";
  }
  auto t = pci ? connect_pci(std::string(spec.substr(4)), mib) : connect_vhost_user(std::string(spec), mib);
  if (!t) return std::move(t).error();
  auto d = open(std::move(*t), "pv:" + std::string(spec));
  if (d) static_cast<PvDevice&>(**d).set_yield_when_idle(yield);
  return d;
}

}  // namespace vrdma::pv
