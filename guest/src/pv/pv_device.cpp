// The pv provider: nicdrv objects as a driver of the virtio RDMA device (docs/virtio-rdma.md).
// This file: opening the device (its config, the queues' buffers, the event thread), its
// queries, PDs, CQs and buffers, and the public API of vrdma/guest/pv.hpp. The rest of the
// driver is in the files pv_internal.hpp names.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "pv_internal.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::pv {
namespace detail {

PvDevice::~PvDevice() {
  if (stop_fd_ >= 0) {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto w = ::write(stop_fd_, &one, sizeof one);
  }
  if (events_.joinable()) events_.join();
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

Status PvDevice::init() {
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
  // Doorbells are reaped as they are rung (ring()): their return needs no interrupt, which in a
  // VM under uio would cost the interrupt thread five system calls.
  t_->set_interrupts(vd::kDoorbellQueue, false);
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

Result<std::shared_ptr<Buffer>> PvDevice::alloc_buffer(std::size_t length) {
  auto a = t_->alloc_dma(length);
  if (!a) return std::move(a).error();
  return std::shared_ptr<Buffer>(std::make_shared<PvBuffer>(self(), Dma(t_.get(), *a)));
}

Result<DeviceAttr> PvDevice::query_device() const {
  auto r = command(vd::Cmd::query_device, nullptr, 0, sizeof(vd::DeviceAttrResp));
  if (!r) return std::move(r).error();
  vd::DeviceAttrResp w;
  std::memcpy(&w, r->data(), sizeof w);
  DeviceAttr a = nicdrv::device_attr_from_wire(w);
  a.name = name_;
  a.provider = "pv";
  a.gsi = (cfg_.features & vd::kFeatureGsi) != 0;
  a.max_fast_reg_pages = (cfg_.features & vd::kFeatureFastReg) != 0 ? cfg_.max_fast_reg_pages : 0;
  return a;
}

Result<PortAttr> PvDevice::query_port(std::uint8_t port) const {
  if (port != 1) return make_error(Errc::invalid_argument, fmt::format("{} has one port; port {} does not exist", name_, port));
  auto r = command(vd::Cmd::query_port, nullptr, 0, sizeof(vd::PortAttrResp));
  if (!r) return std::move(r).error();
  vd::PortAttrResp w;
  std::memcpy(&w, r->data(), sizeof w);
  return nicdrv::port_attr_from_wire(w);
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
  vd::CreateCqReq r{depth, db_ring_, ring.a.gpa};
  auto resp = call<vd::HandleResp>(vd::Cmd::create_cq, r);
  if (!resp) return std::move(resp).error();
  const int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) {
    destroy(vd::Cmd::destroy_cq, resp->handle);
    return errno_error(errno, "eventfd for a CQ");
  }
  return std::shared_ptr<CompletionQueue>(std::make_shared<PvCq>(self(), std::move(ring), depth, resp->handle, efd));
}


}  // namespace detail

using detail::PvDevice;

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
                      "a pv device name is pv:<vrdmad socket path>[?ram_mib=N][&yield=0|1][&doorbells=queue|ring] or "
                      "pv:pci:<PCI address|auto>[?ram_mib=N][&yield=0|1][&doorbells=queue|ring]");
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
  const auto doorbells = o.get("doorbells");
  if (!doorbells.empty() && doorbells != "queue" && doorbells != "ring")
    return make_error(Errc::invalid_argument, "pv option doorbells is queue or ring, not '" + std::string(doorbells) + "'");
  auto d = open(std::move(*t), "pv:" + std::string(spec));
  if (!d) return d;
  static_cast<PvDevice&>(**d).set_yield_when_idle(yield);
  if (doorbells == "ring") VRDMA_TRY(static_cast<PvDevice&>(**d).use_db_ring());
  return d;
}

}  // namespace vrdma::pv
