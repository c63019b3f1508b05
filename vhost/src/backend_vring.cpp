// Backend session: vring setup, start, stop (GET_VRING_BASE), kicks and calls.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backend_session.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/vhost/peer_fd.hpp"
#include "vrdma/vhost/write_journal.hpp"

namespace vrdma::vhost {

std::optional<DescChain> Queue::pop() {
  auto r = ring_.pop(view_);
  if (!r) {
    log::error("virtqueue {}: {}; the queue is stopped until the device is reset", index_, r.error().message);
    return std::nullopt;
  }
  return std::move(*r);
}

Status Queue::push(const DescChain& c, std::uint32_t written) {
  VRDMA_TRY(ring_.push(view_, c, written));
  ++pushed_;
  return {};
}

Result<BackendSession::Vring*> BackendSession::vring(std::uint32_t index, std::string_view what) {
  if (index >= vrings_.size())
    return make_error(Errc::invalid_argument,
                      fmt::format("{} names vring {}, but the device has {} queues", what, index, vrings_.size()));
  return &vrings_[index];
}

BackendSession::Reply BackendSession::set_vring_num(Message& m) {
  const auto s = m.get<VringState>();
  auto v = vring(s.index, "SET_VRING_NUM");
  if (!v) return std::move(v).error();
  if ((*v)->ring) return make_error(Errc::bad_state, fmt::format("SET_VRING_NUM on running vring {}", s.index));
  if (s.num == 0 || s.num > info_.max_queue_size)
    return make_error(Errc::invalid_argument,
                      fmt::format("SET_VRING_NUM {} for vring {} is outside 1..{}", s.num, s.index, info_.max_queue_size));
  (*v)->num = static_cast<std::uint16_t>(s.num);
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::set_vring_addr(Message& m) {
  const auto a = m.get<VringAddr>();
  auto v = vring(a.index, "SET_VRING_ADDR");
  if (!v) return std::move(v).error();
  if ((*v)->ring) {
    // QEMU re-sends the addresses of running rings to switch used-ring logging on and off.
    const auto& o = (*v)->addr;
    if (o.desc_uaddr != a.desc_uaddr || o.avail_uaddr != a.avail_uaddr || o.used_uaddr != a.used_uaddr)
      return make_error(Errc::bad_state, fmt::format("SET_VRING_ADDR moves running vring {}", a.index));
  }
  (*v)->addr = a;
  (*v)->addr_set = true;
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::set_vring_base(Message& m) {
  const auto s = m.get<VringState>();
  auto v = vring(s.index, "SET_VRING_BASE");
  if (!v) return std::move(v).error();
  if ((*v)->ring) return make_error(Errc::bad_state, fmt::format("SET_VRING_BASE on running vring {}", s.index));
  if (s.num > 0xffff && !acked_.has(VirtioFeature::ring_packed))
    return make_error(Errc::invalid_argument, fmt::format("SET_VRING_BASE {:#x} exceeds 16 bits for a split ring", s.num));
  (*v)->base = s.num;
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::get_vring_base(Message& m) {
  const auto s = m.get<VringState>();
  auto v = vring(s.index, "GET_VRING_BASE");
  if (!v) return std::move(v).error();
  stop(static_cast<std::uint16_t>(s.index));
  Message r = make_reply(m);
  r.set(VringState{s.index, (*v)->base});
  return std::optional(std::move(r));
}

BackendSession::Reply BackendSession::set_vring_kick(Message& m) {
  const auto u = m.get<std::uint64_t>();
  const auto index = static_cast<std::uint32_t>(u & kVringIndexMask);
  auto v = vring(index, "SET_VRING_KICK");
  if (!v) return std::move(v).error();
  if ((u & kVringNoFd) != 0)
    return make_error(Errc::not_supported, "SET_VRING_KICK without an fd asks for polling, which this backend lacks");
  UniqueFd fd = m.take_fd(0);
  VRDMA_TRY(check_eventfd(fd.get(), fmt::format("SET_VRING_KICK for vring {}", index), EventfdUse::read));
  if ((*v)->ring) stop(static_cast<std::uint16_t>(index));  // a new kick fd restarts the ring at its base
  (*v)->kick = std::move(fd);
  try_start(static_cast<std::uint16_t>(index));
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::set_vring_call(Message& m) {
  const auto u = m.get<std::uint64_t>();
  const auto index = static_cast<std::uint32_t>(u & kVringIndexMask);
  auto v = vring(index, "SET_VRING_CALL");
  if (!v) return std::move(v).error();
  UniqueFd fd = (u & kVringNoFd) != 0 ? UniqueFd{} : m.take_fd(0);
  if (fd) VRDMA_TRY(check_eventfd(fd.get(), fmt::format("SET_VRING_CALL for vring {}", index), EventfdUse::write));
  (*v)->call = std::move(fd);
  (*v)->call_full_said = false;
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::set_vring_err(Message& m) {
  const auto u = m.get<std::uint64_t>();
  const auto index = static_cast<std::uint32_t>(u & kVringIndexMask);
  auto v = vring(index, "SET_VRING_ERR");
  if (!v) return std::move(v).error();
  UniqueFd fd = (u & kVringNoFd) != 0 ? UniqueFd{} : m.take_fd(0);
  if (fd) VRDMA_TRY(check_eventfd(fd.get(), fmt::format("SET_VRING_ERR for vring {}", index), EventfdUse::write));
  (*v)->err = std::move(fd);
  (*v)->err_full_said = false;
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::set_vring_enable(Message& m) {
  const auto s = m.get<VringState>();
  auto v = vring(s.index, "SET_VRING_ENABLE");
  if (!v) return std::move(v).error();
  if (s.num > 1) return make_error(Errc::invalid_argument, fmt::format("SET_VRING_ENABLE value {} is not 0 or 1", s.num));
  (*v)->enabled = s.num == 1;
  if ((*v)->enabled && (*v)->ring) process(static_cast<std::uint16_t>(s.index));
  return std::optional<Message>{};
}

// After SET_STATUS 0 (set_status), ring 0's new base says whether the driver carries on: a fresh
// driver starts every ring at 0 (split) or at index 0 with both wrap counters set (packed). A
// ring that stopped exactly there is taken as a new driver too (its objects go): for a split
// ring only after 65,536 requests, for a packed one when its index came back to 0.
void BackendSession::settle_reset() {
  reset_pending_ = false;
  const bool packed = acked_.has(VirtioFeature::ring_packed);
  const std::uint32_t fresh = packed ? 0x80008000u : 0u;
  const std::uint32_t base = vrings_[0].base;
  if (base == stop_base0_ && base != fresh && (!packed || base != 0x8000u)) {
    log::info("vhost-user: the rings start again where they stopped (ring 0 at {:#x}) after SET_STATUS 0: the VM runs "
              "on after a stop, and the device keeps its state", base);
    return;
  }
  log::info("vhost-user: the driver starts over after SET_STATUS 0 (ring 0 at {:#x}, stopped at {:#x}): the device is "
            "reset", base, stop_base0_);
  dev_.reset();
}

void BackendSession::try_start(std::uint16_t i) {
  Vring& v = vrings_[i];
  if (v.ring || !v.kick || !v.addr_set || v.num == 0) return;
  if (reset_pending_ && i == 0) settle_reset();
  RingSetup s;
  s.size = v.num;
  s.packed = acked_.has(VirtioFeature::ring_packed);
  s.event_idx = acked_.has(VirtioFeature::ring_event_idx);
  s.indirect = acked_.has(VirtioFeature::ring_indirect_desc);
  const RingSetup sizes = s;
  auto desc = mem_->uaddr_to_gpa(v.addr.desc_uaddr, desc_area_size(sizes));
  auto drv = mem_->uaddr_to_gpa(v.addr.avail_uaddr, driver_area_size(sizes));
  auto devc = mem_->uaddr_to_gpa(v.addr.used_uaddr, device_area_size(sizes));
  if (!desc || !drv || !devc) {
    log::error("vring {}: ring addresses are not inside guest memory ({}); the ring stays stopped", i,
               !desc ? desc.error().message : !drv ? drv.error().message : devc.error().message);
    return;
  }
  s.desc = *desc;
  s.driver = *drv;
  s.device = *devc;
  InflightRegion inf;
  if (inflight_ && i < inflight_->num_queues() && v.num <= inflight_->queue_size())
    inf = inflight_->queue(i);
  auto ring = make_ring(s, v.base, view(), inf);
  if (!ring) {
    log::error("vring {}: {}; the ring stays stopped", i, ring.error().message);
    return;
  }
  v.ring = std::move(*ring);
  v.setup = s;
  v.reported_broken = false;
  if (!protocol_negotiated()) v.enabled = true;
  auto st = loop_.add(v.kick.get(), EPOLLIN, [this, i](std::uint32_t) {
    // One read per wake-up: it empties a (non-semaphore, checked at SET_VRING_KICK) eventfd
    // whatever its count, and a loop here is what a frontend could make spin.
    std::uint64_t n;
    if (peer_read(vrings_[i].kick.get(), &n, sizeof n) < 0 && errno == ETIMEDOUT) {
      loop_.remove(vrings_[i].kick.get());  // no second chance before the server drops the frontend
      return fail_(fmt::format("reading the kick eventfd of vring {} blocked for {} ms (the frontend cleared its "
                               "O_NONBLOCK and emptied it under us)",
                               i, kPeerIoLimit.count()));
    }
    ++stats_.kicks;
    process(i);
  });
  if (!st.ok()) {
    log::error("vring {}: cannot watch its kick fd: {}", i, st.error().message);
    v.ring.reset();
    return;
  }
  log::debug("vring {} started: size {} {} base {:#x}{}", i, s.size, s.packed ? "packed" : "split", v.base,
             ring_indices(v));
  if (journal::enabled()) {
    journal::ring_started(i);
    journal::object(journal::Object::vring, i, s.desc, desc_area_size(s), 0);
    journal::object(journal::Object::vring, i, s.driver, driver_area_size(s), 1);
    journal::object(journal::Object::vring, i, s.device, device_area_size(s), 2);
  }
  process(i);  // buffers may already be waiting (reconnect, migration)
}

void BackendSession::stop(std::uint16_t i) {
  Vring& v = vrings_[i];
  if (!v.ring) return;
  if (v.kick) loop_.remove(v.kick.get());
  dev_.queue_stopped(i);
  v.base = v.ring->base();
  journal::ring_stopped(i);
  log::debug("vring {} stopped at base {:#x}{}", i, v.base, ring_indices(v));
  v.ring.reset();
  v.kick.reset();
}

std::string BackendSession::ring_indices(const Vring& v) const {
  if (log::level() > log::Level::debug || v.setup.packed || v.setup.size == 0) return {};
  const GuestView g = view();
  auto avail = g.load_u16_acquire(v.setup.driver + 2);
  auto used = g.load_u16_acquire(v.setup.device + 2);
  if (!avail || !used) return "; its indices are not readable";
  return fmt::format("; in guest memory avail idx {:#x} used idx {:#x}", *avail, *used);
}

void BackendSession::stop_all() {
  for (std::size_t i = 0; i < vrings_.size(); ++i) stop(static_cast<std::uint16_t>(i));
}

void BackendSession::process(std::uint16_t i) {
  Vring& v = vrings_[i];
  if (!v.ring || !v.enabled || v.ring->broken()) return;
  Queue q(i, *v.ring, view());
  dev_.queue_ready(q);
  if (q.pushed() > 0) notify(i);
  if (v.ring->broken() && !v.reported_broken) {
    v.reported_broken = true;
    status_ |= 0x40;  // VIRTIO_CONFIG_S_NEEDS_RESET
    if (v.err) raise_eventfd(v.err, i, true);
  }
}

void BackendSession::run_queue(std::uint16_t index) {
  if (index < vrings_.size()) process(index);
}

bool BackendSession::queue_running(std::uint16_t index) const {
  if (index >= vrings_.size()) return false;
  const Vring& v = vrings_[index];
  return v.ring != nullptr && v.enabled && !v.ring->broken();
}

void BackendSession::set_queue_notification(std::uint16_t index, bool on) {
  if (!queue_running(index) || vrings_[index].ring->notification() == on) return;  // each poll round asks
  if (auto st = vrings_[index].ring->set_notification(view(), on); !st.ok()) {
    log::error("vring {}: cannot {} its kicks: {}", index, on ? "turn on" : "turn off", st.error().message);
    return;
  }
  if (on) process(index);
}

void BackendSession::notify(std::uint16_t i) {
  Vring& v = vrings_[i];
  auto want = v.ring->should_notify(view());
  if (!want) {
    log::error("vring {}: cannot read the driver's notification state: {}", i, want.error().message);
    return;
  }
  if (*want && v.call) raise_eventfd(v.call, i, false);
}

void BackendSession::raise_eventfd(const UniqueFd& fd, std::uint16_t i, bool err) {
  // Non-blocking (check_eventfd): an eventfd refuses a write only when its count would pass its
  // maximum, which takes a frontend that never reads it and wrote it full itself.
  const std::uint64_t one = 1;
  if (peer_write(fd.get(), &one, sizeof one) == static_cast<ssize_t>(sizeof one)) return;
  ++stats_.calls_dropped;
  if (errno == ETIMEDOUT) {
    (err ? vrings_[i].err : vrings_[i].call).reset();  // not again before the server drops the frontend
    return fail_(fmt::format("writing the {} eventfd of vring {} blocked for {} ms (the frontend cleared its "
                             "O_NONBLOCK and filled it)",
                             err ? "error" : "call", i, kPeerIoLimit.count()));
  }
  bool& said = err ? vrings_[i].err_full_said : vrings_[i].call_full_said;
  if (!said) {
    said = true;
    log::warn("vring {}: its {} eventfd refuses a write ({}): the frontend never reads it; the signal is dropped", i,
              err ? "error" : "call", std::strerror(errno));
  }
}

}  // namespace vrdma::vhost
