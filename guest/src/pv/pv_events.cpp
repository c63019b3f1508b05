// The pv provider's event queue and state area (docs/virtio-rdma.md): a thread takes the
// device's events (CQ notifications, DEVICE_FATAL, a state area too small) and keeps the event
// buffers and the state area posted.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "pv_internal.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::pv::detail {

void PvDevice::stop_events() {
  if (!events_.joinable()) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] auto w = ::write(stop_fd_, &one, sizeof one);
  events_.join();
  std::uint64_t n;
  [[maybe_unused]] auto r = ::read(stop_fd_, &n, sizeof n);
}

Status PvDevice::post_state_area(std::size_t bytes) {
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

void PvDevice::reap_state_areas() {
  if (t_->num_queues() <= vd::kStateQueue) return;
  while (auto u = t_->get_used(vd::kStateQueue)) state_areas_.erase(u->first);
}

Status PvDevice::post_event_buffer(std::uint16_t i) {
  const ChainBuf b{ev_.a.gpa + i * sizeof(vd::Event), sizeof(vd::Event), true};
  auto id = t_->add(vd::kEventQueue, std::span(&b, 1));
  if (!id) return std::move(id).error();
  ev_slot_[*id] = i;
  return {};
}

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

}  // namespace vrdma::pv::detail
