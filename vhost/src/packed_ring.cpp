// Packed virtqueue, device side (virtio 1.2 §2.8).
#include <fmt/format.h>

#include <atomic>

#include "ring_layout.hpp"

namespace vrdma::vhost {
namespace {

class PackedRing final : public Ring {
 public:
  PackedRing(const RingSetup& s, std::uint16_t avail, bool avail_wrap, std::uint16_t used, bool used_wrap)
      : s_(s), avail_(avail), used_(used), signalled_(used), avail_wrap_(avail_wrap), used_wrap_(used_wrap) {}

  Result<std::optional<DescChain>> pop(const GuestView& g) override {
    if (broken_) return std::optional<DescChain>{};
    auto r = pop_inner(g);
    if (!r) broken_ = true;
    return r;
  }

  Status push(const GuestView& g, const DescChain& c, std::uint32_t written) override {
    if (broken_) return make_error(Errc::bad_state, "virtqueue is broken; not writing to it");
    if (c.slots == 0 || c.slots > s_.size) return make_error(Errc::invalid_argument, "chain occupies no ring slots");
    const std::uint64_t d = s_.desc + std::uint64_t{used_} * sizeof(PackedDesc);
    std::uint16_t flags = used_wrap_ ? static_cast<std::uint16_t>(kPackedAvail | kPackedUsed) : 0;
    if (written > 0) flags |= kDescWrite;
    Status st = g.write_obj(d + 8, written);
    if (st.ok()) st = g.write_obj(d + 12, c.id);
    if (st.ok()) st = g.store_u16_release(d + 14, flags);  // publishes the used descriptor
    if (!st.ok()) {
      broken_ = true;
      return st;
    }
    used_ = static_cast<std::uint16_t>(used_ + c.slots);
    if (used_ >= s_.size) {
      used_ = static_cast<std::uint16_t>(used_ - s_.size);
      used_wrap_ = !used_wrap_;
    }
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

  // QEMU's encoding: avail index and wrap counter in bits 0..15, used ones in bits 16..31.
  [[nodiscard]] std::uint32_t base() const override {
    return (std::uint32_t{avail_} | (avail_wrap_ ? 0x8000u : 0u)) |
           ((std::uint32_t{used_} | (used_wrap_ ? 0x8000u : 0u)) << 16);
  }

 private:
  [[nodiscard]] static bool is_avail(std::uint16_t flags, bool wrap) {
    return ((flags & kPackedAvail) != 0) == wrap && ((flags & kPackedUsed) != 0) != wrap;
  }

  Result<std::optional<DescChain>> pop_inner(const GuestView& g) {
    auto flags = g.load_u16_acquire(s_.desc + std::uint64_t{avail_} * sizeof(PackedDesc) + 14);
    if (!flags) return std::move(flags).error();
    if (!is_avail(*flags, avail_wrap_)) return std::optional<DescChain>{};
    DescChain c;
    std::uint16_t i = avail_;
    std::uint16_t id = 0;
    bool wrap = avail_wrap_;  // flips where the chain crosses the end of the ring (§2.8.1)
    for (std::uint32_t n = 0;; ++n) {
      if (n >= s_.size) return make_error(Errc::protocol_error, "packed descriptor chain is longer than the queue");
      auto d = g.read_obj<PackedDesc>(s_.desc + std::uint64_t{i} * sizeof(PackedDesc));
      if (!d) return std::move(d).error();
      if (n > 0 && !is_avail(d->flags, wrap))
        return make_error(Errc::protocol_error, "packed descriptor chain continues into a descriptor not made available");
      ++c.slots;
      id = d->id;
      if ((d->flags & kDescIndirect) != 0) {
        if (!s_.indirect) return make_error(Errc::protocol_error, "indirect descriptor used but not negotiated");
        if (n > 0 || (d->flags & kDescNext) != 0)
          return make_error(Errc::protocol_error, "indirect descriptor must be the only descriptor of its chain");
        VRDMA_TRY(walk_indirect(g, *d, c));
      } else {
        VRDMA_TRY(append_buf(c, d->addr, d->len, (d->flags & kDescWrite) != 0));
      }
      if (i + 1 == s_.size) {
        i = 0;
        wrap = !wrap;
      } else {
        ++i;
      }
      if ((d->flags & kDescNext) == 0) break;
    }
    if (id >= s_.size)
      return make_error(Errc::protocol_error, fmt::format("packed buffer id {} is outside a queue of {}", id, s_.size));
    for (const auto& b : c.bufs) {
      std::uint64_t off = 0;
      while (off < b.len) {
        auto s = g.memory().at(b.gpa + off);
        if (!s)
          return make_error(Errc::protocol_error,
                            fmt::format("descriptor buffer {:#x}+{:#x} is outside guest memory", b.gpa, b.len));
        off += std::min<std::uint64_t>(s->len, b.len - off);
      }
    }
    c.id = id;
    avail_ = static_cast<std::uint16_t>(avail_ + c.slots);
    if (avail_ >= s_.size) {
      avail_ = static_cast<std::uint16_t>(avail_ - s_.size);
      avail_wrap_ = !avail_wrap_;
    }
    return std::optional<DescChain>(std::move(c));
  }

  static Status walk_indirect(const GuestView& g, const PackedDesc& d, DescChain& c) {
    if (d.len == 0 || d.len % sizeof(PackedDesc) != 0)
      return make_error(Errc::protocol_error, fmt::format("indirect table length {} is not a multiple of 16", d.len));
    const std::uint64_t n = d.len / sizeof(PackedDesc);
    if (n > kMaxChain)
      return make_error(Errc::protocol_error, fmt::format("indirect table holds {} descriptors; at most {}", n, kMaxChain));
    auto t = g.memory().range(d.addr, d.len);
    if (!t) return make_error(Errc::protocol_error, "indirect table: " + t.error().message);
    for (std::uint64_t k = 0; k < n; ++k) {
      PackedDesc e;
      std::memcpy(&e, *t + k * sizeof(PackedDesc), sizeof e);
      if ((e.flags & kDescIndirect) != 0)
        return make_error(Errc::protocol_error, "indirect table holds an indirect descriptor");
      VRDMA_TRY(append_buf(c, e.addr, e.len, (e.flags & kDescWrite) != 0));
    }
    return {};
  }

  RingSetup s_;
  std::uint16_t avail_, used_, signalled_;
  bool avail_wrap_, used_wrap_;
  bool signalled_wrap_ = true;

 public:
  void init_signalled() { signalled_wrap_ = used_wrap_; }
};

}  // namespace

Result<std::unique_ptr<Ring>> make_packed_ring(const RingSetup& s, std::uint32_t base) {
  // Bits 0..15: last avail index | wrap << 15; bits 16..31: used index | wrap << 15, as QEMU
  // sends them. A frontend that sends only the low half means "used == avail".
  const std::uint32_t used_half = (base >> 16) != 0 ? base >> 16 : base & 0xffff;
  const auto avail = static_cast<std::uint16_t>(base & 0x7fff);
  const auto used = static_cast<std::uint16_t>(used_half & 0x7fff);
  if (avail >= s.size || used >= s.size)
    return make_error(Errc::invalid_argument,
                      fmt::format("packed ring base {:#x} is outside a queue of {}", base, s.size));
  auto r = std::make_unique<PackedRing>(s, avail, (base & 0x8000) != 0, used, (used_half & 0x8000) != 0);
  r->init_signalled();
  return std::unique_ptr<Ring>(std::move(r));
}

}  // namespace vrdma::vhost
