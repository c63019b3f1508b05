// Soft device: opening, object creation, the engine thread and packet I/O.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "soft/engine.hpp"
#include "soft/gsi.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::nicdrv::soft {

std::chrono::nanoseconds ack_timeout(std::uint8_t timeout) {
  if (timeout == 0) return std::chrono::nanoseconds::max();
  // 4.096 us * 2^timeout; at least 4 ms so that a loaded host does not retransmit spuriously.
  auto ns = std::chrono::nanoseconds(4096ll << std::min<int>(timeout, 31));
  return std::max<std::chrono::nanoseconds>(ns, std::chrono::milliseconds(4));
}

std::chrono::nanoseconds rnr_timer(std::uint8_t code) {
  // IBA table 45, in units of 10 us (code 0 means 655.36 ms).
  static constexpr std::uint32_t us10[32] = {
      65536,   1,    2,    3,    4,    6,    8,     12,    16,    24,    32,    48,    64,    96,    128,   192,
      256,     384,  512,  768,  1024, 1536, 2048,  3072,  4096,  6144,  8192,  12288, 16384, 24576, 32768, 49152};
  return std::chrono::nanoseconds(static_cast<std::int64_t>(us10[code & 31]) * 10000);
}

// ---- CQ -----------------------------------------------------------------------------------------
SoftCq::SoftCq(std::shared_ptr<SoftDevice> dev, std::uint32_t cqe, UniqueFd efd)
    : dev_(std::move(dev)), cap_(cqe), efd_(std::move(efd)), ring_(cqe) {}

Result<std::size_t> SoftCq::poll(std::span<WorkCompletion> out) {
  std::size_t n = 0;
  bool armed = false;
  for (int pass = 0; pass < 2; ++pass) {
    {
      std::lock_guard lk(mu_);
      if (overflow_)
        return make_error(Errc::limit_exceeded, "completion queue overflowed (capacity " + std::to_string(cap_) +
                                                    "); completions were lost: create a larger CQ or poll more often");
      const std::size_t take = std::min(out.size() - n, count_);
      for (std::size_t i = 0; i < take; ++i) {
        out[n + i] = ring_[head_];
        head_ = (head_ + 1) % ring_.size();
      }
      count_ -= take;
      n += take;
      armed = armed_ != 0;
    }
    // Room left: do the engine's receive work here (without the CQ lock, which the engine takes
    // under the device lock), so a polling application needs no thread switch per completion.
    if (pass == 1 || n == out.size() || !dev_->progress(armed)) break;
  }
  return n;
}

Status SoftCq::req_notify(bool solicited_only) {
  {
    std::lock_guard lk(mu_);
    armed_ = solicited_only ? 2 : 1;
  }
  dev_->app_waits();
  return {};
}

std::uint64_t SoftCq::ack_events() noexcept {
  std::uint64_t v = 0;
  if (::read(efd_.get(), &v, sizeof v) != static_cast<ssize_t>(sizeof v)) return 0;
  return v;
}

void SoftCq::push(const WorkCompletion& wc, bool solicited) {
  bool notify = false;
  {
    std::lock_guard lk(mu_);
    if (count_ == ring_.size()) {
      if (!overflow_) log::error("soft: completion queue of capacity {} overflowed; the application must poll faster", cap_);
      overflow_ = true;
      return;
    }
    ring_[(head_ + count_) % ring_.size()] = wc;
    if (solicited) ring_[(head_ + count_) % ring_.size()].wc_flags = wc.wc_flags | WcFlags::solicited;
    ++count_;
    if (armed_ == 1 || (armed_ == 2 && (solicited || wc.status != WcStatus::success))) {
      armed_ = 0;
      notify = true;
    }
  }
  if (notify) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(efd_.get(), &one, sizeof one);
  }
}

// ---- MR / PD ------------------------------------------------------------------------------------
SoftMr::~SoftMr() {
  auto& d = pd_->dev();
  std::lock_guard lk(d.mu_);
  d.mrs.erase(lkey());
  if (fast()) d.fast_mrs.erase(lkey() >> 8);
}

Result<std::shared_ptr<MemoryRegion>> SoftPd::reg_mr(void* addr, std::size_t length, Access access,
                                                     const MrOptions& opts) {
  if (addr == nullptr && length > 0) return make_error(Errc::invalid_argument, "reg_mr: null address");
  if (!rights_consistent(access)) return make_error(Errc::invalid_argument, std::string("reg_mr: ") + kRightsInconsistent);
  if (opts.registered) return make_error(Errc::invalid_argument, "reg_mr: MrOptions::registered is alloc_mr's");
  auto& d = *dev_;
  std::lock_guard lk(d.mu_);
  std::uint32_t key = opts.requested_key;
  if (key != 0) {
    if (d.mrs.count(key) != 0)
      return make_error(Errc::busy, "reg_mr: requested key " + std::to_string(key) + " is already in use on " + d.name());
  } else {
    do {
      key = d.next_key++;
      if (d.next_key >= SoftDevice::kFastKeys) d.next_key = 0x100;
    } while (d.mrs.count(key) != 0 || key == 0);
  }
  auto mr = std::make_shared<SoftMr>(shared_from_this(), static_cast<std::uint8_t*>(addr), length, access, key,
                                     opts.observer, opts.iova, opts.remote_invalidate);
  d.mrs[key] = mr.get();
  return std::shared_ptr<MemoryRegion>(std::move(mr));
}

Result<std::shared_ptr<MemoryRegion>> SoftPd::alloc_mr(std::uint32_t max_pages, const MrOptions& opts) {
  auto& d = *dev_;
  if (max_pages == 0 || max_pages > kMaxFastRegPages)
    return make_error(Errc::invalid_argument, "alloc_mr: " + std::to_string(max_pages) + " pages is outside 1.." +
                                                  std::to_string(kMaxFastRegPages) + " (max_fast_reg_pages of " + d.name() + ")");
  if (opts.iova)
    return make_error(Errc::invalid_argument, "alloc_mr: a fast-registration region takes its address from REG_MR");
  if (opts.registered && (opts.requested_key == 0 || opts.registered->addr == nullptr || opts.registered->length == 0 ||
                          !rights_consistent(opts.registered->access)))
    return make_error(Errc::invalid_argument, "alloc_mr: a region made registered needs its key, memory and consistent "
                                              "rights");
  std::lock_guard lk(d.mu_);
  // A free block of 256 keys: its index names the region for good.
  std::uint32_t index = 0;
  if (opts.requested_key != 0) {  // a region carried over from a migration's source
    index = opts.requested_key >> 8;
    if (index < (SoftDevice::kFastKeys >> 8))
      return make_error(Errc::invalid_argument, fmt::format("alloc_mr: key {:#x} is no fast-registration key (those "
                                                            "are {:#x} and up)", opts.requested_key, SoftDevice::kFastKeys));
    if (d.fast_mrs.count(index) != 0 || d.mrs.count(opts.requested_key) != 0)
      return make_error(Errc::busy, fmt::format("alloc_mr: key {:#x} is no free fast-registration key on {}",
                                                opts.requested_key, d.name()));
  }
  for (std::uint32_t tries = 0; index == 0 && tries < (1u << 23); ++tries) {
    const std::uint32_t i = d.next_fast++;
    if (d.next_fast == (1u << 24)) d.next_fast = SoftDevice::kFastKeys >> 8;  // key = index << 8: 24 bits
    if (d.fast_mrs.count(i) == 0 && d.mrs.count(i << 8) == 0) index = i;
  }
  if (index == 0) return make_error(Errc::no_memory, "alloc_mr: no fast-registration key left on " + d.name());
  const std::uint32_t key = opts.requested_key != 0 ? opts.requested_key : index << 8;
  auto mr = std::make_shared<SoftMr>(shared_from_this(), nullptr, 0, Access::none, key, opts.observer, 0, true);
  mr->make_fast(max_pages);
  if (const auto& r = opts.registered)
    mr->assign(static_cast<std::uint8_t*>(r->addr), r->length, r->iova, r->access, key);
  d.mrs[key] = mr.get();
  d.fast_mrs[index] = mr.get();
  return std::shared_ptr<MemoryRegion>(std::move(mr));
}

Result<std::shared_ptr<QueuePair>> SoftPd::create_qp(const QpInitAttr& init, const QpOptions& opts) {
  auto* scq = dynamic_cast<SoftCq*>(init.send_cq);
  auto* rcq = dynamic_cast<SoftCq*>(init.recv_cq);
  if (scq == nullptr || rcq == nullptr || scq->device() != dev_.get() || rcq->device() != dev_.get())
    return make_error(Errc::invalid_argument, "create_qp: send and receive CQs must be CQs of device " + dev_->name());
  if (init.type != QpType::rc && init.type != QpType::ud && init.type != QpType::gsi)
    return make_error(Errc::not_supported, "create_qp: device " + dev_->name() + " supports RC, UD and GSI QPs only");
  SoftSrq* srq = nullptr;
  if (init.srq != nullptr) {
    srq = dynamic_cast<SoftSrq*>(init.srq);
    if (srq == nullptr || srq->pd() != this)
      return make_error(Errc::invalid_argument, "create_qp: the SRQ belongs to another protection domain");
  }
  const auto& c = init.cap;
  if (c.max_send_wr == 0 || c.max_send_wr > 16384 || (srq == nullptr && c.max_recv_wr > 16384))
    return make_error(Errc::invalid_argument, "create_qp: max_send_wr must be 1..16384 and max_recv_wr 0..16384");
  if (c.max_send_sge > kMaxSge || c.max_recv_sge > kMaxSge)
    return make_error(Errc::invalid_argument, "create_qp: at most " + std::to_string(kMaxSge) + " SGEs per work request");
  if (c.max_inline_data > 1024)
    return make_error(Errc::invalid_argument, "create_qp: max_inline_data above the device limit 1024");
  auto& d = *dev_;
  std::uint32_t qpn = opts.requested_qpn;
  {
    std::lock_guard lk(d.mu_);
    if (init.type == QpType::gsi) {
      // QP1: its MADs go to this QP instead of the engine's own CM agent while it exists.
      if ((qpn != 0 && qpn != mad::kGsiQpn) || d.qps.count(mad::kGsiQpn) != 0)
        return make_error(Errc::busy, "create_qp: " + d.name() + " has one GSI QP (QP1), and it exists already");
      qpn = mad::kGsiQpn;
    } else if (qpn != 0) {
      if (qpn < 2 || qpn > wire::kQpnMask || d.qps.count(qpn) != 0)
        return make_error(Errc::busy, "create_qp: requested QPN " + std::to_string(qpn) + " is reserved or in use on " + d.name());
    } else {
      do {
        qpn = d.next_qpn++;
        if (d.next_qpn > wire::kQpnMask) d.next_qpn = 0x11;
      } while (d.qps.count(qpn) != 0);
    }
    d.qps[qpn] = nullptr;  // reserve
  }
  auto qp = std::make_shared<SoftQp>(shared_from_this(), init, qpn);
  qp->scq = scq->shared_from_this();
  qp->rcq = rcq->shared_from_this();
  if (srq != nullptr) qp->srq = srq->shared_from_this();
  std::lock_guard lk(d.mu_);
  d.qps[qpn] = qp.get();
  return std::shared_ptr<QueuePair>(std::move(qp));
}

Result<std::shared_ptr<AddressHandle>> SoftPd::create_ah(const AhAttr& a) {
  if (!a.dgid.is_ipv4_mapped())
    return make_error(Errc::invalid_argument, "create_ah: GID " + a.dgid.str() + " is not an IPv4-mapped RoCEv2 GID");
  if (a.port_num != 1) return make_error(Errc::invalid_argument, "create_ah: port " + std::to_string(a.port_num) + " does not exist");
  return std::shared_ptr<AddressHandle>(std::make_shared<SoftAh>(shared_from_this(), a));
}

Result<std::shared_ptr<SharedReceiveQueue>> SoftPd::create_srq(std::uint32_t max_wr, std::uint32_t max_sge) {
  if (max_wr == 0 || max_wr > 16384 || max_sge == 0 || max_sge > kMaxSge)
    return make_error(Errc::invalid_argument, "create_srq: max_wr must be 1..16384 and max_sge 1..16");
  return std::shared_ptr<SharedReceiveQueue>(std::make_shared<SoftSrq>(shared_from_this(), max_wr, max_sge));
}

// ---- Device -------------------------------------------------------------------------------------
SoftDevice::SoftDevice(std::string name, std::string netdev, std::uint32_t ip_be, std::uint8_t mac[6], Mtu active_mtu,
                       std::unique_ptr<Link> link, UniqueFd wake_fd, bool busy_poll, bool verify_icrc,
                       std::uint16_t port)
    : name_(std::move(name)), netdev_(std::move(netdev)), ip_be_(ip_be), active_mtu_(active_mtu),
      link_(std::move(link)), wake_fd_(std::move(wake_fd)), busy_poll_(busy_poll), verify_icrc_(verify_icrc),
      port_(port) {
  std::memcpy(mac_.data(), mac, 6);
  tx_mem_.resize(kTxSlots * kPktBuf);
  rx_mem_.resize(kRxSlots * kRxBuf);  // room for whole segmentation runs (engine_loop.cpp)
  for (std::size_t i = 0; i < kRxSlots; ++i) {
    rx_[i].data = rx_mem_.data() + i * kRxBuf;
    rx_[i].cap = static_cast<std::uint32_t>(kRxBuf);
  }
  for (std::size_t i = 0; i < kTxSlots; ++i) tx_[i].data = tx_mem_.data() + i * kPktBuf;
  gsi = std::make_unique<GsiAgent>(*this);
}

SoftDevice::~SoftDevice() { stop(); }

void SoftDevice::start() {
  running_ = true;
  thread_ = std::thread([this] { engine_main(); });
}

void SoftDevice::stop() {
  if (!running_.exchange(false)) return;
  kick();
  std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  if (!quiesced) flush_acks();  // held ACKs (engine_loop.cpp) still go
  tx_flush();
}

void SoftDevice::kick() noexcept {
  if (sleeping_.exchange(false, std::memory_order_acq_rel)) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_fd_.get(), &one, sizeof one);
  }
}

void SoftDevice::set_faults(const FaultConfig& cfg) {
  std::lock_guard lk(mu_);
  tx_flush();
  link_ = make_fault_link(std::move(link_), cfg, st);
}

EngineStats SoftDevice::stats_snapshot() const {
  std::lock_guard lk(mu_);
  EngineStats s = st;
  s.cm_mads_received = gsi->stats.mads_received;
  s.cm_mads_sent = gsi->stats.mads_sent;
  s.cm_mads_dropped = gsi->stats.mads_dropped;
  s.cm_resends = gsi->stats.resends;
  return s;
}

std::uint64_t SoftDevice::node_guid() const noexcept {
  // EUI-64 from the MAC, as RoCE devices derive their node GUID.
  const std::uint8_t e[8] = {static_cast<std::uint8_t>(mac_[0] ^ 2), mac_[1], mac_[2], 0xff, 0xfe, mac_[3], mac_[4], mac_[5]};
  std::uint64_t g = 0;
  for (auto b : e) g = (g << 8) | b;
  return g;
}

Result<DeviceAttr> SoftDevice::query_device() const {
  DeviceAttr a;
  a.name = name_;
  a.provider = "soft";
  a.transport = Transport::roce;
  std::uint64_t g = 0;
  // EUI-64 from the MAC, as RoCE devices derive their node GUID.
  std::uint8_t e[8] = {static_cast<std::uint8_t>(mac_[0] ^ 2), mac_[1], mac_[2], 0xff, 0xfe, mac_[3], mac_[4], mac_[5]};
  for (auto b : e) g = (g << 8) | b;
  a.node_guid = g;
  a.vendor_id = 0;
  a.fw_ver = "vrdma-soft 0.1";
  a.max_mr_size = 1ull << 40;
  a.max_qp = 65536;
  a.max_qp_wr = 16384;
  a.max_sge = kMaxSge;
  a.max_cq = 65536;
  a.max_cqe = 1u << 20;
  a.max_mr = 1u << 20;
  a.max_pd = 65536;
  a.max_ah = 65536;
  a.max_srq = 65536;
  a.max_srq_wr = 16384;
  a.max_qp_rd_atom = 16;
  a.max_qp_init_rd_atom = 16;
  a.max_inline_data = 1024;
  a.atomic_cap = AtomicCap::hca;
  a.reports_writes = true;
  a.reports_solicited = true;
  a.gsi = true;
  a.max_fast_reg_pages = kMaxFastRegPages;
  return a;
}

Result<PortAttr> SoftDevice::query_port(std::uint8_t port) const {
  if (port != 1) return make_error(Errc::invalid_argument, name_ + " has one port (1), not " + std::to_string(port));
  PortAttr p;
  p.state = PortState::active;
  p.max_mtu = Mtu::mtu4096;
  p.active_mtu = active_mtu_;
  p.link_layer = LinkLayer::ethernet;
  p.gid_tbl_len = 1;
  p.max_msg_sz = 1u << 31;
  p.netdev = netdev_;
  return p;
}

Result<std::vector<GidEntry>> SoftDevice::gid_table(std::uint8_t port) const {
  if (port != 1) return make_error(Errc::invalid_argument, name_ + " has one port (1)");
  return std::vector<GidEntry>{GidEntry{Gid::from_ipv4(ip_be_), GidType::roce_v2, 0, netdev_}};
}

Result<GidEntry> SoftDevice::query_gid(std::uint32_t index, std::uint8_t port) const {
  auto t = gid_table(port);
  if (!t) return std::move(t).error();
  if (index >= t->size())
    return make_error(Errc::invalid_argument, "GID index " + std::to_string(index) + " is out of range on " + name_ +
                                                  " (table has " + std::to_string(t->size()) + " entry)");
  return (*t)[index];
}

Result<std::shared_ptr<ProtectionDomain>> SoftDevice::alloc_pd() {
  std::uint32_t h;
  {
    std::lock_guard lk(mu_);
    h = next_pd++;
  }
  auto self = std::static_pointer_cast<SoftDevice>(shared_from_this());
  return std::shared_ptr<ProtectionDomain>(std::make_shared<SoftPd>(std::move(self), h));
}

Result<std::shared_ptr<CompletionQueue>> SoftDevice::create_cq(std::uint32_t cqe) {
  if (cqe == 0 || cqe > (1u << 20))
    return make_error(Errc::invalid_argument, "create_cq: " + std::to_string(cqe) + " entries is outside 1..1048576");
  UniqueFd efd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!efd) return errno_error(errno, "create_cq: eventfd");
  auto self = std::static_pointer_cast<SoftDevice>(shared_from_this());
  return std::shared_ptr<CompletionQueue>(std::make_shared<SoftCq>(std::move(self), cqe, std::move(efd)));
}

Status SoftDevice::quiesce() {
  std::lock_guard lk(mu_);
  quiesced = true;
  flush_acks();  // an ACK an application thread left for later is not part of the QP state
  tx_flush();
  return {};
}

Status SoftDevice::resume() {
  {
    std::lock_guard lk(mu_);
    quiesced = false;
    for (auto& [n, qp] : qps)
      if (qp != nullptr && (!qp->sq_empty() || qp->reads_pending())) mark_active(*qp);
  }
  sleeping_ = true;
  kick();
  return {};
}

void SoftDevice::mark_active(SoftQp& qp) {
  if (!qp.queued) {
    qp.queued = true;
    active.push_back(&qp);
  }
}

// ---- Packet I/O ---------------------------------------------------------------------------------
void SoftDevice::send_packet(std::uint32_t dst_ip_be, wire::Headers& h, std::span<const std::uint8_t> payload) {
  std::uint8_t* p = pkt_begin(dst_ip_be, h, payload.size());
  if (!payload.empty()) std::memcpy(p, payload.data(), payload.size());
  pkt_end();
}

void SoftDevice::send_ack(SoftQp& qp, wire::AckType type, std::uint8_t value, std::uint32_t psn) {
  wire::Headers h;
  h.bth.opcode = wire::Opcode::rc_acknowledge;
  h.bth.dest_qp = qp.attr.dest_qp_num;
  h.bth.psn = psn & wire::kPsnMask;
  h.aeth = wire::Aeth::make(type, value, qp.msn);
  send_packet(qp.dst_ip(), h, {});
  ++st.acks_sent;
}

WcStatus SoftDevice::gather(const SoftQp& qp, const Sge* sge, std::uint32_t n, std::uint32_t offset, std::uint8_t* dst,
                            std::uint32_t len) {
  for (std::uint32_t i = 0; i < n && len > 0; ++i) {
    if (offset >= sge[i].length) {
      offset -= sge[i].length;
      continue;
    }
    std::uint32_t take = std::min(len, sge[i].length - offset);
    SoftMr* mr = find_mr(sge[i].lkey);
    if (mr == nullptr || mr->pd() != qp.pd.get()) return WcStatus::loc_prot_err;
    const std::uint8_t* src = mr->at(sge[i].addr + offset, take);
    if (src == nullptr) return WcStatus::loc_prot_err;
    std::memcpy(dst, src, take);
    dst += take;
    len -= take;
    offset = 0;
  }
  return len == 0 ? WcStatus::success : WcStatus::loc_len_err;
}

WcStatus SoftDevice::scatter(const SoftPd& pd, const Sge* sge, std::uint32_t n, std::uint32_t offset,
                             const std::uint8_t* src, std::uint32_t len) {
  for (std::uint32_t i = 0; i < n && len > 0; ++i) {
    if (offset >= sge[i].length) {
      offset -= sge[i].length;
      continue;
    }
    std::uint32_t put = std::min(len, sge[i].length - offset);
    SoftMr* mr = find_mr(sge[i].lkey);
    if (mr == nullptr || mr->pd() != &pd || !has(mr->access(), Access::local_write)) return WcStatus::loc_prot_err;
    std::uint8_t* dst = mr->at(sge[i].addr + offset, put);
    if (dst == nullptr) return WcStatus::loc_prot_err;
    mr->write(dst, src, put);
    src += put;
    len -= put;
    offset = 0;
  }
  return len == 0 ? WcStatus::success : WcStatus::loc_len_err;
}

void SoftDevice::handle_rx(RxPacket& p) {
  ++st.rx_packets;
  st.rx_bytes += p.len;
  wire::Ipv4Context ip = ip_ctx(ip_be_);
  ip.src_be = p.src_ip_be;
  ip.dst_be = ip_be_;
  ip.udp_src_port = p.src_port;
  ip.ip_id = p.ip_id;
  ip.dont_fragment = p.dont_fragment;
  wire::Packet pkt;
  auto err = wire::parse(std::span<const std::uint8_t>(p.data, p.len), ip, verify_icrc_, pkt);
  if (err == wire::ParseError::bad_icrc && p.alt_ip_id >= 0) {  // a run's segment: see handle_datagram
    ip.ip_id = static_cast<std::uint16_t>(p.alt_ip_id);
    err = wire::parse(std::span<const std::uint8_t>(p.data, p.len), ip, verify_icrc_, pkt);
  }
  if (err != wire::ParseError::none) {
    if (err == wire::ParseError::bad_icrc)
      ++st.rx_dropped_icrc;
    else
      ++st.rx_dropped_malformed;
    log::debug("soft {}: dropped a packet: {}", name_, wire::to_string(err));
    return;
  }
  auto it = qps.find(pkt.hdr.bth.dest_qp);
  // QP1, the General Services Interface (CM MADs): the engine's own CM agent answers, unless
  // a GSI QP of the device's user (a guest's kernel) takes them.
  if (pkt.hdr.bth.dest_qp == mad::kGsiQpn && (it == qps.end() || it->second == nullptr)) {
    gsi->on_packet(pkt, p.src_ip_be);
    return;
  }
  if (it == qps.end() || it->second == nullptr) {
    ++st.rx_dropped_no_qp;
    return;
  }
  SoftQp& qp = *it->second;
  // IBA 9.6.1.1 (C9-43), as Linux rxe's check_keys: a packet of another partition, or between
  // two limited members of one, is dropped and counted, for every QP type and every packet
  // (requests, ACKs, responses).
  if (!wire::pkey_match(pkt.hdr.bth.pkey, pkey_)) {
    ++st.rx_dropped_pkey;
    log::debug("soft {}: dropped a packet for QP {:#x} with P_Key {:#06x} (the partition here is {:#06x})", name_,
               pkt.hdr.bth.dest_qp, pkt.hdr.bth.pkey, pkey_);
    return;
  }
  QpState s = qp.state();
  const auto& oi = wire::info(pkt.hdr.bth.opcode);
  if (is_datagram(qp.type())) {
    if (pkt.hdr.bth.opcode != wire::Opcode::ud_send_only && pkt.hdr.bth.opcode != wire::Opcode::ud_send_only_imm) {
      ++st.rx_dropped_malformed;
      return;
    }
    if (s == QpState::rtr || s == QpState::rts || s == QpState::sqd || s == QpState::sqe)
      responder_ud_packet(qp, pkt, p.src_ip_be);
    return;
  }
  // RC: only the connected peer may talk to this QP.
  if ((oi.flags & wire::kHasDeth) != 0 || p.src_ip_be != qp.dst_ip()) {
    ++st.rx_dropped_malformed;
    return;
  }
  if (qp.cm_wait_rtu) {  // the peer got our REP and is in RTS (IBA 12.9.7.3)
    qp.cm_wait_rtu = false;
    gsi->on_qp_traffic(qp.qp_num());
  }
  if ((oi.flags & wire::kIsRequest) != 0) {
    if (s == QpState::rtr || s == QpState::rts || s == QpState::sqd) responder_packet(qp, pkt, p.src_ip_be);
  } else {
    if (s == QpState::rts || s == QpState::sqd) completer_packet(qp, pkt);
  }
}

TimePoint SoftDevice::retx_interval(const SoftQp& qp) const {
  auto t = ack_timeout(qp.attr.timeout);
  if (t == std::chrono::nanoseconds::max()) return TimePoint::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(t);
}

// ---- Opening ------------------------------------------------------------------------------------
namespace {

struct IfInfo {
  std::string name;
  std::uint32_t ip_be = 0;
};

Result<IfInfo> resolve(std::string_view spec) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return errno_error(errno, "soft: getifaddrs");
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> guard(list, ::freeifaddrs);
  in_addr want{};
  bool by_ip = ::inet_pton(AF_INET, std::string(spec).c_str(), &want) == 1;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    std::uint32_t ip = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    if ((by_ip && ip == want.s_addr) || (!by_ip && spec == i->ifa_name)) return IfInfo{i->ifa_name, by_ip ? want.s_addr : ip};
  }
  // Loopback answers for its whole prefix (127.0.0.0/8): any address in it can be bound.
  for (ifaddrs* i = list; by_ip && i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) == 0) continue;
    std::uint32_t ip = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    std::uint32_t mask = reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr;
    if ((ip & mask) == (want.s_addr & mask)) return IfInfo{i->ifa_name, want.s_addr};
  }
  if (by_ip)
    return make_error(Errc::no_device, "soft: address " + std::string(spec) +
                                           " is not configured on any interface in this network namespace "
                                           "(add it with 'ip addr add' or name an interface)");
  return make_error(Errc::no_device, "soft: interface '" + std::string(spec) +
                                         "' does not exist or has no IPv4 address in this network namespace");
}

}  // namespace

Result<std::shared_ptr<Device>> open(std::string_view spec, const DeviceOptions& opts) {
  if (spec.empty()) return make_error(Errc::invalid_argument, "soft: name an IPv4 address or interface, e.g. soft:10.0.0.1");
  auto ifi = resolve(spec);
  if (!ifi) return std::move(ifi).error();
  std::uint16_t port = wire::kRoceV2Port;
  if (auto p = opts.get("port"); !p.empty()) {
    unsigned v = 0;
    auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
    if (ec != std::errc{} || ptr != p.data() + p.size() || v == 0 || v > 65535)
      return make_error(Errc::invalid_argument, "soft: port=" + std::string(p) + " is not a UDP port");
    port = static_cast<std::uint16_t>(v);
  }
  UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!sock) return errno_error(errno, "soft: socket");
  int one = 1;
  ::setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int pmtu = IP_PMTUDISC_DO;  // DF set, IP ID 0: the IPv4 header the ICRC covers is predictable
  ::setsockopt(sock.get(), IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  int buf = 8 << 20;
  if (::setsockopt(sock.get(), SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) != 0)
    ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  if (::setsockopt(sock.get(), SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) != 0)
    ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = ifi->ip_be;
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    return errno_error(errno, "soft: cannot bind UDP port " + std::to_string(port) + " on " + std::string(spec) +
                                  " (another RoCE engine or rxe may own it)");
  // Active MTU: the largest IB MTU whose packets (with IPv4/UDP/BTH/RETH/ImmDt/ICRC) fit the link.
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifi->name.c_str(), IFNAMSIZ - 1);
  int link_mtu = 1500;
  if (::ioctl(sock.get(), SIOCGIFMTU, &ifr) == 0) link_mtu = ifr.ifr_mtu;
  std::uint8_t mac[6] = {0x02, 0, 0, 0, 0, 0};
  if (::ioctl(sock.get(), SIOCGIFHWADDR, &ifr) == 0) std::memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
  if (std::all_of(mac, mac + 6, [](std::uint8_t b) { return b == 0; })) {
    mac[0] = 0x02;
    std::memcpy(mac + 2, &ifi->ip_be, 4);
  }
  constexpr int kOverhead = 20 + 8 + 12 + 16 + 4 + 4;
  Mtu active = Mtu::mtu256;
  for (auto m : {Mtu::mtu4096, Mtu::mtu2048, Mtu::mtu1024, Mtu::mtu512, Mtu::mtu256})
    if (static_cast<int>(mtu_bytes(m)) + kOverhead <= link_mtu) {
      active = m;
      break;
    }
  if (auto m = opts.get("mtu"); !m.empty()) {
    unsigned v = 0;
    std::from_chars(m.data(), m.data() + m.size(), v);
    auto cap = mtu_from_bytes(v);
    if (!cap) return make_error(Errc::invalid_argument, "soft: mtu=" + std::string(m) + " is not one of 256, 512, 1024, 2048, 4096");
    if (*cap < active) active = *cap;
  }
  UniqueFd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake) return errno_error(errno, "soft: eventfd");
  std::string name = "soft:" + std::string(spec);
  std::uint16_t pkey = wire::kDefaultPkey;
  if (auto k = opts.get("pkey"); !k.empty()) {
    unsigned v = 0;
    const bool hex = k.size() > 2 && k[0] == '0' && (k[1] == 'x' || k[1] == 'X');
    auto [ptr, ec] = std::from_chars(k.data() + (hex ? 2 : 0), k.data() + k.size(), v, hex ? 16 : 10);
    if (ec != std::errc{} || ptr != k.data() + k.size() || v > 0xffff || (v & 0x7fff) == 0)
      return make_error(Errc::invalid_argument, "soft: pkey=" + std::string(k) +
                                                    " is not a P_Key (16 bits, partition in the low 15 not 0; bit 15 "
                                                    "full member), e.g. pkey=0xffff");
    pkey = static_cast<std::uint16_t>(v);
  }
  auto dev = std::make_shared<SoftDevice>(name, ifi->name, ifi->ip_be, mac, active, nullptr, std::move(wake),
                                          opts.flag("busy_poll"), opts.get("verify_icrc", "1") != "0", port);
  dev->set_pkey(pkey);
  // The link needs the device's stats block, so it is made after the device.
  {
    // rx=udp forces the plain socket path (ICRC checked assuming IP ID 0 and DF, as we send).
    // gso=0 sends every packet on its own (no UDP_SEGMENT runs).
    const bool gso = opts.get("gso", "1") != "0";
    std::unique_ptr<Link> link;
    if (opts.get("rx", "raw") != "udp") {
      auto raw = make_raw_rx_link(sock, ifi->ip_be, port, dev->st, gso);
      if (raw) link = std::move(raw).value();
      else log::info("{}: {}; checking received ICRCs as if every peer sent IP ID 0 with DF, as we do", name, raw.error().message);
    }
    if (!link) link = make_udp_link(std::move(sock), port, dev->st, gso, true);
    std::lock_guard lk(dev->mu_);
    dev->set_link(std::move(link));
  }
  dev->start();
  log::debug("soft: opened {} on {} (active MTU {})", name, ifi->name, mtu_bytes(active));
  return std::shared_ptr<Device>(std::move(dev));
}

Status set_faults(Device& dev, const FaultConfig& cfg) {
  auto* d = dynamic_cast<SoftDevice*>(&dev);
  if (d == nullptr) return make_error(Errc::invalid_argument, "set_faults: " + dev.name() + " is not a soft device");
  d->set_faults(cfg);
  return {};
}

Result<EngineStats> stats(const Device& dev) {
  const auto* d = dynamic_cast<const SoftDevice*>(&dev);
  if (d == nullptr) return make_error(Errc::invalid_argument, "stats: " + dev.name() + " is not a soft device");
  return d->stats_snapshot();
}

}  // namespace vrdma::nicdrv::soft
