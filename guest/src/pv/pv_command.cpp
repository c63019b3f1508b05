// The pv provider's control commands and doorbells: the control queue (one command at a time,
// answered in place) and the shared doorbell queue (docs/virtio-rdma.md).
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "pv_internal.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::pv::detail {

// A command's status is an errno number (the contract): its kind is common/result.hpp's.
Errc errc_of(std::uint32_t status) {
  const Errc e = errc_of_errno(static_cast<int>(status));
  return e == Errc::ok ? Errc::io_error : e;  // a refusal said "success": the device broke the contract
}

Result<std::vector<std::uint8_t>> PvDevice::command(vd::Cmd cmd, const void* body, std::size_t len, std::size_t resp_len,
                                                    int timeout_ms) const {
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

void PvDevice::destroy(vd::Cmd cmd, std::uint32_t handle) const {
  if (fatal()) return;  // the device has no objects any more
  auto s = call_void(cmd, vd::HandleReq{handle, 0});
  if (!s.ok()) log::warn("pv: {} {} failed: {}", vd::cmd_name(static_cast<std::uint32_t>(cmd)), handle, s.error().message);
}

Status PvDevice::use_db_ring() {
  if ((cfg_.features & vd::kFeatureDbRing) == 0)
    return make_error(Errc::not_supported, name_ + ": the device offers no doorbell rings (FEATURE_DB_RING)");
  if (db_ring_ != 0) return {};
  auto a = t_->alloc_dma(virtio_rdma_db_ring_bytes(kDbRingDepth));
  if (!a) return std::move(a).error();
  Dma ring(t_.get(), *a);
  std::memset(ring.a.host, 0, ring.a.len);
  auto h = call<vd::HandleResp>(vd::Cmd::create_db_ring, vd::CreateDbRingReq{ring.a.gpa, kDbRingDepth, 0});
  if (!h) return std::move(h).error();
  std::lock_guard lk(db_mu_);
  dbr_ = std::move(ring);
  dbr_prod_ = 0;
  db_ring_ = h->handle;
  return {};
}

// A record on our doorbell ring, then a notification unless the device polls the ring.
Status PvDevice::ring_record(const vd::Doorbell& d) {
  auto* hdr = reinterpret_cast<vd::DbRingHeader*>(dbr_.a.host);
  std::optional<std::chrono::steady_clock::time_point> deadline;  // read the clock only when full
  while (dbr_prod_ - std::atomic_ref(hdr->consumed).load(std::memory_order_acquire) >= kDbRingDepth) {
    VRDMA_TRY(t_->notify(vd::kDoorbellQueue));
    const auto now = std::chrono::steady_clock::now();
    if (!deadline) deadline = now + std::chrono::milliseconds(kCommandTimeoutMs);
    if (now > *deadline)
      return make_error(Errc::timeout, name_ + ": the device takes no records from the doorbell ring; is vrdmad alive?");
    std::this_thread::yield();
  }
  std::memcpy(dbr_.a.host + vd::kDbRingRecordsOffset + (dbr_prod_ % kDbRingDepth) * sizeof d, &d, sizeof d);
  ++dbr_prod_;
  std::atomic_ref(hdr->producer).store(dbr_prod_, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the producer before the flags
  if ((std::atomic_ref(hdr->flags).load(std::memory_order_acquire) & vd::kDbRingNoKick) != 0) return {};
  return t_->notify(vd::kDoorbellQueue);
}

// One doorbell record through the shared doorbell queue (or our doorbell ring).
Status PvDevice::ring(vd::DoorbellKind kind, std::uint32_t handle, std::uint32_t value) {
  if (fatal()) return fatal_error();
  std::lock_guard lk(db_mu_);
  if (db_ring_ != 0) return ring_record(vd::Doorbell{handle, static_cast<std::uint16_t>(kind), 0, value, 0});
  while (t_->get_used(vd::kDoorbellQueue)) {
  }
  // The queue raises no interrupt (set up so in PvDevice::open: we reap it here, as we post),
  // except while we wait for room on it. The clock is read only then (a clock read may be a
  // system call: a guest's clocksource without a vDSO path).
  std::optional<std::chrono::steady_clock::time_point> deadline;
  while (t_->free_slots(vd::kDoorbellQueue) == 0) {
    if (t_->get_used(vd::kDoorbellQueue)) continue;
    const auto now = std::chrono::steady_clock::now();
    if (!deadline) deadline = now + std::chrono::milliseconds(kCommandTimeoutMs);
    if (now > *deadline)
      return make_error(Errc::timeout, name_ + ": the device takes no doorbells; is vrdmad alive?");
    t_->set_interrupts(vd::kDoorbellQueue, true);
    if (!t_->get_used(vd::kDoorbellQueue)) {
      pollfd p{t_->call_fd(vd::kDoorbellQueue), POLLIN, 0};
      (void)::poll(&p, 1, 10);
    }
    t_->set_interrupts(vd::kDoorbellQueue, false);
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

}  // namespace vrdma::pv::detail
