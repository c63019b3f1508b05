// The device model's frame: vhost::Device callbacks, completions from the engine into the
// guest's completion rings, events, and pause/resume around the stop protocol.
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "vrdma/device/model.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"
#include "vrdma/vhost/write_journal.hpp"

namespace vrdma::device {

// ---- RdmaDevice: the public face ----------------------------------------------------------------
RdmaDevice::RdmaDevice(std::shared_ptr<nicdrv::Device> engine, vhost::EventLoop& loop, RdmaDeviceOptions opts)
    : impl_(std::make_unique<DeviceModel>(std::move(engine), loop, opts)) {}
RdmaDevice::~RdmaDevice() = default;

vhost::DeviceInfo RdmaDevice::info() const {
  vhost::DeviceInfo i;
  i.num_queues = vd::kNumQueues;
  i.max_queue_size = 1024;
  // Behind QEMU's vhost-user-blk the frontend reads a blk-sized window: describe the device there.
  const auto w = vd::carrier_config(impl_->config_space());
  i.compact_config.resize(sizeof w);
  std::memcpy(i.compact_config.data(), &w, sizeof w);
  return i;
}

std::vector<std::uint8_t> RdmaDevice::config() const {
  const vd::Config c = impl_->config_space();
  std::vector<std::uint8_t> out(sizeof c);
  std::memcpy(out.data(), &c, sizeof c);
  return out;
}

vd::Config DeviceModel::config_space() const {
  vd::Config c{};
  c.signature = vd::kSignature;
  c.version = vd::kVersion;
  c.num_queues = vd::kNumQueues;
  const auto& lim = opts.limits;
  auto attr = engine->query_device();
  auto port = engine->query_port(1);
  auto gid = engine->query_gid(gid0_index, 1);
  c.features = vd::kFeatureUd | vd::kFeatureSrq | vd::kFeatureMigration | vd::kFeatureDmaMr | vd::kFeatureDbRing;
  if (attr && attr->atomic_cap != nicdrv::AtomicCap::none) c.features |= vd::kFeatureAtomic;
  if (attr && attr->gsi) c.features |= vd::kFeatureGsi;
  if (attr && attr->max_fast_reg_pages != 0) {
    c.features |= vd::kFeatureFastReg;
    c.max_fast_reg_pages = attr->max_fast_reg_pages;
  }
  auto cap = [](std::uint32_t mine, std::uint32_t eng) { return eng != 0 ? std::min(mine, eng) : mine; };
  c.max_qp = attr ? cap(lim.max_qp, attr->max_qp) : lim.max_qp;
  c.max_cq = attr ? cap(lim.max_cq, attr->max_cq) : lim.max_cq;
  c.max_mr = attr ? cap(lim.max_mr, attr->max_mr) : lim.max_mr;
  c.max_pd = attr ? cap(lim.max_pd, attr->max_pd) : lim.max_pd;
  c.max_ah = attr ? cap(lim.max_ah, attr->max_ah) : lim.max_ah;
  c.max_srq = attr ? cap(lim.max_srq, attr->max_srq) : lim.max_srq;
  c.max_qp_wr = attr ? cap(lim.max_qp_wr, attr->max_qp_wr) : lim.max_qp_wr;
  c.max_cqe = attr ? cap(lim.max_cqe, attr->max_cqe) : lim.max_cqe;
  c.max_sge = attr ? cap(lim.max_sge, attr->max_sge) : lim.max_sge;
  c.max_inline = attr ? cap(lim.max_inline, attr->max_inline_data) : lim.max_inline;
  c.max_mr_pages = lim.max_mr_pages;
  c.max_qp_rd_atom = attr ? attr->max_qp_rd_atom : 0;
  c.max_registered_bytes = lim.max_registered_bytes;
  std::memcpy(c.mac, opts.mac, sizeof c.mac);
  c.port_state = port ? static_cast<std::uint8_t>(port->state) : 1;
  c.active_mtu = port ? static_cast<std::uint8_t>(port->active_mtu) : 3;
  if (gid) std::memcpy(c.gid, gid->gid.raw.data(), sizeof c.gid);
  c.transport = attr ? static_cast<std::uint32_t>(attr->transport) : 3;
  return c;
}

void RdmaDevice::attach(vhost::DeviceHost* host) {
  impl_->host = host;
  impl_->memory_changed();
}
void RdmaDevice::memory_changed() { impl_->memory_changed(); }
void RdmaDevice::queue_ready(vhost::Queue& q) { impl_->queue_ready(q); }
void RdmaDevice::queue_stopped(std::uint16_t index) { impl_->queue_stopped(index); }
void RdmaDevice::reset() { impl_->reset(); }
Result<std::vector<std::uint8_t>> RdmaDevice::save_state() {
  return make_error(Errc::not_supported, "this virtio RDMA device is served without its migration code "
                                         "(migration::MigratingDevice saves its state)");
}
Status RdmaDevice::load_state(std::span<const std::uint8_t>) {
  return make_error(Errc::not_supported, "this virtio RDMA device is served without its migration code "
                                         "(migration::MigratingDevice loads a state)");
}
DeviceModel& RdmaDevice::model() { return *impl_; }
void RdmaDevice::set_hooks(ModelHooks* hooks) { impl_->hooks = hooks; }
void RdmaDevice::report_objects_lost() { impl_->queue_event(vd::EventType::device_fatal, 0, vd::kFatalObjectsLost); }
void RdmaDevice::report_backend_restarted() {
  impl_->queue_event(vd::EventType::device_fatal, 0, vd::kFatalBackendRestarted);
}
bool RdmaDevice::poll_round() { return impl_->poll_round(); }
void RdmaDevice::poll_idle() { impl_->poll_idle(); }

RdmaDeviceStats RdmaDevice::stats() const {
  auto s = impl_->st;
  s.pds = static_cast<std::uint32_t>(impl_->pds.size());
  s.mrs = static_cast<std::uint32_t>(impl_->mr_count());
  s.cqs = static_cast<std::uint32_t>(impl_->cqs.size());
  s.qps = static_cast<std::uint32_t>(impl_->qps.size());
  s.ahs = static_cast<std::uint32_t>(impl_->ahs.size());
  s.srqs = static_cast<std::uint32_t>(impl_->srqs.size());
  s.db_rings = static_cast<std::uint32_t>(impl_->db_rings.size());
  s.paused = impl_->paused;
  return s;
}
const nicdrv::Device& RdmaDevice::engine() const { return *impl_->engine; }

// ---- DeviceModel -----------------------------------------------------------------------------------
DeviceModel::DeviceModel(std::shared_ptr<nicdrv::Device> e, vhost::EventLoop& l, RdmaDeviceOptions o)
    : engine(std::move(e)), loop(l), opts(o) {
  if (auto g = nicdrv::preferred_gid(*engine); g.ok() && g->index <= 0xff) gid0_index = static_cast<std::uint8_t>(g->index);
  if (auto a = engine->query_device(); a.ok()) {
    engine_reports_writes = a->reports_writes;
    engine_reports_solicited = a->reports_solicited;
    fast_reg_pages_ = a->max_fast_reg_pages;
  }
  retry_timer = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (retry_timer) {
    auto w = loop.add(retry_timer.get(), EPOLLIN, [this](std::uint32_t) {
      std::uint64_t n;
      [[maybe_unused]] auto r = ::read(retry_timer.get(), &n, sizeof n);
      retry_armed = false;
      retry_stalled();
    });
    if (!w.ok()) log::error("virtio-rdma: cannot watch the retry timer: {}", w.error().message);
  }
}

DeviceModel::~DeviceModel() {
  hooks = nullptr;  // gone before the device
  reset();
  if (retry_timer) loop.remove(retry_timer.get());
}

vhost::GuestView DeviceModel::view() const { return host != nullptr ? host->memory() : vhost::GuestView(); }

void DeviceModel::memory_changed() {
  auto v = view();
  log->log.store(v.log());
  // A DMA memory region covers the guest memory there is: registered again over a new table.
  const auto& regions = v.memory().regions();
  for (auto& [h, mr] : dma_mrs) {
    bool same = regions.size() == mr.parts.size();
    for (std::size_t i = 0; same && i < regions.size(); ++i) same = regions[i] == mr.parts[i].region;
    if (same) continue;
    if (auto s = map_dma_mr(v, mr, true); !s.ok())
      log::error("virtio-rdma: DMA memory region {} (lkey {:#x}) could not follow the new guest memory table: {}; work "
                 "requests using it fail with a local protection error",
                 h, mr.guest_lkey, s.error().message);
  }
}

void DeviceModel::queue_ready(vhost::Queue& q) {
  maybe_resume();
  if (paused) return;
  switch (q.index()) {
    case vd::kControlQueue: control(q); break;
    case vd::kEventQueue: deliver_events(q); break;
    case vd::kDoorbellQueue: doorbells(q); break;
    case vd::kStateQueue:
      if (hooks != nullptr) hooks->state_queue(q);
      break;
    default: break;
  }
}

// GET_VRING_BASE on any ring: the engine stops at a consistent point and the device writes
// nothing more to guest memory until every ring runs again (the vhost-user stop protocol; the
// migration code captures the device state at this point).
void DeviceModel::queue_stopped(std::uint16_t index) {
  if (paused) return;
  pause();
  if (engine_reports_writes)
    log::info("virtio-rdma: ring {} stopped; engine quiesced, nothing is written to guest memory until the rings run again",
              index);
  else
    log::info("virtio-rdma: ring {} stopped; no work is posted and no completion written until the rings run again "
              "({} answers its peers by DMA meanwhile)", index, engine->name());
}

void DeviceModel::pause() {
  if (paused) return;
  auto s = engine->quiesce();
  // A NIC cannot stop at a consistent point (not_supported): expected, not worth a warning.
  if (!s.ok() && !s.error().is(Errc::not_supported))
    log::warn("virtio-rdma: the engine could not quiesce: {}", s.error().message);
  paused = true;
  mark_dma_writable();
  journal_objects();
  if (hooks != nullptr) hooks->rings_stopped();
}

// Where the device's objects lie in guest memory, for the write journal's readers: a page of
// a migrated guest that differs from its source is told apart by what it holds.
void DeviceModel::journal_objects() const {
  if (!vhost::journal::enabled()) return;
  using vhost::journal::Object;
  for (const auto& [h, cq] : cqs)
    vhost::journal::object(Object::cq_ring, h, cq.ring_gpa, vd::kCqeOffset + std::uint64_t{cq.depth} * sizeof(vd::Cqe));
  for (const auto& [h, qp] : qps) {
    vhost::journal::object(Object::send_ring, h, qp.sq.gpa, std::uint64_t{qp.sq.depth} * qp.sq.stride);
    if (qp.srq == vd::kNoHandle) vhost::journal::object(Object::recv_ring, h, qp.rq.gpa, std::uint64_t{qp.rq.depth} * qp.rq.stride);
    vhost::journal::object(Object::qp_status, h, qp.status_gpa, sizeof(vd::QpStatus));
  }
  for (const auto& [h, srq] : srqs) {
    vhost::journal::object(Object::srq_ring, h, srq.ring.gpa, std::uint64_t{srq.ring.depth} * srq.ring.stride);
    vhost::journal::object(Object::qp_status, h, srq.status_gpa, sizeof(vd::QpStatus));
  }
  for (const auto& [h, mr] : mrs) {
    const std::uint64_t psize = std::uint64_t{1} << mr.page_shift;
    for (auto p : mr.observer->pages()) vhost::journal::object(Object::mr_page, h, p, psize);
  }
}

// A NIC writes received SENDs, RDMA WRITEs, READ responses and atomic results into guest memory
// by DMA, out of the backend's sight. Every page it may have written — each page of a region
// with local write access — is marked at the stop, so the frontend's last pass over the dirty
// log carries it (the first pass carried every page already).
void DeviceModel::mark_dma_writable() {
  if (engine_reports_writes) return;
  auto l = log->log.load(std::memory_order_acquire);
  if (!l) return;
  std::uint64_t marked = 0;
  for (const auto& [h, mr] : mrs) {
    if ((mr.access & static_cast<std::uint32_t>(nicdrv::Access::local_write)) == 0) continue;
    const std::uint64_t psize = std::uint64_t{1} << mr.page_shift;
    for (auto p : mr.observer->pages()) l->mark(p, psize);
    marked += mr.observer->pages().size();
  }
  for (const auto& [h, mr] : dma_mrs) {
    if ((mr.access & static_cast<std::uint32_t>(nicdrv::Access::local_write)) == 0) continue;
    for (const auto& p : mr.parts) {
      l->mark(p.gpa, p.size);
      marked += p.size / 4096;
    }
  }
  if (marked != 0)
    log::info("virtio-rdma: {} writes guest memory by DMA unseen; {} pages of its writable regions marked dirty at the stop",
              engine->name(), marked);
}

void DeviceModel::maybe_resume() {
  if (!paused || host == nullptr) return;
  // The state queue is optional (a frontend may run the device with kRequiredQueues queues).
  for (std::uint16_t i = 0; i < vd::kRequiredQueues; ++i)
    if (!host->queue_running(i)) return;
  auto s = engine->resume();
  if (!s.ok() && !s.error().is(Errc::not_supported))
    log::warn("virtio-rdma: the engine could not resume: {}", s.error().message);
  paused = false;
  log::info("virtio-rdma: all rings running again; engine resumed");
  if (hooks != nullptr) hooks->rings_running();
  drain_all();
  retry_pending();
  // Records a process wrote into its doorbell ring while the rings were stopped (or at the
  // source, for a destination): nobody will notify the device of them again.
  if (host->queue_running(vd::kDoorbellQueue)) ring_doorbell_rings(view());
}

void DeviceModel::reset() {
  if (hooks != nullptr) hooks->device_reset();
  // Children before parents, as the engine's ownership rules allow any order anyway.
  for (auto& [fd, h] : cq_by_fd) loop.remove(fd);
  cq_by_fd.clear();
  qps.clear();
  lkey_to_engine.clear();
  rkey_to_engine.clear();
  qpn_to_guest.clear();
  qpn_to_engine.clear();
  qp_by_engine_qpn.clear();
  srqs.clear();
  db_rings.clear();
  db_rings_polled = false;
  next_db_ring_ = 1;
  ahs.clear();
  dma_by_lkey.clear();
  dma_mrs.clear();
  fast_mrs.clear();
  fast_window_bytes = 0;
  mrs.clear();
  cqs.clear();
  pds.clear();
  pending_sq.clear();
  pending_rq.clear();
  pending_srq.clear();
  events.clear();
  st.registered_bytes = 0;
  next_handle_ = 1;  // a new session's handles start over (and fuzzing stays deterministic)
  if (paused) {
    auto s = engine->resume();
    if (!s.ok() && !s.error().is(Errc::not_supported))
      log::warn("virtio-rdma: the engine could not resume after reset: {}", s.error().message);
    paused = false;
  }
}

// ---- Completions --------------------------------------------------------------------------------

// Writes one CQE if the guest's ring has room. The CQE's body is written first, its owner
// (phase) byte last with release order, so a polling driver never sees half a CQE.
bool DeviceModel::write_cqe(std::uint32_t cq_handle, CqObj& cq, const vhost::GuestView& g, const vd::Cqe& cqe) {
  auto consumer = g.read_obj<std::uint32_t>(cq.ring_gpa + offsetof(vd::CqControl, consumer));
  if (!consumer) return false;
  if (cq.produced - *consumer >= cq.depth) {
    if (!cq.stalled) {
      ++st.cq_overruns;
      cq.stalled = true;
      auto ov = g.read_obj<std::uint32_t>(cq.ring_gpa + offsetof(vd::CqControl, overruns));
      if (ov) (void)g.write_obj(cq.ring_gpa + offsetof(vd::CqControl, overruns), *ov + 1);
      log::debug("virtio-rdma: CQ {} is full ({} entries unpolled); completions wait in the engine", cq_handle,
                 cq.depth);
    }
    return false;
  }
  const std::uint64_t slot = cq.ring_gpa + vd::kCqeOffset + std::uint64_t{cq.produced & (cq.depth - 1)} * sizeof(vd::Cqe);
  vd::Cqe body = cqe;
  body.owner = static_cast<std::uint8_t>(vd::cqe_phase(cq.produced, cq.depth) ^ 1u);  // not yet valid
  if (!g.write(slot, &body, offsetof(vd::Cqe, owner)).ok()) return false;
  if (!g.write(slot + offsetof(vd::Cqe, vendor_err), &body.vendor_err, sizeof body.vendor_err).ok()) return false;
  std::atomic_thread_fence(std::memory_order_release);
  const std::uint8_t phase = vd::cqe_phase(cq.produced, cq.depth);
  if (!g.write(slot + offsetof(vd::Cqe, owner), &phase, 1).ok()) return false;
  ++cq.produced;
  ++st.cqes;
  cq.stalled = false;
  (void)g.write_obj(cq.ring_gpa + offsetof(vd::CqControl, producer), cq.produced);
  // An armed CQ raises one event; a solicited-only arm only for a solicited receive or an
  // error (IBA 11.4.2.2). A NIC's completions do not say which receives were solicited: there
  // every receive wakes such a CQ (an extra wake-up rather than a sleeper never woken).
  const bool recv = (cqe.opcode & 128) != 0;
  const bool wakes = !cq.solicited_only || (cqe.wc_flags & vd::kWcSolicited) != 0 || cqe.status != 0 ||
                     (recv && !engine_reports_solicited);
  if (cq.armed && wakes) {
    cq.armed = false;
    if (!cq.event_queued) {
      cq.event_queued = true;
      queue_event(vd::EventType::cq_completion, cq_handle);
    }
  }
  return true;
}

QpObj* DeviceModel::qp_of_completion(const nicdrv::WorkCompletion& wc) {
  auto q = qp_by_engine_qpn.find(wc.qp_num);
  if (q == qp_by_engine_qpn.end()) return nullptr;
  auto it = qps.find(q->second);
  if (it == qps.end()) return nullptr;
  if (static_cast<std::uint8_t>(wc.opcode) >= 128) ++it->second.rq_done;
  return &it->second;
}

nicdrv::AhAttr DeviceModel::engine_ah(const vd::AhWire& w) const {
  auto a = nicdrv::ah_from_wire(w);
  a.sgid_index = engine_sgid(a.sgid_index);
  return a;
}

vd::Cqe DeviceModel::guest_cqe(const nicdrv::WorkCompletion& wc, const QpObj* qp) {
  auto c = nicdrv::to_cqe(wc);
  c.qp_num = guest_qpn_of(wc.qp_num);
  if (qp == nullptr || qp->srq == 0 || static_cast<std::uint8_t>(wc.opcode) < 128) return c;
  auto s = srqs.find(qp->srq);
  if (s == srqs.end() || s->second.held.empty()) return c;
  auto& held = s->second.held;
  // The NIC takes an SRQ's receives in order, so the tag is nearly always the oldest.
  for (auto it = held.begin(); it != held.end(); ++it) {
    if (it->tag != wc.wr_id) continue;
    c.wr_id = it->wr_id;
    held.erase(it);
    return c;
  }
  log::warn("virtio-rdma: SRQ {}: a receive completed under tag {:#x}, which the device never posted", qp->srq, wc.wr_id);
  return c;
}

void DeviceModel::drain_cq(std::uint32_t handle) {
  if (paused || host == nullptr) return;
  auto it = cqs.find(handle);
  if (it == cqs.end()) return;
  CqObj& cq = it->second;
  const vhost::GuestView g = view();
  std::array<nicdrv::WorkCompletion, 32> wcs;
  bool any_send = !cq.backlog.empty();
  while (!cq.backlog.empty() && write_cqe(handle, cq, g, cq.backlog.front())) cq.backlog.pop_front();
  if (!cq.backlog.empty()) {
    arm_retry_timer();
    return;
  }
  // Moves what the engine has into the guest's ring; -1 when the CQ cannot be served.
  auto drain_engine = [&]() -> long {
    long moved = 0;
    for (int round = 0; round < 64; ++round) {
      auto consumer = g.read_obj<std::uint32_t>(cq.ring_gpa + offsetof(vd::CqControl, consumer));
      if (!consumer) {
        log::error("virtio-rdma: CQ {}'s ring at {:#x} is no longer in guest memory; its completions wait", handle,
                   cq.ring_gpa);
        return -1;
      }
      const std::uint32_t room = cq.depth - std::min(cq.depth, cq.produced - *consumer);
      if (room == 0) {
        if (!cq.stalled) {
          cq.stalled = true;
          ++st.cq_overruns;
        }
        arm_retry_timer();
        return moved;
      }
      auto n = cq.eng->poll(std::span(wcs.data(), std::min<std::size_t>(wcs.size(), room)));
      if (!n) {
        log::error("virtio-rdma: engine CQ of CQ {} failed: {}", handle, n.error().message);
        queue_event(vd::EventType::cq_error, handle);
        return -1;
      }
      for (std::size_t i = 0; i < *n; ++i) {
        const auto& wc = wcs[i];
        // On a NIC a QP replaced by its re-creation (or destroyed) may still leave completions
        // behind (flushes): they belong to no QP the guest has.
        const QpObj* of = qp_of_completion(wc);
        if (of == nullptr && engine_rebuilds()) {
          ++moved;
          continue;
        }
        if (wc.status != nicdrv::WcStatus::success) {
          // The QP's status block says ERR before the driver can see the error completion.
          for (auto& [qh, qp] : qps) {
            if (qp.eng->qp_num() != wc.qp_num || qp.eng->state() != nicdrv::QpState::err) continue;
            write_status(g, qp.status_gpa, qp.sq.consumed, qp.rq.consumed, static_cast<std::uint32_t>(nicdrv::QpState::err));
            if (!qp.fatal_reported && wc.status != nicdrv::WcStatus::wr_flush_err) {
              qp.fatal_reported = true;
              queue_event(vd::EventType::qp_fatal, qh, static_cast<std::uint32_t>(wc.status));
              log::info("virtio-rdma: QP {} (QPN {:#x}) went to ERR: work request {:#x} completed with {}; completion {} "
                        "of CQ {}",
                        qh, qp.guest_qpn, wc.wr_id, nicdrv::to_string(wc.status), cq.produced, handle);
            }
          }
        }
        (void)write_cqe(handle, cq, g, guest_cqe(wc, of));
        ++moved;
        if (static_cast<std::uint8_t>(wc.opcode) < 128) any_send = true;
      }
      if (*n < wcs.size()) break;
    }
    return moved;
  };
  if (drain_engine() < 0) return;
  if (polling) {
    hot_cqs.insert(handle);  // polled again next round; armed when polling stops
  } else {
    // The engine raises its event only for a completion pushed while armed: one that arrived
    // between the last poll and the arm would wait forever, so look again after arming.
    for (int k = 0; k < 16; ++k) {
      (void)cq.eng->req_notify(false);
      const long more = drain_engine();
      if (more <= 0) break;
    }
  }
  if (any_send || !pending_rq.empty() || !pending_srq.empty() || !pending_sq.empty()) retry_pending();
  if (!events.empty() && host->queue_running(vd::kEventQueue)) host->run_queue(vd::kEventQueue);
}

bool DeviceModel::poll_round() {
  if (paused || host == nullptr) return false;
  polling = true;
  if (!db_rings_polled && !db_rings.empty()) set_db_rings_polled(view(), true);
  const auto before = st.doorbells + st.cqes + st.commands;
  if (host->queue_running(vd::kDoorbellQueue)) {
    host->set_queue_notification(vd::kDoorbellQueue, false);  // this loop looks at it: no kicks needed
    host->run_queue(vd::kDoorbellQueue);
  }
  hot_scratch.assign(hot_cqs.begin(), hot_cqs.end());  // drain_cq may add to hot_cqs
  for (auto h : hot_scratch) drain_cq(h);
  return st.doorbells + st.cqes + st.commands != before;
}

void DeviceModel::poll_idle() {
  polling = false;
  // The rings' processes notify again; set_queue_notification then runs the doorbell queue, and
  // with it the rings, once more for a record written before they saw the flag go.
  if (db_rings_polled && host != nullptr) set_db_rings_polled(view(), false);
  if (host != nullptr) host->set_queue_notification(vd::kDoorbellQueue, true);  // runs it once more
  std::vector<std::uint32_t> hs(hot_cqs.begin(), hot_cqs.end());
  hot_cqs.clear();
  for (auto h : hs) drain_cq(h);  // arms
}

void DeviceModel::drain_all() {
  std::vector<std::uint32_t> hs;
  hs.reserve(cqs.size());
  for (auto& [h, c] : cqs) hs.push_back(h);
  for (auto h : hs) drain_cq(h);
}

void DeviceModel::retry_stalled() {
  std::vector<std::uint32_t> hs;
  for (auto& [h, c] : cqs)
    if (c.stalled || !c.backlog.empty()) hs.push_back(h);
  for (auto h : hs) drain_cq(h);
}

void DeviceModel::arm_retry_timer() {
  if (retry_armed || !retry_timer) return;
  itimerspec its{};
  its.it_value.tv_nsec = 1'000'000;  // 1 ms: a full CQ is re-checked until the guest polls it
  if (::timerfd_settime(retry_timer.get(), 0, &its, nullptr) == 0) retry_armed = true;
}

// ---- Events -------------------------------------------------------------------------------------
void DeviceModel::queue_event(vd::EventType type, std::uint32_t handle, std::uint32_t info) {
  if (events.size() >= kMaxEvents) {
    ++st.events_dropped;
    if (st.events_dropped == 1 || st.events_dropped % 1000 == 0)
      log::warn("virtio-rdma: the guest posts no event buffers; {} events dropped (the driver must keep the event queue "
                "filled)", st.events_dropped);
    return;
  }
  events.push_back({type, handle, info});
}

void DeviceModel::deliver_events(vhost::Queue& q) {
  while (!events.empty()) {
    auto chain = q.pop();
    if (!chain) return;
    const auto ev = events.front();
    events.pop_front();
    vd::Event e{};
    e.type = static_cast<std::uint32_t>(ev.type);
    e.handle = ev.handle;
    e.info = ev.info;
    if (ev.type == vd::EventType::cq_completion) {
      if (auto it = cqs.find(ev.handle); it != cqs.end()) it->second.event_queued = false;
    }
    vhost::ChainWriter w(q.memory(), *chain);
    std::uint32_t written = 0;
    if (w.remaining() >= sizeof e && w.write(&e, sizeof e).ok()) {
      written = sizeof e;
      ++st.events;
    } else {
      log::warn("virtio-rdma: an event buffer of {} writable bytes is too small for a {}-byte event; event dropped",
                w.remaining(), sizeof e);
      ++st.events_dropped;
    }
    if (!q.push(*chain, written).ok()) return;
  }
}

}  // namespace vrdma::device
