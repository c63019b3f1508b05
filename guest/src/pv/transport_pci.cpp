// The virtio-pci transport of libpvverbs, for use inside a VM without a kernel module: the
// function is bound to uio_pci_generic, its BARs are mapped through sysfs and driven through
// the modern virtio-pci interface (virtio 1.2 §4.1: common, notify, ISR and device config
// capabilities; §3.1.1 initialisation), DMA memory comes from hugepages (hugepage_dma.hpp).
//
// Interrupts: uio_pci_generic delivers INTx through read() on /dev/uioN and masks the line
// (PCI command INTx-disable) each time it fires. A thread waits on /dev/uioN, reads the ISR
// register (which deasserts the line, §4.1.4.5), unmasks INTx, and, for a queue interrupt,
// writes every queue's eventfd (INTx does not say which queue): call_fd() becomes readable
// when the device signals. Callers poll their queues after a wakeup anyway.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "hugepage_dma.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/guest/pci_sysfs.hpp"
#include "vrdma/guest/pv.hpp"
#include "vrdma/virtio_rdma.hpp"

namespace vrdma::pv {
namespace {

namespace vd = vrdma::vrdma_dev;

// virtio_pci_common_cfg (§4.1.4.3) offsets.
enum CommonCfg : std::uint32_t {
  device_feature_select = 0,
  device_feature = 4,
  driver_feature_select = 8,
  driver_feature = 12,
  msix_config = 16,
  num_queues = 18,
  device_status = 20,
  config_generation = 21,
  queue_select = 22,
  queue_size = 24,
  queue_msix_vector = 26,
  queue_enable = 28,
  queue_notify_off = 30,
  queue_desc = 32,
  queue_driver = 40,
  queue_device = 48,
  common_cfg_size = 56,  // virtio 1.0's layout; 1.2 adds queue_notify_data and queue_reset
};
// Device status bits (§2.1).
constexpr std::uint8_t kAcknowledge = 1, kDriver = 2, kDriverOk = 4, kFeaturesOk = 8, kNeedsReset = 64, kFailed = 128;
constexpr std::uint64_t kFeatureVersion1 = 1ull << 32;
constexpr std::uint64_t kFeatureEventIdx = 1ull << 29;
constexpr std::uint16_t kNoVector = 0xffff;
constexpr std::uint16_t kMaxQueue = 256;
constexpr std::uint32_t kPciCommand = 0x04;

// One capability's window inside a mapped BAR, checked when it is made.
class Window {
 public:
  Window() = default;
  Window(std::uint8_t* base, std::uint32_t len) : base_(base), len_(len) {}
  [[nodiscard]] std::uint32_t size() const { return len_; }
  template <class T>
  T read(std::uint32_t off) const {
    return *reinterpret_cast<volatile const T*>(base_ + off);
  }
  template <class T>
  void write(std::uint32_t off, T v) const {
    *reinterpret_cast<volatile T*>(base_ + off) = v;
  }

 private:
  std::uint8_t* base_ = nullptr;
  std::uint32_t len_ = 0;
};

class PciTransport final : public PvTransport {
 public:
  ~PciTransport() override {
    if (stop_) {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto w = ::write(stop_.get(), &one, sizeof one);
    }
    if (irq_.joinable()) irq_.join();
    if (common_.size() != 0) common_.write<std::uint8_t>(device_status, 0);  // reset: the device lets go of our memory
  }

  Status setup(const std::string& address, std::uint64_t ram_mib) {
    auto f = pci::Function::open(address);
    if (!f) return std::move(f).error();
    fn_ = std::move(*f);
    if (fn_.vendor() != pci::kVirtioVendor)
      return make_error(Errc::no_device, fmt::format("{} is not a virtio function (vendor {:#06x})", address, fn_.vendor()));
    auto uio = fn_.uio_device();
    if (!uio) return std::move(uio).error();
    uio_ = UniqueFd(::open(uio->c_str(), O_RDWR | O_CLOEXEC));
    if (!uio_) return errno_error(errno, "cannot open " + *uio);
    VRDMA_TRY(map_capabilities());
    auto dma = HugepageDma::create(ram_mib << 20);
    if (!dma) return std::move(dma).error();
    dma_ = std::make_unique<HugepageDma>(std::move(*dma));
    // Memory decoding and bus mastering (the device reaches our memory only with it), INTx on.
    auto cmd = fn_.read_config16(kPciCommand);
    if (!cmd) return std::move(cmd).error();
    VRDMA_TRY(fn_.write_config16(kPciCommand, static_cast<std::uint16_t>(
                                                  (*cmd | pci::kCommandMemory | pci::kCommandBusMaster) &
                                                  ~pci::kCommandIntxDisable)));
    VRDMA_TRY(initialise());
    for (auto& e : call_) {
      e = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      if (!e) return errno_error(errno, "eventfd");
    }
    stop_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stop_) return errno_error(errno, "eventfd");
    irq_ = std::thread([this] { irq_thread(); });
    return {};
  }

  Result<std::vector<std::uint8_t>> read_config(std::uint32_t offset, std::uint32_t len) override {
    if (offset > device_.size()) return std::vector<std::uint8_t>{};
    const std::uint32_t n = std::min(len, device_.size() - offset);
    std::vector<std::uint8_t> out(n);
    // §4.1.4.3.1: a read is consistent when config_generation is the same before and after.
    for (int attempt = 0; attempt < 100; ++attempt) {
      const auto g0 = common_.read<std::uint8_t>(config_generation);
      for (std::uint32_t i = 0; i < n; ++i) out[i] = device_.read<std::uint8_t>(offset + i);
      if (common_.read<std::uint8_t>(config_generation) == g0) return out;
    }
    return make_error(Errc::protocol_error, "the device's config generation keeps changing");
  }
  Result<DmaArea> alloc_dma(std::size_t len) override { return dma_->alloc(len); }
  void free_dma(const DmaArea& a) override { dma_->free(a); }
  std::uint64_t dma_bytes() const override { return dma_->size(); }
  std::optional<std::uint64_t> gpa_of(const void* p, std::size_t len) const override { return dma_->gpa_of(p, len); }
  Result<std::uint16_t> add(std::uint16_t queue, std::span<const ChainBuf> bufs) override {
    return qs_.at(queue).ring.add(bufs);
  }
  Status publish_and_kick(std::uint16_t queue) override {
    auto& q = qs_.at(queue);
    q.ring.publish();
    if (q.ring.needs_kick()) notify_.write<std::uint16_t>(q.notify_off, queue);  // §4.1.4.4: write the queue index
    return {};
  }
  Status notify(std::uint16_t queue) override {
    notify_.write<std::uint16_t>(qs_.at(queue).notify_off, queue);
    return {};
  }
  std::optional<std::pair<std::uint16_t, std::uint32_t>> get_used(std::uint16_t queue) override {
    auto u = qs_.at(queue).ring.get_used();
    if (!u) return std::nullopt;
    return std::pair{u->id, u->len};
  }
  std::uint16_t free_slots(std::uint16_t queue) const override { return qs_.at(queue).ring.free_slots(); }
  void set_interrupts(std::uint16_t queue, bool on) override { qs_.at(queue).ring.set_interrupts(on); }
  int call_fd(std::uint16_t queue) const override { return call_.at(queue).get(); }
  std::uint16_t num_queues() const override { return nq_; }

 private:
  struct Queue {
    vhost::DriverQueue ring;
    std::uint32_t notify_off;
  };

  // Maps each BAR a capability names and checks every window lies inside its BAR.
  Status map_capabilities() {
    auto cfg = fn_.read_config();
    if (!cfg) return std::move(cfg).error();
    auto caps = pci::parse_virtio_caps(*cfg);
    if (!caps) return std::move(caps).error();
    if (!caps->common || !caps->notify || !caps->isr || !caps->device)
      return make_error(Errc::not_supported, fmt::format("{} lacks a modern virtio-pci capability (common, notify, ISR, "
                                                         "device config): not a virtio 1.x device", fn_.address()));
    auto window = [&](const pci::CapLocation& c, std::uint32_t min_len, const char* what) -> Result<Window> {
      if (c.bar > 5) return make_error(Errc::protocol_error, fmt::format("the {} capability names BAR {}", what, c.bar));
      if (!bars_[c.bar].data()) {
        auto m = fn_.map_bar(c.bar);
        if (!m) return std::move(m).error();
        bars_[c.bar] = std::move(*m);
      }
      const std::uint64_t bar_len = bars_[c.bar].size();
      if (c.length < min_len || std::uint64_t{c.offset} > bar_len || std::uint64_t{c.length} > bar_len - c.offset)
        return make_error(Errc::protocol_error, fmt::format("the {} capability ({} bytes at {:#x}) does not fit BAR {} ({} "
                                                            "bytes) or is shorter than {}", what, c.length, c.offset, c.bar,
                                                            bar_len, min_len));
      return Window(static_cast<std::uint8_t*>(bars_[c.bar].data()) + c.offset, c.length);
    };
    auto common = window(*caps->common, common_cfg_size, "common config");
    if (!common) return std::move(common).error();
    auto notify = window(*caps->notify, 2, "notify");
    if (!notify) return std::move(notify).error();
    auto isr = window(*caps->isr, 1, "ISR");
    if (!isr) return std::move(isr).error();
    auto device = window(*caps->device, sizeof(vd::CarrierConfig), "device config");
    if (!device) return std::move(device).error();
    common_ = *common;
    notify_ = *notify;
    isr_ = *isr;
    device_ = *device;
    notify_mult_ = caps->notify_off_multiplier;
    return {};
  }

  Status fail(Error e) {
    common_.write<std::uint8_t>(device_status, kFailed);
    return e;
  }

  // §3.1.1 driver initialisation.
  Status initialise() {
    common_.write<std::uint8_t>(device_status, 0);
    for (int i = 0; common_.read<std::uint8_t>(device_status) != 0; ++i) {
      if (i > 1000) return make_error(Errc::timeout, "the device does not finish its reset");
      ::usleep(1000);
    }
    common_.write<std::uint8_t>(device_status, kAcknowledge);
    common_.write<std::uint8_t>(device_status, kAcknowledge | kDriver);
    common_.write<std::uint32_t>(device_feature_select, 0);
    std::uint64_t feat = common_.read<std::uint32_t>(device_feature);
    common_.write<std::uint32_t>(device_feature_select, 1);
    feat |= std::uint64_t{common_.read<std::uint32_t>(device_feature)} << 32;
    if ((feat & kFeatureVersion1) == 0)
      return fail(make_error(Errc::not_supported, "the device does not offer VIRTIO_F_VERSION_1"));
    // VERSION_1 and, when offered, EVENT_IDX (fewer kicks and interrupts); split rings, direct
    // descriptors, physical addresses.
    const bool event_idx = (feat & kFeatureEventIdx) != 0;
    common_.write<std::uint32_t>(driver_feature_select, 0);
    common_.write<std::uint32_t>(driver_feature, event_idx ? static_cast<std::uint32_t>(kFeatureEventIdx) : 0u);
    common_.write<std::uint32_t>(driver_feature_select, 1);
    common_.write<std::uint32_t>(driver_feature, static_cast<std::uint32_t>(kFeatureVersion1 >> 32));
    common_.write<std::uint8_t>(device_status, kAcknowledge | kDriver | kFeaturesOk);
    if ((common_.read<std::uint8_t>(device_status) & kFeaturesOk) == 0)
      return fail(make_error(Errc::not_supported, "the device refused our features (FEATURES_OK not kept)"));
    const auto nq = common_.read<std::uint16_t>(CommonCfg::num_queues);
    if (nq < vd::kRequiredQueues)
      return fail(make_error(Errc::not_supported, fmt::format("the device has {} queues; a virtio RDMA device has at least "
                                                              "{} (start QEMU with num-queues={})", nq, vd::kRequiredQueues,
                                                              vd::kNumQueues)));
    nq_ = std::min<std::uint16_t>(nq, vd::kNumQueues);
    if (nq_ < vd::kNumQueues)
      log::warn("pv: {}: the device has {} queues, no state queue: its RDMA state cannot move with the VM in a live "
                "migration (start QEMU with num-queues={})", fn_.address(), nq, vd::kNumQueues);
    for (std::uint16_t i = 0; i < nq_; ++i) {
      common_.write<std::uint16_t>(queue_select, i);
      const auto max = common_.read<std::uint16_t>(queue_size);
      if (max == 0) return fail(make_error(Errc::not_supported, fmt::format("queue {} is not available", i)));
      const auto size = static_cast<std::uint16_t>(std::bit_floor(std::min<std::uint16_t>(max, kMaxQueue)));
      auto ring = vhost::DriverQueue::create(*dma_, size, false, event_idx);
      if (!ring) return fail(std::move(ring).error());
      const std::uint64_t notify_at = std::uint64_t{common_.read<std::uint16_t>(queue_notify_off)} * notify_mult_;
      if (notify_at > notify_.size() || notify_.size() - notify_at < 2)
        return fail(make_error(Errc::protocol_error, fmt::format("queue {}'s notify address ({:#x}) is outside the notify "
                                                                 "window ({} bytes)", i, notify_at, notify_.size())));
      qs_.reserve(nq_);
      qs_.push_back(Queue{std::move(*ring), static_cast<std::uint32_t>(notify_at)});
      auto& r = qs_.back().ring;
      common_.write<std::uint16_t>(queue_size, size);
      common_.write<std::uint16_t>(queue_msix_vector, kNoVector);
      write64(queue_desc, r.desc_gpa());
      write64(queue_driver, r.driver_gpa());
      write64(queue_device, r.device_gpa());
      common_.write<std::uint16_t>(queue_enable, 1);
    }
    common_.write<std::uint16_t>(msix_config, kNoVector);
    common_.write<std::uint8_t>(device_status, kAcknowledge | kDriver | kFeaturesOk | kDriverOk);
    const auto st = common_.read<std::uint8_t>(device_status);
    if ((st & kNeedsReset) != 0 || (st & kDriverOk) == 0)
      return make_error(Errc::io_error, fmt::format("the device did not start (status {:#x})", st));
    return {};
  }
  void write64(std::uint32_t off, std::uint64_t v) {
    common_.write<std::uint32_t>(off, static_cast<std::uint32_t>(v));
    common_.write<std::uint32_t>(off + 4, static_cast<std::uint32_t>(v >> 32));
  }

  void irq_thread() {
    std::uint64_t isr_reads = 0;
    for (;;) {
      // Unmask INTx (uio_pci_generic masked it when it fired). Read-modify-write of the command register.
      if (auto c = fn_.read_config16(kPciCommand); c && (*c & pci::kCommandIntxDisable) != 0)
        (void)fn_.write_config16(kPciCommand, static_cast<std::uint16_t>(*c & ~pci::kCommandIntxDisable));
      pollfd p[2] = {{uio_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      if (::poll(p, 2, 1000) < 0 && errno != EINTR) return;
      if (p[1].revents != 0) return;
      if (p[0].revents == 0) continue;
      std::uint32_t count = 0;
      if (::read(uio_.get(), &count, sizeof count) != static_cast<ssize_t>(sizeof count)) continue;
      const auto isr = isr_.read<std::uint8_t>(0);  // reading clears it and deasserts the line
      ++isr_reads;
      if ((isr & 1) != 0) {
        const std::uint64_t one = 1;
        for (const auto& e : call_) [[maybe_unused]] auto w = ::write(e.get(), &one, sizeof one);
      }
      if ((isr & 2) != 0) log::info("pv: {}: device configuration changed", fn_.address());
    }
  }

  pci::Function fn_;
  UniqueFd uio_, stop_;
  std::array<MmapArea, 6> bars_;
  Window common_, notify_, isr_, device_;
  std::uint32_t notify_mult_ = 0;
  std::uint16_t nq_ = vd::kRequiredQueues;
  std::unique_ptr<HugepageDma> dma_;
  std::vector<Queue> qs_;
  std::array<UniqueFd, vd::kNumQueues> call_;
  std::thread irq_;
};

// "auto": the first virtio function bound to uio_pci_generic.
Result<std::string> find_auto() {
  for (const auto& a : pci::list_functions()) {
    auto f = pci::Function::open(a);
    if (f && f->vendor() == pci::kVirtioVendor && f->driver() == "uio_pci_generic") return a;
  }
  return make_error(Errc::no_device, "no virtio function is bound to uio_pci_generic; run pvverbs-bind first");
}

}  // namespace

Result<std::unique_ptr<PvTransport>> connect_pci(const std::string& pci_address, std::uint64_t ram_mib) {
  if (ram_mib < 8 || ram_mib > (64u << 10))
    return make_error(Errc::invalid_argument, fmt::format("ram_mib {} is outside 8..65536", ram_mib));
  std::string addr = pci_address;
  if (addr == "auto") {
    auto a = find_auto();
    if (!a) return std::move(a).error();
    addr = *a;
  }
  auto t = std::make_unique<PciTransport>();
  VRDMA_TRY(t->setup(addr, ram_mib));
  return std::unique_ptr<PvTransport>(std::move(t));
}

}  // namespace vrdma::pv
