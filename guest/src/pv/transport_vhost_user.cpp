// The vhost-user transport of libpvverbs: this process is the frontend (as a VMM would be),
// with memfd-backed guest RAM of its own layout shared with vrdmad.
#include <fcntl.h>
#include <sys/mman.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "page_heap.hpp"
#include "vrdma/guest/pv.hpp"
#include "vrdma/vhost/driver_queue.hpp"
#include "vrdma/vhost/frontend.hpp"
#include "vrdma/vhost/guest_ram.hpp"
#include "vrdma/virtio_rdma.hpp"

namespace vrdma::pv {
namespace {

using namespace vrdma::vhost;
constexpr std::uint64_t kPage = 4096;
constexpr std::uint16_t kQueueSize = 256;

class VhostUserTransport final : public PvTransport {
 public:
  VhostUserTransport(Frontend fe, GuestRam ram) : fe_(std::move(fe)), ram_(std::move(ram)) {}

  Status setup() {
    VirtioFeatures want{VirtioFeature::version_1, VirtioFeature::protocol_features, VirtioFeature::ring_event_idx};
    ProtocolFeatures pwant{ProtocolFeature::mq, ProtocolFeature::reply_ack, ProtocolFeature::config,
                           ProtocolFeature::device_state, ProtocolFeature::log_shmfd};
    auto acked = fe_.negotiate(want, pwant);
    if (!acked) return std::move(acked).error();
    if (!acked->has(VirtioFeature::version_1)) return make_error(Errc::not_supported, "the device lacks VIRTIO_F_VERSION_1");
    auto nq = fe_.get_queue_num();
    if (!nq) return std::move(nq).error();
    if (*nq < vrdma_dev::kRequiredQueues)
      return make_error(Errc::not_supported, fmt::format("the device has {} queues; a virtio RDMA device has at least {}",
                                                         *nq, vrdma_dev::kRequiredQueues));
    nq_ = static_cast<std::uint16_t>(std::min<std::uint64_t>(*nq, vrdma_dev::kNumQueues));
    VRDMA_TRY(fe_.set_owner());
    VRDMA_TRY(fe_.set_mem_table(ram_));
    const bool event_idx = acked->has(VirtioFeature::ring_event_idx);
    for (std::uint16_t i = 0; i < nq_; ++i) {
      auto q = DriverQueue::create(ram_, kQueueSize, false, event_idx);
      if (!q) return std::move(q).error();
      qs_.push_back(std::move(*q));
    }
    // The rest of the largest region is the DMA heap.
    const RamRegion* big = nullptr;
    for (const auto& r : ram_.layout())
      if (big == nullptr || r.size > big->size) big = &r;
    const std::uint64_t want_bytes = big->size / 8 * 7 / kPage * kPage;
    auto at = ram_.alloc(want_bytes, kPage);
    if (!at) return std::move(at).error();
    heap_.init(ram_.host(*at, want_bytes), *at, want_bytes);
    return fe_.start_queues(starts(false));
  }

  Result<std::vector<std::uint8_t>> read_config(std::uint32_t offset, std::uint32_t len) override {
    return fe_.get_config(offset, len);
  }
  Result<DmaArea> alloc_dma(std::size_t len) override {
    const std::uint64_t n = (std::max<std::uint64_t>(len, 1) + kPage - 1) / kPage * kPage;
    auto off = heap_.alloc(n);
    if (!off)
      return make_error(Errc::no_memory, fmt::format("the device's DMA memory ({} MiB) has no {} free bytes left; open the "
                                                     "device with a larger ram_mib", heap_.size() >> 20, n));
    std::memset(heap_.host() + *off, 0, n);
    return DmaArea{heap_.host() + *off, heap_.gpa() + *off, static_cast<std::size_t>(n)};
  }
  std::uint64_t dma_bytes() const override { return heap_.size(); }
  void free_dma(const DmaArea& a) override {
    if (a.host == nullptr) return;
    heap_.free(static_cast<std::uint64_t>(a.host - heap_.host()), a.len);
  }
  std::optional<std::uint64_t> gpa_of(const void* p, std::size_t len) const override {
    const auto* b = static_cast<const std::uint8_t*>(p);
    if (b < heap_.host() || len > heap_.size() || static_cast<std::uint64_t>(b - heap_.host()) > heap_.size() - len)
      return std::nullopt;
    return heap_.gpa() + static_cast<std::uint64_t>(b - heap_.host());
  }
  Result<std::uint16_t> add(std::uint16_t queue, std::span<const ChainBuf> bufs) override {
    return qs_.at(queue).add(bufs);
  }
  Status publish_and_kick(std::uint16_t queue) override {
    auto& q = qs_.at(queue);
    q.publish();
    if (q.needs_kick()) return fe_.kick(queue);
    return {};
  }
  Status notify(std::uint16_t queue) override { return fe_.kick(queue); }
  std::optional<std::pair<std::uint16_t, std::uint32_t>> get_used(std::uint16_t queue) override {
    auto u = qs_.at(queue).get_used();
    if (!u) return std::nullopt;
    return std::pair{u->id, u->len};
  }
  std::uint16_t free_slots(std::uint16_t queue) const override { return qs_.at(queue).free_slots(); }
  void set_interrupts(std::uint16_t queue, bool on) override { qs_.at(queue).set_interrupts(on); }
  int call_fd(std::uint16_t queue) const override { return fe_.call_fd(queue); }
  std::uint16_t num_queues() const override { return nq_; }

  Result<std::vector<std::uint8_t>> suspend() override {
    if (!fe_.protocol_features().has(ProtocolFeature::device_state))
      return make_error(Errc::not_supported, "the backend does not offer VHOST_USER_PROTOCOL_F_DEVICE_STATE");
    VRDMA_TRY(stop_all());
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return errno_error(errno, "pipe for the device state");
    UniqueFd rd(p[0]), wr(p[1]);
    VRDMA_TRY(state_fd(fe_, 0, wr.get()));
    wr.reset();
    std::vector<std::uint8_t> blob;
    std::uint8_t buf[65536];
    for (;;) {
      pollfd pf{rd.get(), POLLIN, 0};
      if (::poll(&pf, 1, 10000) <= 0) return make_error(Errc::timeout, "the backend sent no device state within 10 s");
      const ssize_t n = ::read(rd.get(), buf, sizeof buf);
      if (n < 0) return errno_error(errno, "reading the device state");
      if (n == 0) break;
      blob.insert(blob.end(), buf, buf + n);
    }
    VRDMA_TRY(check_state(fe_));
    return blob;
  }

  Status resume_on(const std::string& socket, std::span<const std::uint8_t> state) override {
    if (bases_.size() != nq_) return make_error(Errc::bad_state, "resume_on without suspend");
    auto fe = Frontend::connect(socket, 10000);
    if (!fe) return std::move(fe).error();
    VirtioFeatures want = fe_.features();
    auto acked = fe->negotiate(want, fe_.protocol_features());
    if (!acked) return std::move(acked).error();
    if (*acked != want) return make_error(Errc::not_supported, "the new backend does not offer the same features");
    VRDMA_TRY(fe->set_owner());
    VRDMA_TRY(fe->set_mem_table(ram_));
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return errno_error(errno, "pipe for the device state");
    UniqueFd rd(p[0]), wr(p[1]);
    VRDMA_TRY(state_fd(*fe, 1, rd.get()));
    rd.reset();
    std::size_t off = 0;
    while (off < state.size()) {
      const ssize_t n = ::write(wr.get(), state.data() + off, state.size() - off);
      if (n <= 0) return errno_error(errno, "writing the device state to the new backend");
      off += static_cast<std::size_t>(n);
    }
    wr.reset();
    VRDMA_TRY(check_state(*fe));
    VRDMA_TRY(fe->start_queues(starts(true)));
    fe_ = std::move(*fe);
    for (std::uint16_t i = 0; i < nq_; ++i) VRDMA_TRY(fe_.kick(i));
    bases_.clear();
    return {};
  }

  Status stop_rings(bool logged) override {
    if (logged) VRDMA_TRY(start_logging());
    return stop_all();
  }

  Status prepare_on(const std::string& socket) override {
    prepared_.reset();
    auto fe = connect_new(socket);
    if (!fe) return std::move(fe).error();
    prepared_.emplace(std::move(*fe));
    prepared_socket_ = socket;
    return {};
  }

  Status start_on(const std::string& socket) override {
    if (bases_.size() != nq_) return make_error(Errc::bad_state, "start_on without stop_rings");
    std::optional<Frontend> fe;
    if (prepared_ && prepared_socket_ == socket) {
      fe = std::move(prepared_);
      prepared_.reset();
    } else {
      auto c = connect_new(socket);
      if (!c) return std::move(c).error();
      fe.emplace(std::move(*c));
    }
    VRDMA_TRY(fe->start_queues(starts(true)));
    for (std::uint16_t i = 0; i < nq_; ++i) VRDMA_TRY(fe->kick(i));
    old_fe_.emplace(std::move(fe_));
    fe_ = std::move(*fe);
    return {};
  }

  void commit_switch() override {
    old_fe_.reset();  // the old backend sees the frontend go, like a source QEMU quitting
    bases_.clear();
  }

  Status restart_here() override {
    prepared_.reset();
    if (bases_.size() != nq_) return make_error(Errc::bad_state, "restart_here without stop_rings");
    if (old_fe_) {
      fe_ = std::move(*old_fe_);  // the new backend's connection closes here
      old_fe_.reset();
    }
    if (fe_.features().has(VirtioFeature::log_all)) {  // the migration failed: logging off again
      VirtioFeatures f = fe_.features();
      f.clear(VirtioFeature::log_all);
      VRDMA_TRY(fe_.set_features(f));
    }
    VRDMA_TRY(fe_.start_queues(starts(true)));
    for (std::uint16_t i = 0; i < nq_; ++i) VRDMA_TRY(fe_.kick(i));
    bases_.clear();
    return {};
  }

 private:
  // Every ring, in one batch (each a round trip to a backend that may be busy loading a state).
  std::vector<Frontend::QueueStart> starts(bool at_bases) const {
    std::vector<Frontend::QueueStart> v;
    for (std::uint16_t i = 0; i < nq_; ++i)
      v.push_back({i, &qs_[i], at_bases ? std::optional<std::uint32_t>(bases_[i]) : std::nullopt});
    return v;
  }
  Status stop_all() {
    bases_.clear();
    std::vector<std::uint16_t> all(nq_);
    for (std::uint16_t i = 0; i < nq_; ++i) all[i] = i;
    auto b = fe_.get_vring_bases(all);
    if (!b) return std::move(b).error();
    bases_ = std::move(*b);
    return {};
  }

  // A connection to a new backend with this device's features (without dirty logging: the
  // migration ends there) and memory, its rings not started yet.
  Result<Frontend> connect_new(const std::string& socket) {
    auto fe = Frontend::connect(socket, 10000);
    if (!fe) return std::move(fe).error();
    VirtioFeatures want = fe_.features();
    want.clear(VirtioFeature::log_all);
    auto acked = fe->negotiate(want, fe_.protocol_features());
    if (!acked) return std::move(acked).error();
    if (*acked != want) return make_error(Errc::not_supported, "the new backend does not offer the same features");
    VRDMA_TRY(fe->set_owner());
    VRDMA_TRY(fe->set_mem_table(ram_));
    return std::move(*fe);
  }

  // Dirty logging on, as a VMM switches it on for a live migration: a shared log covering the
  // RAM (one bit per 4 KiB guest-physical page), then LOG_ALL.
  Status start_logging() {
    if (!fe_.protocol_features().has(ProtocolFeature::log_shmfd))
      return make_error(Errc::not_supported, "the backend does not offer VHOST_USER_PROTOCOL_F_LOG_SHMFD");
    std::uint64_t top = 0;
    for (const auto& r : ram_.layout()) top = std::max(top, r.gpa + r.size);
    const std::uint64_t bytes = ((top / kPage + 7) / 8 + kPage - 1) / kPage * kPage;
    UniqueFd fd(::memfd_create("vrdma-pv-dirty-log", MFD_CLOEXEC));
    if (!fd) return errno_error(errno, "memfd_create for the dirty log");
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return errno_error(errno, "sizing the dirty log");
    VRDMA_TRY(fe_.set_log_base(fd.get(), bytes));
    log_fd_ = std::move(fd);
    VirtioFeatures f = fe_.features();
    f.set(VirtioFeature::log_all);
    VRDMA_TRY(fe_.set_features(f));
    // SET_FEATURES has no reply without REPLY_ACK: a request with one proves it was applied.
    if (!fe_.protocol_features().has(ProtocolFeature::reply_ack)) VRDMA_TRY(fe_.get_queue_num());
    return {};
  }
  static Status state_fd(Frontend& fe, std::uint32_t direction, int fd) {
    Message m = make_request(Request::set_device_state_fd);
    m.set(DeviceStateXfer{direction, 0});
    m.fds.emplace_back(::dup(fd));
    auto r = fe.request(std::move(m));
    if (!r) return std::move(r).error();
    if (!r->has_value() || ((*r)->get<std::uint64_t>() & 0xff) != 0)
      return make_error(Errc::protocol_error, "the backend refused SET_DEVICE_STATE_FD");
    return {};
  }
  static Status check_state(Frontend& fe) {
    for (int i = 0; i < 500; ++i) {
      auto c = fe.request(make_request(Request::check_device_state));
      if (!c) return std::move(c).error();
      if (!c->has_value()) return make_error(Errc::protocol_error, "CHECK_DEVICE_STATE without a reply");
      if ((*c)->get<std::uint64_t>() == 0) return {};
      ::usleep(10000);
    }
    return make_error(Errc::io_error, "the backend reports the device state transfer failed (see its log)");
  }

  std::vector<std::uint32_t> bases_;
  std::uint16_t nq_ = vrdma_dev::kRequiredQueues;
  UniqueFd log_fd_;  // the dirty log of a logged stop
  Frontend fe_;
  std::optional<Frontend> old_fe_;  // during a backend-driven migration, until commit_switch
  std::optional<Frontend> prepared_;  // prepare_on's connection, until start_on takes it
  std::string prepared_socket_;
  GuestRam ram_;
  std::vector<DriverQueue> qs_;
  PageHeap heap_;
};

}  // namespace

Result<std::unique_ptr<PvTransport>> connect_vhost_user(const std::string& socket, std::uint64_t ram_mib, int timeout_ms) {
  if (ram_mib < 16 || ram_mib > (1u << 20))
    return make_error(Errc::invalid_argument, fmt::format("ram_mib {} is outside 16..1048576", ram_mib));
  auto fe = Frontend::connect(socket, timeout_ms);
  if (!fe) return make_error(fe.error().code == make_error_code(Errc::timeout) ? Errc::no_device : Errc::no_device,
                             fmt::format("cannot reach the virtio RDMA device at {}: {} (is vrdmad running with "
                                         "--socket {}?)", socket, fe.error().message, socket));
  // One big region carries the DMA heap; a small low region like a VM's first 640 KiB holds
  // the virtqueues, so guest-physical addresses are not host addresses.
  std::vector<RamRegion> layout{{0, 640u << 10, 0}, {1u << 20, ram_mib << 20, 1u << 20}};
  auto ram = GuestRam::create(layout);
  if (!ram) return std::move(ram).error();
  auto t = std::make_unique<VhostUserTransport>(std::move(*fe), std::move(*ram));
  VRDMA_TRY(t->setup());
  return std::unique_ptr<PvTransport>(std::move(t));
}

}  // namespace vrdma::pv
