// The pv provider's data path (docs/virtio-rdma.md): posting writes WQEs into the rings in
// DMA memory and rings a doorbell; polling reads CQEs the device wrote (owner byte last).
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include <fmt/format.h>

#include "pv_internal.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::pv::detail {

// ---- CQ -------------------------------------------------------------------------------------
PvCq::~PvCq() {
  dev_->unregister_cq(handle_);
  dev_->destroy(vd::Cmd::destroy_cq, handle_);
  ::close(efd_);
}

Result<std::size_t> PvCq::poll(std::span<WorkCompletion> out) {
  const std::size_t n = take(out);
  if (n == 0 && dev_->fatal()) return dev_->fatal_error();
  // Nothing yet: the backend that produces it may be waiting for this core (vrdmad and the
  // engine's thread on a host whose cores are shared). An empty poll hands the core over.
  if (n == 0 && !out.empty() && dev_->yield_when_idle()) ::sched_yield();
  return n;
}

std::size_t PvCq::take(std::span<WorkCompletion> out) {
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  auto* ctl = reinterpret_cast<vd::CqControl*>(ring_.a.host);
  auto* cqes = reinterpret_cast<vd::Cqe*>(ring_.a.host + vd::kCqeOffset);
  while (n < out.size()) {
    vd::Cqe& c = cqes[consumer_ & (depth_ - 1)];
    const auto owner = std::atomic_ref<std::uint8_t>(c.owner).load(std::memory_order_acquire);
    if (owner != vd::cqe_phase(consumer_, depth_)) break;
    out[n++] = nicdrv::from_cqe(c);
    ++consumer_;
  }
  if (n > 0) std::atomic_ref<std::uint32_t>(ctl->consumer).store(consumer_, std::memory_order_release);
  return n;
}

std::uint64_t PvCq::ack_events() noexcept {
  std::uint64_t n = 0;
  if (::read(efd_, &n, sizeof n) != sizeof n) return 0;
  return n;
}

void PvCq::signal() {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto w = ::write(efd_, &one, sizeof one);
}

// ---- receive rings, SRQ --------------------------------------------------------------------
Result<std::size_t> write_recv_wqes(WqRing& ring, const vd::QpStatus* status, bool rq, std::uint32_t max_sge,
                                    std::span<const RecvWr> wrs, std::size_t* bad, const std::string& what) {
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const std::uint32_t consumed =
        std::atomic_ref<const std::uint32_t>(rq ? status->rq_consumed : status->rq_consumed).load(std::memory_order_acquire);
    if (ring.produced - consumed >= ring.depth) {
      if (bad) *bad = i;
      return make_error(Errc::would_block, fmt::format("{}: receive ring is full ({} work requests)", what, ring.depth));
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

Status PvSrq::post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) {
  std::lock_guard lk(mu_);
  const auto* st = reinterpret_cast<const vd::QpStatus*>(status_.a.host);
  auto n = write_recv_wqes(ring_, st, true, max_sge_, wrs, bad_index, dev_->name() + " SRQ");
  Status s = dev_->ring(vd::DoorbellKind::srq, h_, ring_.produced);
  if (!n) return std::move(n).error();
  return s;
}

// ---- QP -------------------------------------------------------------------------------------
Status PvQp::modify(const QpAttr& attr, QpAttrMask mask) {
  vd::ModifyQpReq m{};
  m.qp = r_.qp;
  m.mask = static_cast<std::uint32_t>(mask);
  m.attr = nicdrv::qp_attr_to_wire(attr);
  VRDMA_TRY(dev_->call_void(vd::Cmd::modify_qp, m));
  if (any(mask & QpAttrMask::state)) state_.store(attr.qp_state);
  return {};
}

Result<QpAttr> PvQp::query() const {
  auto w = dev_->call<vd::QpAttrWire>(vd::Cmd::query_qp, vd::HandleReq{r_.qp, 0});
  if (!w) return std::move(w).error();
  auto a = nicdrv::qp_attr_from_wire(*w);
  if (!a) return make_error(Errc::protocol_error, dev_->name() + ": the device answered QUERY_QP with bad values");
  return *a;
}

QpState PvQp::state() const noexcept {
  auto w = dev_->call<vd::QpAttrWire>(vd::Cmd::query_qp, vd::HandleReq{r_.qp, 0});
  if (w)
    if (auto s = nicdrv::qp_state_from_wire(w->qp_state)) return *s;
  return known_state();
}

Status PvQp::post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) {
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

std::string PvQp::qp_name() const { return fmt::format("{} QP {:#x}", dev_->name(), r_.qp_num); }

namespace {

// A REG_MR work request as the device's WQE: the region's page list written into its DMA
// memory (the buffer must be device memory in one piece, starting at iova's offset in a page).
Result<vd::RegMrWqe> reg_mr_wqe(PvDevice& dev, const PvPd& pd, const SendWr& wr, const std::string& who) {
  auto* mr = dynamic_cast<PvFastMr*>(wr.reg.mr);
  if (mr == nullptr || &mr->device() != &dev || &mr->pd() != &pd)
    return make_error(Errc::invalid_argument, who + ": REG_MR: the region is not one alloc_mr made on this QP's PD");
  const std::uint32_t shift = wr.reg.page_shift;
  if (shift < 12 || shift > vd::kFastRegMaxPageShift)
    return make_error(Errc::invalid_argument, fmt::format("{}: REG_MR: page_shift {} is outside 12..{}", who, shift,
                                                          vd::kFastRegMaxPageShift));
  if (wr.reg.length == 0 || wr.reg.iova + wr.reg.length < wr.reg.iova)
    return make_error(Errc::invalid_argument, who + ": REG_MR: a zero or wrapping length");
  auto gpa = dev.transport().gpa_of(wr.reg.addr, wr.reg.length);
  if (!gpa)
    return make_error(Errc::invalid_argument, fmt::format("{}: REG_MR: {} bytes at {} are not device memory in one "
                                                          "piece; allocate them with Device::alloc_buffer()",
                                                          who, wr.reg.length, wr.reg.addr));
  VRDMA_TRY(same_page_offset(who + ": REG_MR", wr.reg.iova, *gpa, shift));
  const std::uint64_t npages = pages_spanned(*gpa, wr.reg.length, shift);
  if (npages > mr->max_pages())
    return make_error(Errc::invalid_argument, fmt::format("{}: REG_MR: {} bytes span {} pages of {}; the region was made "
                                                          "for {}", who, wr.reg.length, npages, std::uint64_t{1} << shift,
                                                          mr->max_pages()));
  write_page_list(mr->page_list().a.host, *gpa, npages, shift);
  vd::RegMrWqe w{};
  w.wr_id = wr.wr_id;
  w.opcode = vd::kWrRegMr;
  w.flags = static_cast<std::uint8_t>(nicdrv::send_flags_to_wire(wr.flags) & (vd::kSendFence | vd::kSendSignaled));
  w.key = wr.reg.key;
  w.iova = wr.reg.iova;
  w.mr = mr->handle();
  w.access = static_cast<std::uint32_t>(wr.reg.access);
  w.length = wr.reg.length;
  w.pages_gpa = mr->page_list().a.gpa;
  w.npages = static_cast<std::uint32_t>(npages);
  w.page_shift = shift;
  mr->registered(wr.reg.key, wr.reg.iova, wr.reg.length, wr.reg.access);
  return w;
}

}  // namespace

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
      result = fail(i, make_error(Errc::would_block, fmt::format("{}: send queue is full ({} work requests); poll the CQ "
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
    if (is_datagram(type_) && (wr.opcode != WrOpcode::send && wr.opcode != WrOpcode::send_with_imm)) {
      result = fail(i, make_error(Errc::invalid_argument, qp_name() + ": UD QPs carry only SEND and SEND_WITH_IMM, not " +
                                                              std::string(to_string(wr.opcode))));
      break;
    }
    if ((wr.opcode == WrOpcode::send_with_inv || is_local_op(wr.opcode)) &&
        (dev_->config().features & vd::kFeatureFastReg) == 0) {
      result = fail(i, make_error(Errc::not_supported, qp_name() + ": the virtio RDMA device offers no fast "
                                                           "registration, so no " + std::string(to_string(wr.opcode))));
      break;
    }
    if (wr.opcode == WrOpcode::reg_mr) {
      auto w = reg_mr_wqe(*dev_, *pd_, wr, qp_name());
      if (!w) {
        result = fail(i, std::move(w).error());
        break;
      }
      std::memcpy(sq_.slot(sq_.produced), &*w, sizeof *w);
      ++sq_.produced;
      continue;
    }
    if (is_datagram(type_) && wr.ud.ah == nullptr) {
      result = fail(i, make_error(Errc::invalid_argument, qp_name() + ": a UD send needs an address handle"));
      break;
    }
    auto* p = sq_.slot(sq_.produced);
    vd::SendWqe w{};
    w.wr_id = wr.wr_id;
    w.opcode = static_cast<std::uint8_t>(wr.opcode);
    w.flags = nicdrv::send_flags_to_wire(wr.flags);
    // LOCAL_INV and SEND with Invalidate carry their key where the immediate would be.
    w.imm_data = wr.opcode == WrOpcode::local_inv || wr.opcode == WrOpcode::send_with_inv ? wr.invalidate_rkey : wr.imm_data;
    const bool atomic = wr.opcode == WrOpcode::atomic_cmp_and_swp || wr.opcode == WrOpcode::atomic_fetch_and_add;
    w.remote_addr = atomic ? wr.atomic.remote_addr : wr.rdma.remote_addr;
    w.rkey = atomic ? wr.atomic.rkey : wr.rdma.rkey;
    w.compare_add = wr.atomic.compare_add;
    w.swap = wr.atomic.swap;
    if (is_datagram(type_)) {
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

}  // namespace vrdma::pv::detail
