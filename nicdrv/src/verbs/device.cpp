// Discovery and the device-level objects of the verbs provider: device, PD, MR, AH, CQ, SRQ.
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <net/if.h>

#include <cerrno>
#include <cstring>

#include "verbs_internal.hpp"
#include "vrdma/nicdrv/verbs.hpp"

namespace vrdma::nicdrv::verbs {

Error verbs_error(int err, const std::string& what) {
  // libibverbs returns positive errno values, or -1 with errno, or NULL with errno; some
  // providers leave errno at 0 on failure.
  if (err < 0) err = -err;
  if (err == 0) err = EIO;
  return errno_error(err, what);
}

Gid gid_of(const ibv_gid& g) noexcept {
  Gid out;
  std::memcpy(out.raw.data(), g.raw, 16);
  return out;
}

ibv_gid ibv_gid_of(const Gid& g) noexcept {
  ibv_gid out{};
  std::memcpy(out.raw, g.raw.data(), 16);
  return out;
}

QpState from_ibv(ibv_qp_state s) noexcept {
  switch (s) {
    case IBV_QPS_RESET: return QpState::reset;
    case IBV_QPS_INIT: return QpState::init;
    case IBV_QPS_RTR: return QpState::rtr;
    case IBV_QPS_RTS: return QpState::rts;
    case IBV_QPS_SQD: return QpState::sqd;
    case IBV_QPS_SQE: return QpState::sqe;
    default: return QpState::err;
  }
}

namespace {

// RAII for the device list.
struct DeviceList {
  ibv_device** list = nullptr;
  int n = 0;
  // In the body, not the initialiser list: `n`'s default initialiser runs after `list`'s, and
  // would reset the count ibv_get_device_list just wrote (every device list looked empty).
  DeviceList() {
    list = ibv_get_device_list(&n);
    if (list == nullptr) n = 0;
  }
  ~DeviceList() {
    if (list != nullptr) ibv_free_device_list(list);
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
};

std::string_view transport_name(const ibv_context* c, ibv_port_attr* p) {
  if (c->device->transport_type == IBV_TRANSPORT_IWARP) return "iWARP";
  if (p != nullptr && p->link_layer == IBV_LINK_LAYER_ETHERNET) return "RoCE";
  return "InfiniBand";
}

std::uint32_t speed_mbps(std::uint8_t width, std::uint8_t speed) {
  std::uint32_t lanes = 0;
  switch (width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: break;
  }
  std::uint32_t per_lane = 0;  // data rate per lane, Mb/s (IBA 7.7; rdma-core's ibv_rate)
  switch (speed) {
    case 1: per_lane = 2500; break;
    case 2: per_lane = 5000; break;
    case 4: case 8: per_lane = 10000; break;
    case 16: per_lane = 14000; break;
    case 32: per_lane = 25000; break;
    case 64: per_lane = 50000; break;
    case 128: per_lane = 100000; break;
    default: break;
  }
  return lanes * per_lane;
}

std::string ifname_of(std::uint32_t ifindex) {
  char buf[IF_NAMESIZE] = {};
  if (ifindex == 0 || ::if_indextoname(ifindex, buf) == nullptr) return {};
  return buf;
}

// The interface with this MAC address. iWARP devices carry their netdev's MAC as GID (siw,
// irdma) and their GID entries name no netdev.
std::string ifname_by_mac(const std::uint8_t* mac) {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return {};
  std::string out;
  for (ifaddrs* i = ifs; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_PACKET) continue;
    sockaddr_ll ll{};
    std::memcpy(&ll, i->ifa_addr, sizeof ll);
    if (ll.sll_halen == 6 && std::memcmp(ll.sll_addr, mac, 6) == 0) out = i->ifa_name;
  }
  ::freeifaddrs(ifs);
  return out;
}

GidType gid_type_of(const VerbsDevice& d, std::uint32_t t) {
  if (d.iwarp()) return GidType::iwarp;
  switch (t) {
    case IBV_GID_TYPE_ROCE_V1: return GidType::roce_v1;
    case IBV_GID_TYPE_ROCE_V2: return GidType::roce_v2;
    default: return GidType::ib;
  }
}

}  // namespace

// ---- discovery and opening ------------------------------------------------------------------
std::vector<DeviceInfo> list() {
  std::vector<DeviceInfo> out;
  DeviceList l;
  for (int i = 0; i < l.n; ++i) {
    DeviceInfo info;
    const std::string ibdev = ibv_get_device_name(l.list[i]);
    info.name = "verbs:" + ibdev;
    info.provider = "verbs";
    info.description = "rdma-core device " + ibdev;
    if (ibv_context* c = ibv_open_device(l.list[i])) {
      ibv_port_attr p{};
      const bool have_port = ibv_query_port(c, 1, &p) == 0;
      info.description += " (" + std::string(transport_name(c, have_port ? &p : nullptr)) + ")";
      ibv_close_device(c);
    }
    out.push_back(std::move(info));
  }
  return out;
}

Result<std::shared_ptr<Device>> open(std::string_view spec, const DeviceOptions& opts) {
  if (spec.empty())
    return make_error(Errc::invalid_argument, "verbs: name an RDMA device or a PCI function, e.g. verbs:mlx5_0 or verbs:0000:3b:02.1");
  std::string ibdev(spec);
  if (is_pci_address(spec)) {
    auto root = opts.get("sysfs_root");
    auto r = ibdev_for_pci(root.empty() ? default_sysfs_root() : std::filesystem::path(root), spec);
    if (!r) return make_error(r.error().is(Errc::invalid_argument) ? Errc::invalid_argument : Errc::no_device,
                              "verbs: " + r.error().message);
    ibdev = *r;
  }
  DeviceList l;
  std::string known;
  for (int i = 0; i < l.n; ++i) {
    const std::string n = ibv_get_device_name(l.list[i]);
    if (n != ibdev) {
      known += (known.empty() ? "" : ", ") + n;
      continue;
    }
    ibv_context* c = ibv_open_device(l.list[i]);
    if (c == nullptr) return verbs_error(errno, "verbs: cannot open RDMA device " + ibdev + " (check /dev/infiniband permissions)");
    auto ctx = std::make_shared<Context>(c, ibdev);
    return std::shared_ptr<Device>(std::make_shared<VerbsDevice>(std::move(ctx), "verbs:" + ibdev));
  }
  if (l.n == 0)
    return make_error(Errc::no_device, "verbs: no RDMA device '" + ibdev +
                                           "': libibverbs sees no RDMA devices on this host (is the kernel RDMA "
                                           "stack loaded, e.g. ib_uverbs and the NIC's RDMA driver, and "
                                           "ibverbs-providers installed?)");
  return make_error(Errc::no_device, "verbs: no RDMA device '" + ibdev + "' (this host has: " + known + ")");
}

// ---- device --------------------------------------------------------------------------------
VerbsDevice::VerbsDevice(std::shared_ptr<Context> c, std::string name) : c_(std::move(c)), name_(std::move(name)) {
  ibv_device_attr a{};
  if (ibv_query_device(c_->ctx, &a) == 0) {
    if (a.phys_port_cnt > 0) ports_ = a.phys_port_cnt;
    atomics_ = a.atomic_cap != IBV_ATOMIC_NONE;
    vendor_id_ = a.vendor_id;
    max_sge_rd_ = a.max_sge_rd > 0 ? static_cast<std::uint32_t>(a.max_sge_rd) : 0;
  }
  // Asynchronous events are read when a QP's state is asked for, never waited on.
  const int fl = ::fcntl(c_->ctx->async_fd, F_GETFL);
  if (fl >= 0) (void)::fcntl(c_->ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
}

void Context::drain_async_events() {
  ibv_async_event ev{};
  while (ibv_get_async_event(ctx, &ev) == 0) {  // EAGAIN ends it
    if (ev.event_type == IBV_EVENT_QP_FATAL || ev.event_type == IBV_EVENT_QP_REQ_ERR ||
        ev.event_type == IBV_EVENT_QP_ACCESS_ERR) {
      std::lock_guard lk(qps_mu);  // a QP unregisters before it is destroyed
      if (auto it = qps.find(ev.element.qp->qp_num); it != qps.end()) it->second->mark_failed();
    }
    ibv_ack_async_event(&ev);
  }
}

Status VerbsDevice::check_port(std::uint8_t port) const {
  if (port < 1 || port > ports_)
    return make_error(Errc::invalid_argument, name_ + " has port" + (ports_ > 1 ? "s 1.." : " ") + std::to_string(ports_) +
                                                  ", not " + std::to_string(port));
  return {};
}

Result<LinkLayer> VerbsDevice::link_layer(std::uint8_t port) const {
  VRDMA_TRY(check_port(port));
  ibv_port_attr p{};
  if (int e = ibv_query_port(c_->ctx, port, &p); e != 0) return verbs_error(e, name_ + ": query port " + std::to_string(port));
  return p.link_layer == IBV_LINK_LAYER_INFINIBAND ? LinkLayer::infiniband : LinkLayer::ethernet;
}

Result<DeviceAttr> VerbsDevice::query_device() const {
  ibv_device_attr a{};
  if (int e = ibv_query_device(c_->ctx, &a); e != 0) return verbs_error(e, name_ + ": query device");
  DeviceAttr d;
  d.name = name_;
  d.provider = "verbs";
  ibv_port_attr p{};
  const bool have_port = ibv_query_port(c_->ctx, 1, &p) == 0;
  d.transport = iwarp() ? Transport::iwarp
                : (have_port && p.link_layer == IBV_LINK_LAYER_ETHERNET) ? Transport::roce
                                                                          : Transport::infiniband;
  d.node_guid = a.node_guid;
  d.vendor_id = a.vendor_id;
  d.vendor_part_id = a.vendor_part_id;
  d.fw_ver = a.fw_ver;
  d.max_mr_size = a.max_mr_size;
  auto u = [](int v) { return v < 0 ? 0u : static_cast<std::uint32_t>(v); };
  d.max_qp = u(a.max_qp);
  d.max_qp_wr = u(a.max_qp_wr);
  d.max_sge = u(a.max_sge);
  d.max_cq = u(a.max_cq);
  d.max_cqe = u(a.max_cqe);
  d.max_mr = u(a.max_mr);
  d.max_pd = u(a.max_pd);
  d.max_ah = u(a.max_ah);
  d.max_srq = u(a.max_srq);
  d.max_srq_wr = u(a.max_srq_wr);
  d.max_qp_rd_atom = u(a.max_qp_rd_atom);
  d.max_qp_init_rd_atom = u(a.max_qp_init_rd_atom);
  d.max_inline_data = 0;  // verbs reports it per QP (create_qp's cap), not per device
  d.atomic_cap = a.atomic_cap == IBV_ATOMIC_GLOB ? AtomicCap::global
                 : a.atomic_cap == IBV_ATOMIC_HCA ? AtomicCap::hca
                                                  : AtomicCap::none;
  d.phys_port_cnt = a.phys_port_cnt;
  return d;
}

Result<PortAttr> VerbsDevice::query_port(std::uint8_t port) const {
  VRDMA_TRY(check_port(port));
  ibv_port_attr p{};
  if (int e = ibv_query_port(c_->ctx, port, &p); e != 0) return verbs_error(e, name_ + ": query port " + std::to_string(port));
  PortAttr out;
  out.state = p.state == IBV_PORT_ACTIVE ? PortState::active
              : p.state == IBV_PORT_ARMED ? PortState::armed
              : p.state == IBV_PORT_INIT  ? PortState::init
                                          : PortState::down;
  out.max_mtu = static_cast<Mtu>(p.max_mtu);
  out.active_mtu = static_cast<Mtu>(p.active_mtu);
  out.link_layer = p.link_layer == IBV_LINK_LAYER_INFINIBAND ? LinkLayer::infiniband : LinkLayer::ethernet;
  out.gid_tbl_len = static_cast<std::uint32_t>(p.gid_tbl_len);
  out.max_msg_sz = p.max_msg_sz;
  out.active_speed_mbps = speed_mbps(p.active_width, p.active_speed);
  ibv_gid_entry g{};
  if (ibv_query_gid_ex(c_->ctx, port, 0, &g, 0) == 0) out.netdev = ifname_of(g.ndev_ifindex);
  if (out.netdev.empty() && iwarp()) {
    ibv_gid raw{};
    if (ibv_query_gid(c_->ctx, port, 0, &raw) == 0) out.netdev = ifname_by_mac(raw.raw);
  }
  return out;
}

Result<std::vector<GidEntry>> VerbsDevice::gid_table(std::uint8_t port) const {
  VRDMA_TRY(check_port(port));
  ibv_port_attr p{};
  if (int e = ibv_query_port(c_->ctx, port, &p); e != 0) return verbs_error(e, name_ + ": query port " + std::to_string(port));
  std::vector<GidEntry> out;
  for (int i = 0; i < p.gid_tbl_len; ++i) {
    ibv_gid_entry g{};
    if (ibv_query_gid_ex(c_->ctx, port, static_cast<std::uint32_t>(i), &g, 0) != 0) continue;  // empty slot
    out.push_back(GidEntry{gid_of(g.gid), gid_type_of(*this, g.gid_type), g.gid_index, ifname_of(g.ndev_ifindex)});
  }
  return out;
}

Result<GidEntry> VerbsDevice::query_gid(std::uint32_t index, std::uint8_t port) const {
  VRDMA_TRY(check_port(port));
  ibv_gid_entry g{};
  if (int e = ibv_query_gid_ex(c_->ctx, port, index, &g, 0); e != 0) {
    if (e == ENODATA || e == EINVAL || e == -ENODATA || e == -EINVAL)
      return make_error(Errc::invalid_argument, "GID index " + std::to_string(index) + " on port " + std::to_string(port) +
                                                    " of " + name_ + " is empty or out of range (see gid_table())");
    return verbs_error(e, name_ + ": query GID " + std::to_string(index));
  }
  return GidEntry{gid_of(g.gid), gid_type_of(*this, g.gid_type), g.gid_index, ifname_of(g.ndev_ifindex)};
}

Result<std::shared_ptr<ProtectionDomain>> VerbsDevice::alloc_pd() {
  ibv_pd* pd = ibv_alloc_pd(c_->ctx);
  if (pd == nullptr) return verbs_error(errno, name_ + ": alloc PD");
  auto self = std::static_pointer_cast<VerbsDevice>(shared_from_this());
  return std::shared_ptr<ProtectionDomain>(std::make_shared<VerbsPd>(std::move(self), pd));
}

Result<std::shared_ptr<CompletionQueue>> VerbsDevice::create_cq(std::uint32_t cqe) {
  if (cqe == 0 || cqe > 0x7fffffffu)
    return make_error(Errc::invalid_argument, "create_cq: " + std::to_string(cqe) + " entries is not a valid CQ size on " + name_);
  ibv_comp_channel* ch = ibv_create_comp_channel(c_->ctx);
  if (ch == nullptr) return verbs_error(errno, name_ + ": create completion channel");
  // event_fd() is non-blocking, as the API promises: waiters use epoll/poll.
  const int fl = ::fcntl(ch->fd, F_GETFL);
  if (fl < 0 || ::fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    const int e = errno;
    ibv_destroy_comp_channel(ch);
    return verbs_error(e, name_ + ": make the completion channel non-blocking");
  }
  ibv_cq* cq = ibv_create_cq(c_->ctx, static_cast<int>(cqe), nullptr, ch, 0);
  if (cq == nullptr) {
    const int e = errno;
    ibv_destroy_comp_channel(ch);
    return verbs_error(e, name_ + ": create a CQ of " + std::to_string(cqe) + " entries");
  }
  auto self = std::static_pointer_cast<VerbsDevice>(shared_from_this());
  return std::shared_ptr<CompletionQueue>(std::make_shared<VerbsCq>(std::move(self), ch, cq));
}

Status VerbsDevice::quiesce() {
  return make_error(Errc::not_supported, name_ + " cannot quiesce at a consistent point (NIC state is not exportable); "
                                                 "migrate verbs devices by draining and re-creating their objects");
}

Status VerbsDevice::resume() {
  return make_error(Errc::not_supported, name_ + " cannot be quiesced, so there is nothing to resume");
}

// ---- PD children ---------------------------------------------------------------------------
Result<std::shared_ptr<MemoryRegion>> VerbsPd::reg_mr(void* addr, std::size_t length, Access access,
                                                      const MrOptions& opts) {
  const std::string& dn = dev_->name();
  if (addr == nullptr && length > 0) return make_error(Errc::invalid_argument, "reg_mr: null address");
  if (!rights_consistent(access)) return make_error(Errc::invalid_argument, std::string("reg_mr: ") + kRightsInconsistent);
  if (opts.requested_key != 0)
    return make_error(Errc::not_supported, "reg_mr: " + dn + " picks memory keys itself; a requested key (" +
                                               std::to_string(opts.requested_key) + ") is not supported by verbs");
  if (opts.remote_invalidate)
    return make_error(Errc::not_supported, "reg_mr: " + dn + ": a region a peer may invalidate is a fast-registered "
                                               "one, which only a kernel user can make; verbs registers plain ones");
  if (opts.observer)
    return make_error(Errc::not_supported, "reg_mr: " + dn + " writes registered memory by DMA and cannot report the "
                                               "bytes it writes; a write observer is not supported by verbs");
  constexpr std::uint32_t kSiwVendor = 0x626d74;  // "bmt", siw's vendor id
  if (opts.iova && dev_->vendor_id() == kSiwVendor && dev_->iwarp())
    return make_error(Errc::not_supported,
                      "reg_mr: " + dn + " (Linux siw) registers user memory at its process address and ignores an "
                                        "iova (siw_reg_user_mr drops it): MrOptions::iova is not supported there");
  const int acc = static_cast<int>(static_cast<std::uint32_t>(access));
  ibv_mr* mr = opts.iova ? ibv_reg_mr_iova(pd_, addr, length, *opts.iova, acc) : ibv_reg_mr(pd_, addr, length, acc);
  if (mr == nullptr) return verbs_error(errno, dn + ": register " + std::to_string(length) + " bytes");
  const std::uint64_t a = opts.iova.value_or(reinterpret_cast<std::uint64_t>(addr));
  {
    std::lock_guard lk(mr_mu_);
    mrs_[mr->lkey] = MrSpan{a, static_cast<std::uint8_t*>(addr), length};
  }
  return std::shared_ptr<MemoryRegion>(std::make_shared<VerbsMr>(shared_from_this(), mr, a, access));
}

std::uint8_t* VerbsPd::host_of(std::uint32_t lkey, std::uint64_t addr, std::uint64_t len) const {
  std::lock_guard lk(mr_mu_);
  auto it = mrs_.find(lkey);
  if (it == mrs_.end()) return nullptr;
  const MrSpan& m = it->second;
  if (addr < m.addr || addr - m.addr > m.length || len > m.length - (addr - m.addr)) return nullptr;
  return m.host + (addr - m.addr);
}

void VerbsPd::forget_mr(std::uint32_t lkey) {
  std::lock_guard lk(mr_mu_);
  mrs_.erase(lkey);
}

Result<std::shared_ptr<AddressHandle>> VerbsPd::create_ah(const AhAttr& a) {
  if (dev_->iwarp())
    return make_error(Errc::not_supported, "create_ah: " + dev_->name() +
                                               " is iWARP, which has connected (RC) QPs only: no UD, so no address handles");
  auto ll = dev_->link_layer(a.port_num);
  if (!ll) return std::move(ll).error();
  if (*ll == LinkLayer::infiniband)
    return make_error(Errc::not_supported, "create_ah: port " + std::to_string(a.port_num) + " of " + dev_->name() +
                                               " is InfiniBand, which needs a destination LID the API does not carry yet");
  ibv_ah_attr ia = ah_of(a);
  ibv_ah* ah = ibv_create_ah(pd_, &ia);
  if (ah == nullptr) return verbs_error(errno, dev_->name() + ": create AH to " + a.dgid.str());
  return std::shared_ptr<AddressHandle>(std::make_shared<VerbsAh>(shared_from_this(), ah, a));
}

Result<std::shared_ptr<SharedReceiveQueue>> VerbsPd::create_srq(std::uint32_t max_wr, std::uint32_t max_sge) {
  ibv_device_attr da{};
  if (ibv_query_device(dev_->ctx(), &da) == 0 && da.max_srq == 0)
    return make_error(Errc::not_supported, "create_srq: " + dev_->name() + " has no shared receive queues");
  ibv_srq_init_attr ia{};
  ia.attr.max_wr = max_wr;
  ia.attr.max_sge = max_sge;
  ibv_srq* srq = ibv_create_srq(pd_, &ia);
  if (srq == nullptr)
    return verbs_error(errno, dev_->name() + ": create an SRQ of " + std::to_string(max_wr) + " work requests and " +
                                  std::to_string(max_sge) + " SGEs");
  return std::shared_ptr<SharedReceiveQueue>(
      std::make_shared<VerbsSrq>(shared_from_this(), srq, ia.attr.max_wr, ia.attr.max_sge));
}

// ---- CQ ------------------------------------------------------------------------------------
VerbsCq::~VerbsCq() {
  ack_events();  // ibv_destroy_cq waits for every reported event to be acknowledged
  ibv_destroy_cq(cq_);
  ibv_destroy_comp_channel(ch_);
}

Result<std::size_t> VerbsCq::poll(std::span<WorkCompletion> out) {
  std::lock_guard lk(mu_);
  std::size_t done = 0;
  ibv_wc wc[16];
  while (done < out.size()) {
    const int want = static_cast<int>(std::min<std::size_t>(out.size() - done, 16));
    const int n = ibv_poll_cq(cq_, want, wc);
    if (n < 0)
      return make_error(Errc::io_error, dev_->name() + ": polling the CQ failed (" + std::to_string(n) +
                                            "); the CQ is in error, e.g. it overflowed: create a larger CQ");
    for (int i = 0; i < n; ++i) {
      const ibv_wc& w = wc[i];
      WorkCompletion& o = out[done++];
      o = WorkCompletion{};
      o.wr_id = w.wr_id;
      o.status = static_cast<WcStatus>(w.status);
      o.opcode = static_cast<WcOpcode>(w.opcode);
      o.vendor_err = w.vendor_err;
      o.byte_len = w.byte_len;
      o.qp_num = w.qp_num;
      o.src_qp = w.src_qp;
      o.pkey_index = w.pkey_index;
      std::uint32_t f = 0;
      if ((w.wc_flags & IBV_WC_GRH) != 0) f |= static_cast<std::uint32_t>(WcFlags::grh);
      if ((w.wc_flags & IBV_WC_WITH_IMM) != 0) {
        f |= static_cast<std::uint32_t>(WcFlags::with_imm);
        o.imm_data = be32toh(w.imm_data);
      }
      if ((w.wc_flags & IBV_WC_WITH_INV) != 0) {
        f |= static_cast<std::uint32_t>(WcFlags::with_inv);
        o.invalidated_rkey = w.invalidated_rkey;
      }
      o.wc_flags = static_cast<WcFlags>(f);
      annotate(w, o);
    }
    if (n < want) break;
  }
  return done;
}

void VerbsCq::attach(VerbsQp* qp) {
  std::lock_guard lk(qps_mu_);
  qps_[qp->qp_num()] = qp;
}

void VerbsCq::detach(std::uint32_t qp_num) {
  std::lock_guard lk(qps_mu_);
  qps_.erase(qp_num);
}

// What only the QP knows about a completion: whether it was an error (iWARP state tracking) and,
// for a UD receive with a GRH, the sender's GID from the receive buffer (verbs hands out only
// the wr_id; the NIC wrote the GRH into the first 40 bytes of the buffer).
void VerbsCq::annotate(const ibv_wc& w, WorkCompletion& o) {
  const bool ok = w.status == IBV_WC_SUCCESS;
  const bool recv = ok && (w.opcode & IBV_WC_RECV) != 0;  // the opcode is valid only on success
  if (ok && !recv) return;  // a send, READ, WRITE or atomic that worked: nothing to learn
  std::lock_guard lk(qps_mu_);  // a QP detaches in its destructor: it lives while we hold this
  auto it = qps_.find(w.qp_num);
  if (it == qps_.end()) return;
  VerbsQp& qp = *it->second;
  auto e = qp.completed(w.wr_id, ok, recv);
  if (!e || (w.wc_flags & IBV_WC_GRH) == 0 || e->length < 40) return;
  const std::uint8_t* grh = qp.pd().host_of(e->lkey, e->addr, 40);
  if (grh == nullptr) return;
  if (auto g = grh_source(std::span<const std::uint8_t, 40>(grh, 40))) o.sgid = *g;
}

Status VerbsCq::req_notify(bool solicited_only) {
  if (int e = ibv_req_notify_cq(cq_, solicited_only ? 1 : 0); e != 0) return verbs_error(e, dev_->name() + ": arm CQ");
  return {};
}

std::uint64_t VerbsCq::ack_events() noexcept {
  std::uint64_t n = 0;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (ibv_get_cq_event(ch_, &cq, &ctx) == 0) ++n;  // the channel fd is non-blocking: EAGAIN ends it
  if (n > 0) ibv_ack_cq_events(cq_, static_cast<unsigned>(n));
  return n;
}

// ---- SRQ -----------------------------------------------------------------------------------
Status VerbsSrq::post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) {
  constexpr std::size_t kMaxSge = 32;
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const RecvWr& w = wrs[i];
    if (w.sg_list.size() > std::min<std::size_t>(max_sge_, kMaxSge)) {
      if (bad_index) *bad_index = i;
      return make_error(Errc::invalid_argument, "SRQ on " + pd_->dev().name() + ": " + std::to_string(w.sg_list.size()) +
                                                    " SGEs, the SRQ takes at most " + std::to_string(max_sge_));
    }
    ibv_sge sg[kMaxSge];
    ibv_recv_wr r{};
    r.wr_id = w.wr_id;
    r.sg_list = sg;
    r.num_sge = copy_sges(w.sg_list, sg);
    ibv_recv_wr* bad = nullptr;
    log_.add(wrs.subspan(i, 1));  // before the NIC can complete it
    if (int e = ibv_post_srq_recv(srq_, &r, &bad); e != 0) {
      log_.undo_last();
      if (bad_index) *bad_index = i;
      if (e == ENOMEM) return make_error(Errc::would_block, "SRQ on " + pd_->dev().name() + " is full (" + std::to_string(max_wr_) + " work requests)");
      return verbs_error(e, "SRQ on " + pd_->dev().name() + ": post receive");
    }
  }
  return {};
}

}  // namespace vrdma::nicdrv::verbs
