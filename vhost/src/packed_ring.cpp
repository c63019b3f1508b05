// Packed virtqueue, device side (virtio 1.2 §2.8).
#include <fmt/format.h>

#include <atomic>
#include <deque>

#include "ring_layout.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::vhost {
namespace {

class PackedRing final : public Ring {
 public:
  PackedRing(const RingSetup& s, std::uint16_t avail, bool avail_wrap, std::uint16_t used, bool used_wrap,
             PackedInflightRegion inflight)
      : s_(s), avail_(avail), used_(used), signalled_(used), avail_wrap_(avail_wrap), used_wrap_(used_wrap),
        inflight_(inflight), entry_of_(s.size, kNoEntry) {}

  Status push(const GuestView& g, const DescChain& c, std::uint32_t written) override {
    if (broken_) return make_error(Errc::bad_state, "virtqueue is broken; not writing to it");
    if (c.slots == 0 || c.slots > s_.size) return make_error(Errc::invalid_argument, "chain occupies no ring slots");
    const std::uint64_t d = s_.desc + std::uint64_t{used_} * sizeof(PackedDesc);
    std::uint16_t flags = used_wrap_ ? static_cast<std::uint16_t>(kPackedAvail | kPackedUsed) : 0;
    if (written > 0) flags |= kDescWrite;
    std::uint16_t next_used = static_cast<std::uint16_t>(used_ + c.slots);
    bool next_wrap = used_wrap_;
    if (next_used >= s_.size) {
      next_used = static_cast<std::uint16_t>(next_used - s_.size);
      next_wrap = !next_wrap;
    }
    const std::uint16_t entry = c.id < s_.size ? entry_of_[c.id] : kNoEntry;
    if (entry != kNoEntry) inflight_.on_push_begin(entry, next_used, next_wrap);
    Status st = g.write_obj(d + 8, written);
    if (st.ok()) st = g.write_obj(d + 12, c.id);
    if (st.ok()) st = g.store_u16_release(d + 14, flags);  // publishes the used descriptor
    if (!st.ok()) {
      broken_ = true;
      return st;
    }
    if (entry != kNoEntry) {
      inflight_.on_push_end(entry);
      entry_of_[c.id] = kNoEntry;
    }
    used_ = next_used;
    used_wrap_ = next_wrap;
    return {};
  }

  Result<bool> should_notify(const GuestView& g) override {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    auto flags = g.load_u16_acquire(s_.driver + 2);
    if (!flags) return std::move(flags).error();
    std::uint16_t old = signalled_;
    const std::uint16_t now = used_;
    if (old == now && signalled_wrap_ == used_wrap_) return false;
    const bool old_wrap = signalled_wrap_;
    signalled_ = now;
    signalled_wrap_ = used_wrap_;
    if (*flags != kEventDesc || !s_.event_idx) return *flags != kEventDisable;
    auto off_wrap = g.load_u16_acquire(s_.driver);
    if (!off_wrap) return std::move(off_wrap).error();
    // Compare in one window of 2*size: bring the old index and the event below `now`.
    auto off = static_cast<std::uint16_t>(*off_wrap & 0x7fff);
    if (old_wrap != used_wrap_) old = static_cast<std::uint16_t>(old - s_.size);
    if (((*off_wrap >> 15) != 0) != used_wrap_) off = static_cast<std::uint16_t>(off - s_.size);
    return need_event(off, now, old);
  }

  Status store_notification(const GuestView& g, bool on) override {
    return g.store_u16_release(s_.device + 2, on ? kEventEnable : kEventDisable);
  }

  // QEMU's encoding: avail index and wrap counter in bits 0..15, used ones in bits 16..31.
  [[nodiscard]] std::uint32_t base() const override {
    return (std::uint32_t{avail_} | (avail_wrap_ ? 0x8000u : 0u)) |
           ((std::uint32_t{used_} | (used_wrap_ ? 0x8000u : 0u)) << 16);
  }

 private:
  [[nodiscard]] static bool is_avail(std::uint16_t flags, bool wrap) {
    return ((flags & kPackedAvail) != 0) == wrap && ((flags & kPackedUsed) != 0) != wrap;
  }

  Result<std::optional<DescChain>> pop_inner(const GuestView& g) override {
    if (!resubmit_.empty()) {
      PackedInflightRegion::Chain r = std::move(resubmit_.front());
      resubmit_.pop_front();
      auto c = build_chain(g, r.descs);
      if (!c) return prefixed("resubmitting an in-flight request after reconnect: ", c.error());
      entry_of_[c->id] = r.entry;
      return std::optional<DescChain>(std::move(*c));
    }
    auto flags = g.load_u16_acquire(s_.desc + std::uint64_t{avail_} * sizeof(PackedDesc) + 14);
    if (!flags) return std::move(flags).error();
    if (!is_avail(*flags, avail_wrap_)) return std::optional<DescChain>{};
    // The chain's ring descriptors, as the driver wrote them.
    std::vector<PackedDescCopy> descs;
    std::uint16_t i = avail_;
    bool wrap = avail_wrap_;  // flips where the chain crosses the end of the ring (§2.8.1)
    for (std::uint32_t n = 0;; ++n) {
      if (n >= s_.size) return make_error(Errc::protocol_error, "packed descriptor chain is longer than the queue");
      auto d = g.read_obj<PackedDesc>(s_.desc + std::uint64_t{i} * sizeof(PackedDesc));
      if (!d) return std::move(d).error();
      if (n > 0 && !is_avail(d->flags, wrap))
        return make_error(Errc::protocol_error, "packed descriptor chain continues into a descriptor not made available");
      descs.push_back({d->addr, d->len, d->id, d->flags});
      if (i + 1 == s_.size) {
        i = 0;
        wrap = !wrap;
      } else {
        ++i;
      }
      if ((d->flags & kDescNext) == 0) break;
    }
    auto c = build_chain(g, descs);
    if (!c) return std::move(c).error();
    if (auto entry = inflight_.on_pop(descs)) entry_of_[c->id] = *entry;
    avail_ = static_cast<std::uint16_t>(avail_ + c->slots);
    if (avail_ >= s_.size) {
      avail_ = static_cast<std::uint16_t>(avail_ - s_.size);
      avail_wrap_ = !avail_wrap_;
    }
    return std::optional<DescChain>(std::move(*c));
  }

  // A chain from its ring descriptors (read from the ring, or from the inflight area after a
  // reconnect: untrusted either way).
  Result<DescChain> build_chain(const GuestView& g, const std::vector<PackedDescCopy>& descs) const {
    if (descs.empty() || descs.size() > s_.size)
      return make_error(Errc::protocol_error, fmt::format("packed chain of {} descriptors in a queue of {}",
                                                          descs.size(), s_.size));
    DescChain c;
    for (std::size_t n = 0; n < descs.size(); ++n) {
      const PackedDescCopy& d = descs[n];
      if ((d.flags & kDescIndirect) != 0) {
        if (!s_.indirect) return make_error(Errc::protocol_error, "indirect descriptor used but not negotiated");
        if (n > 0 || descs.size() > 1 || (d.flags & kDescNext) != 0)
          return make_error(Errc::protocol_error, "indirect descriptor must be the only descriptor of its chain");
        VRDMA_TRY(walk_indirect(g, d, c));
      } else {
        VRDMA_TRY(append_buf(c, d.addr, d.len, (d.flags & kDescWrite) != 0));
      }
    }
    const std::uint16_t id = descs.back().id;  // the buffer id is in the chain's last descriptor
    if (id >= s_.size)
      return make_error(Errc::protocol_error, fmt::format("packed buffer id {} is outside a queue of {}", id, s_.size));
    VRDMA_TRY(check_buffers_in_memory(g, c));
    c.id = id;
    c.slots = static_cast<std::uint16_t>(descs.size());
    return c;
  }

  static Status walk_indirect(const GuestView& g, const PackedDescCopy& d, DescChain& c) {
    auto t = indirect_table(g, d.addr, d.len);
    if (!t) return std::move(t).error();
    for (std::uint64_t k = 0; k < t->count; ++k) {
      PackedDesc e;
      std::memcpy(&e, t->bytes + k * sizeof(PackedDesc), sizeof e);
      if ((e.flags & kDescIndirect) != 0)
        return make_error(Errc::protocol_error, "indirect table holds an indirect descriptor");
      VRDMA_TRY(append_buf(c, e.addr, e.len, (e.flags & kDescWrite) != 0));
    }
    return {};
  }

  static constexpr std::uint16_t kNoEntry = 0xffff;

  RingSetup s_;
  std::uint16_t avail_, used_, signalled_;
  bool avail_wrap_, used_wrap_;
  bool signalled_wrap_ = true;
  PackedInflightRegion inflight_;
  std::vector<std::uint16_t> entry_of_;  // buffer id -> its head entry in the inflight area
  std::deque<PackedInflightRegion::Chain> resubmit_;

 public:
  void init_signalled() { signalled_wrap_ = used_wrap_; }
  // A ring starts with kicks on, whatever a polling device before it left in its event flags.
  Status kicks_wanted(const GuestView& g) {
    auto flags = g.load_u16_acquire(s_.device + 2);
    if (!flags) return std::move(flags).error();
    if (*flags == kEventDisable) VRDMA_TRY(g.store_u16_release(s_.device + 2, kEventEnable));
    return {};
  }
  void resubmit(std::vector<PackedInflightRegion::Chain> chains) {
    for (auto& c : chains) resubmit_.push_back(std::move(c));
  }
};

}  // namespace

Result<std::unique_ptr<Ring>> make_packed_ring(const RingSetup& s, std::uint32_t base, const GuestView& g,
                                               PackedInflightRegion inflight) {
  if (inflight.attached() && inflight.holds_state()) {
    // A reconnect: the area, not the frontend's base, says where the device was (QEMU has no
    // packed equivalent of the split ring's used index to resume from).
    auto published = [&](std::uint16_t index, bool wrap) {
      auto f = g.load_u16_acquire(s.desc + std::uint64_t{index} * sizeof(PackedDesc) + 14);
      return f && ((*f & kPackedAvail) != 0) == wrap && ((*f & kPackedUsed) != 0) == wrap;
    };
    auto rec = inflight.recover(published);
    if (!rec) return std::move(rec).error();
    auto r = std::make_unique<PackedRing>(s, rec->avail_idx, rec->avail_wrap, rec->used_idx, rec->used_wrap, inflight);
    r->init_signalled();
    if (!rec->chains.empty())
      log::info("virtqueue: resuming {} in-flight requests after reconnect (packed, used idx {})", rec->chains.size(),
                rec->used_idx);
    r->resubmit(std::move(rec->chains));
    VRDMA_TRY(r->kicks_wanted(g));
    return std::unique_ptr<Ring>(std::move(r));
  }
  // Bits 0..15: last avail index | wrap << 15; bits 16..31: used index | wrap << 15, as QEMU
  // sends them. A frontend that sends only the low half means "used == avail".
  const std::uint32_t used_half = (base >> 16) != 0 ? base >> 16 : base & 0xffff;
  const auto avail = static_cast<std::uint16_t>(base & 0x7fff);
  const auto used = static_cast<std::uint16_t>(used_half & 0x7fff);
  if (avail >= s.size || used >= s.size)
    return make_error(Errc::invalid_argument,
                      fmt::format("packed ring base {:#x} is outside a queue of {}", base, s.size));
  inflight.reset(used, (used_half & 0x8000) != 0);
  auto r = std::make_unique<PackedRing>(s, avail, (base & 0x8000) != 0, used, (used_half & 0x8000) != 0, inflight);
  r->init_signalled();
  VRDMA_TRY(r->kicks_wanted(g));
  return std::unique_ptr<Ring>(std::move(r));
}

}  // namespace vrdma::vhost
