// Split virtqueue, device side (virtio 1.2 §2.7).
#include <fmt/format.h>

#include <atomic>
#include <deque>

#include "ring_layout.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/vhost/virtqueue.hpp"

namespace vrdma::vhost {
namespace {

class SplitRing final : public Ring {
 public:
  SplitRing(const RingSetup& s, std::uint16_t base, const InflightRegion& inf)
      : s_(s), last_avail_(base), used_idx_(base), inflight_(inf) {}

  Status recover(const GuestView& g) {
    if (!inflight_.attached()) return {};
    if (!inflight_.holds_state()) {
      inflight_.reset();
      return {};
    }
    auto used = g.load_u16_acquire(s_.device + kUsedIdx);
    if (!used) return std::move(used).error();
    auto heads = inflight_.recover(*used);
    if (heads.size() > s_.size) return make_error(Errc::protocol_error, "inflight area lists more heads than the queue holds");
    resubmit_.assign(heads.begin(), heads.end());
    used_idx_ = *used;
    last_avail_ = static_cast<std::uint16_t>(*used + heads.size());
    signalled_ = used_idx_;
    if (!heads.empty())
      log::info("virtqueue: resuming {} in-flight requests after reconnect (used idx {})", heads.size(), *used);
    return {};
  }

  Status push(const GuestView& g, const DescChain& c, std::uint32_t written) override {
    if (broken_) return make_error(Errc::bad_state, "virtqueue is broken; not writing to it");
    const std::uint64_t elem = s_.device + kUsedRing + (std::uint64_t{used_idx_} % s_.size) * sizeof(UsedElem);
    inflight_.on_push_begin(c.id);
    Status st = g.write_obj(elem, UsedElem{c.id, written});
    if (st.ok()) st = g.store_u16_release(s_.device + kUsedIdx, static_cast<std::uint16_t>(used_idx_ + 1));
    if (!st.ok()) {
      broken_ = true;
      return st;
    }
    ++used_idx_;
    inflight_.on_push_end(c.id, used_idx_);
    return {};
  }

  Result<bool> should_notify(const GuestView& g) override {
    // The used index store must be visible before we read the driver's suppression state.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::uint16_t old = signalled_;
    if (old == used_idx_) return false;
    bool notify;
    if (s_.event_idx) {
      auto ev = g.load_u16_acquire(s_.driver + kAvailRing + std::uint64_t{s_.size} * 2);
      if (!ev) return std::move(ev).error();
      notify = need_event(*ev, used_idx_, old);
    } else {
      auto flags = g.load_u16_acquire(s_.driver);
      if (!flags) return std::move(flags).error();
      notify = (*flags & kAvailNoInterrupt) == 0;
    }
    signalled_ = used_idx_;
    return notify;
  }

  Status store_notification(const GuestView& g, bool on) override {
    // With EVENT_IDX, off: avail_event stays where it is; the driver kicks at most once more
    // when its index passes it, then not again before it wraps (64 Ki entries later).
    if (s_.event_idx) return on ? store_avail_event(g) : Status{};
    return g.store_u16_release(s_.device, on ? 0 : kUsedNoNotify);
  }

  [[nodiscard]] std::uint32_t base() const override { return last_avail_; }

 private:
  Status store_avail_event(const GuestView& g) {
    return g.store_u16_release(s_.device + kUsedRing + std::uint64_t{s_.size} * sizeof(UsedElem), last_avail_);
  }

  Result<std::optional<DescChain>> pop_inner(const GuestView& g) override {
    if (!resubmit_.empty()) {
      const std::uint16_t head = resubmit_.front();
      resubmit_.pop_front();
      auto c = walk_split_chain(g, s_.desc, s_.size, head, s_.indirect);
      if (!c) return std::move(c).error();
      return std::optional<DescChain>(std::move(*c));
    }
    auto avail = g.load_u16_acquire(s_.driver + kAvailIdx);
    if (!avail) return std::move(avail).error();
    const auto pending = static_cast<std::uint16_t>(*avail - last_avail_);
    if (pending > s_.size)
      return make_error(Errc::protocol_error, fmt::format("avail index {} is {} ahead of the device, more than the "
                                                          "queue size {}", *avail, pending, s_.size));
    if (pending == 0) {
      if (s_.event_idx && notify_on_) {
        // Ask for a kick at the next entry, then look again to close the race (§2.7.10).
        VRDMA_TRY(store_avail_event(g));
        std::atomic_thread_fence(std::memory_order_seq_cst);
        auto again = g.load_u16_acquire(s_.driver + kAvailIdx);
        if (!again) return std::move(again).error();
        if (*again == last_avail_) return std::optional<DescChain>{};
        return pop_inner(g);
      }
      return std::optional<DescChain>{};
    }
    auto head = g.read_obj<std::uint16_t>(s_.driver + kAvailRing + (std::uint64_t{last_avail_} % s_.size) * 2);
    if (!head) return std::move(head).error();
    auto c = walk_split_chain(g, s_.desc, s_.size, *head, s_.indirect);
    if (!c) return std::move(c).error();
    ++last_avail_;
    inflight_.on_pop(*head);
    return std::optional<DescChain>(std::move(*c));
  }

  RingSetup s_;
  std::uint16_t last_avail_, used_idx_;
  std::uint16_t signalled_ = 0;
  InflightRegion inflight_;
  std::deque<std::uint16_t> resubmit_;

 public:
  void set_signalled(std::uint16_t v) { signalled_ = v; }
  // A ring starts with kicks on, whatever a polling device before it left in used.flags (with
  // EVENT_IDX the first pop that finds the ring empty moves avail_event).
  Status kicks_wanted(const GuestView& g) {
    if (s_.event_idx) return {};
    auto flags = g.load_u16_acquire(s_.device);
    if (!flags) return std::move(flags).error();
    if ((*flags & kUsedNoNotify) != 0) VRDMA_TRY(g.store_u16_release(s_.device, 0));
    return {};
  }
};

}  // namespace

Result<std::unique_ptr<Ring>> make_split_ring(const RingSetup& s, std::uint32_t base, const GuestView& g,
                                              const InflightRegion& inflight) {
  if (base > 0xffff) return make_error(Errc::invalid_argument, fmt::format("split ring base {} exceeds 16 bits", base));
  auto r = std::make_unique<SplitRing>(s, static_cast<std::uint16_t>(base), inflight);
  r->set_signalled(static_cast<std::uint16_t>(base));
  VRDMA_TRY(r->recover(g));
  VRDMA_TRY(r->kicks_wanted(g));
  return std::unique_ptr<Ring>(std::move(r));
}

}  // namespace vrdma::vhost
