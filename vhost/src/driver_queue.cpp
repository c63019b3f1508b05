// Driver side of split and packed virtqueues (virtio 1.2 §2.7.13, §2.8.21).
#include "vrdma/vhost/driver_queue.hpp"

#include <fmt/format.h>

#include <atomic>

#include "vrdma/common/log.hpp"

#include "ring_layout.hpp"

namespace vrdma::vhost {
namespace {

template <class T>
T* at(DriverMemory* r, std::uint64_t gpa) {
  return reinterpret_cast<T*>(r->host(gpa, sizeof(T)));
}
std::uint16_t load_acq(DriverMemory* r, std::uint64_t gpa) {
  return std::atomic_ref<std::uint16_t>(*at<std::uint16_t>(r, gpa)).load(std::memory_order_acquire);
}
void store_rel(DriverMemory* r, std::uint64_t gpa, std::uint16_t v) {
  std::atomic_ref<std::uint16_t>(*at<std::uint16_t>(r, gpa)).store(v, std::memory_order_release);
}

}  // namespace

Result<DriverQueue> DriverQueue::create(DriverMemory& ram, std::uint16_t size, bool packed, bool event_idx) {
  if (size == 0 || size > kMaxQueueSize || (!packed && (size & (size - 1)) != 0))
    return make_error(Errc::invalid_argument, fmt::format("queue size {} is invalid", size));
  DriverQueue q;
  q.ram_ = &ram;
  q.size_ = size;
  q.packed_ = packed;
  q.event_idx_ = event_idx;
  RingSetup s;
  s.size = size;
  s.packed = packed;
  auto d = ram.alloc(desc_area_size(s), 4096);
  auto a = ram.alloc(driver_area_size(s), 64);
  auto u = ram.alloc(device_area_size(s), 4096);
  auto ind = ram.alloc(std::uint64_t{size} * kMaxIndirect * 16, 4096);
  if (!d || !a || !u || !ind) return make_error(Errc::no_memory, "guest RAM has no room for the rings");
  q.desc_ = *d;
  q.driver_ = *a;
  q.device_ = *u;
  q.indirect_ = *ind;
  std::memset(ram.host(q.desc_, desc_area_size(s)), 0, desc_area_size(s));
  std::memset(ram.host(q.driver_, driver_area_size(s)), 0, driver_area_size(s));
  std::memset(ram.host(q.device_, device_area_size(s)), 0, device_area_size(s));
  q.free_ = size;
  q.chain_len_.assign(size, 0);
  if (packed) {
    for (std::uint16_t i = size; i > 0; --i) q.free_ids_.push_back(static_cast<std::uint16_t>(i - 1));
  } else {
    for (std::uint16_t i = 0; i < size; ++i)
      at<SplitDesc>(&ram, q.desc_ + std::uint64_t{i} * 16)->next = static_cast<std::uint16_t>(i + 1);
  }
  return q;
}

std::uint64_t DriverQueue::uaddr(std::uint64_t gpa) const { return reinterpret_cast<std::uint64_t>(ram_->host(gpa, 1)); }

Result<std::uint16_t> DriverQueue::add(std::span<const DriverBuf> bufs, bool indirect) {
  if (bufs.empty()) return make_error(Errc::invalid_argument, "a chain needs at least one buffer");
  if (indirect && bufs.size() > kMaxIndirect)
    return make_error(Errc::invalid_argument, fmt::format("indirect chains hold at most {} buffers", kMaxIndirect));
  return packed_ ? add_packed(bufs, indirect) : add_split(bufs, indirect);
}

void DriverQueue::write_indirect(std::uint16_t id, std::span<const DriverBuf> bufs, bool packed_layout) {
  const std::uint64_t t = indirect_ + std::uint64_t{id} * kMaxIndirect * 16;
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    const std::uint16_t w = bufs[k].writable ? kDescWrite : 0;
    if (packed_layout) {
      *at<PackedDesc>(ram_, t + k * 16) = PackedDesc{bufs[k].gpa, bufs[k].len, 0, w};
    } else {
      const bool more = k + 1 < bufs.size();
      *at<SplitDesc>(ram_, t + k * 16) =
          SplitDesc{bufs[k].gpa, bufs[k].len, static_cast<std::uint16_t>(w | (more ? kDescNext : 0)),
                    static_cast<std::uint16_t>(more ? k + 1 : 0)};
    }
  }
}

Result<std::uint16_t> DriverQueue::add_split(std::span<const DriverBuf> bufs, bool indirect) {
  const std::size_t need = indirect ? 1 : bufs.size();
  if (need > free_) return make_error(Errc::would_block, "virtqueue is full");
  const std::uint16_t head = free_head_;
  std::uint16_t i = head, last = head;
  if (indirect) {
    write_indirect(head, bufs, false);
    auto* d = at<SplitDesc>(ram_, desc_ + std::uint64_t{i} * 16);
    free_head_ = d->next;
    *d = SplitDesc{indirect_ + std::uint64_t{head} * kMaxIndirect * 16, static_cast<std::uint32_t>(bufs.size() * 16),
                   kDescIndirect, d->next};
  } else {
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      auto* d = at<SplitDesc>(ram_, desc_ + std::uint64_t{i} * 16);
      const bool more = k + 1 < bufs.size();
      d->addr = bufs[k].gpa;
      d->len = bufs[k].len;
      d->flags = static_cast<std::uint16_t>((bufs[k].writable ? kDescWrite : 0) | (more ? kDescNext : 0));
      last = i;
      i = d->next;
    }
    free_head_ = i;
    (void)last;
  }
  free_ = static_cast<std::uint16_t>(free_ - need);
  chain_len_[head] = static_cast<std::uint16_t>(need);
  *at<std::uint16_t>(ram_, driver_ + kAvailRing + (std::uint64_t{avail_idx_} % size_) * 2) = head;
  ++avail_idx_;
  return head;
}

Result<std::uint16_t> DriverQueue::add_packed(std::span<const DriverBuf> bufs, bool indirect) {
  const std::size_t need = indirect ? 1 : bufs.size();
  if (need > free_ || free_ids_.empty()) return make_error(Errc::would_block, "virtqueue is full");
  const std::uint16_t id = free_ids_.back();
  free_ids_.pop_back();
  const std::uint16_t first = next_avail_;
  std::uint16_t first_flags = 0;
  auto place = [&](std::uint64_t addr, std::uint32_t len, std::uint16_t flags, bool is_first) {
    flags = static_cast<std::uint16_t>(flags | (avail_wrap_ ? kPackedAvail : kPackedUsed));
    auto* d = at<PackedDesc>(ram_, desc_ + std::uint64_t{next_avail_} * 16);
    d->addr = addr;
    d->len = len;
    d->id = id;
    if (is_first) first_flags = flags;
    else d->flags = flags;
    if (++next_avail_ == size_) {
      next_avail_ = 0;
      avail_wrap_ = !avail_wrap_;
    }
  };
  if (indirect) {
    write_indirect(id, bufs, true);
    place(indirect_ + std::uint64_t{id} * kMaxIndirect * 16, static_cast<std::uint32_t>(bufs.size() * 16),
          kDescIndirect, true);
  } else {
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      const bool more = k + 1 < bufs.size();
      place(bufs[k].gpa, bufs[k].len,
            static_cast<std::uint16_t>((bufs[k].writable ? kDescWrite : 0) | (more ? kDescNext : 0)), k == 0);
    }
  }
  // The first descriptor's flags publish the whole chain.
  store_rel(ram_, desc_ + std::uint64_t{first} * 16 + 14, first_flags);
  free_ = static_cast<std::uint16_t>(free_ - need);
  chain_len_[id] = static_cast<std::uint16_t>(need);
  ++avail_idx_;
  return id;
}

void DriverQueue::publish() {
  if (!packed_) store_rel(ram_, driver_ + kAvailIdx, avail_idx_);
  published_ = avail_idx_;
}

bool DriverQueue::needs_kick() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const std::uint16_t old = kicked_;
  kicked_ = published_;
  if (old == published_) return false;
  if (packed_) {
    const auto* ev = at<PackedEvent>(ram_, device_);
    return std::atomic_ref<const std::uint16_t>(ev->flags).load(std::memory_order_acquire) != kEventDisable;
  }
  if (event_idx_) {
    const std::uint16_t ev = load_acq(ram_, device_ + kUsedRing + std::uint64_t{size_} * 8);
    return need_event(ev, published_, old);
  }
  return (load_acq(ram_, device_) & kUsedNoNotify) == 0;
}

void DriverQueue::set_interrupts(bool on) {
  interrupts_ = on;
  if (packed_) {
    if (on && event_idx_) {
      auto* ev = at<PackedEvent>(ram_, driver_);
      ev->off_wrap = static_cast<std::uint16_t>(next_used_ | (used_wrap_ ? 0x8000 : 0));
    }
    store_rel(ram_, driver_ + 2, !on ? kEventDisable : event_idx_ ? kEventDesc : kEventEnable);
  } else if (event_idx_) {
    // used_event one behind what we have taken, kept there as we take more (used_split): the
    // device's index never passes it (the driver's flags must stay 0 with EVENT_IDX).
    store_rel(ram_, driver_ + kAvailRing + std::uint64_t{size_} * 2,
              on ? last_used_ : static_cast<std::uint16_t>(last_used_ - 1));
  } else {
    store_rel(ram_, driver_, on ? 0 : kAvailNoInterrupt);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);  // before the caller looks at the used ring again
}

std::optional<UsedBuf> DriverQueue::get_used() {
  if (broken_) return std::nullopt;
  return packed_ ? used_packed() : used_split();
}

std::optional<UsedBuf> DriverQueue::used_split() {
  const std::uint16_t used = load_acq(ram_, device_ + kUsedIdx);
  if (used == last_used_) return std::nullopt;
  const UsedElem e = *at<UsedElem>(ram_, device_ + kUsedRing + (std::uint64_t{last_used_} % size_) * 8);
  if (e.id >= size_ || chain_len_[e.id] == 0) {
    log::error("virtqueue: the device returned buffer id {} which it does not own; the queue stops", e.id);
    broken_ = true;
    return std::nullopt;
  }
  ++last_used_;
  // used_event: the next entry interrupts; or (off) one behind, so that no entry ever passes it.
  if (event_idx_)
    store_rel(ram_, driver_ + kAvailRing + std::uint64_t{size_} * 2,
              interrupts_ ? last_used_ : static_cast<std::uint16_t>(last_used_ - 1));
  const auto id = static_cast<std::uint16_t>(e.id);
  // Return the chain's descriptors to the free list.
  std::uint16_t tail = id;
  for (std::uint16_t k = 1; k < chain_len_[id]; ++k) tail = at<SplitDesc>(ram_, desc_ + std::uint64_t{tail} * 16)->next;
  at<SplitDesc>(ram_, desc_ + std::uint64_t{tail} * 16)->next = free_head_;
  free_head_ = id;
  free_ = static_cast<std::uint16_t>(free_ + chain_len_[id]);
  chain_len_[id] = 0;
  return UsedBuf{id, e.len};
}

std::optional<UsedBuf> DriverQueue::used_packed() {
  const std::uint64_t d = desc_ + std::uint64_t{next_used_} * 16;
  const std::uint16_t flags = load_acq(ram_, d + 14);
  const bool avail = (flags & kPackedAvail) != 0, used = (flags & kPackedUsed) != 0;
  if (avail != used_wrap_ || used != used_wrap_) return std::nullopt;
  const auto* pd = at<PackedDesc>(ram_, d);
  const std::uint16_t id = pd->id;
  const std::uint32_t len = pd->len;
  if (id >= size_ || chain_len_[id] == 0) {
    log::error("virtqueue: the device returned buffer id {} which it does not own; the queue stops", id);
    broken_ = true;
    return std::nullopt;
  }
  next_used_ = static_cast<std::uint16_t>(next_used_ + chain_len_[id]);
  if (next_used_ >= size_) {
    next_used_ = static_cast<std::uint16_t>(next_used_ - size_);
    used_wrap_ = !used_wrap_;
  }
  free_ = static_cast<std::uint16_t>(free_ + chain_len_[id]);
  chain_len_[id] = 0;
  free_ids_.push_back(id);
  if (event_idx_ && interrupts_) {
    auto* ev = at<PackedEvent>(ram_, driver_);
    ev->off_wrap = static_cast<std::uint16_t>(next_used_ | (used_wrap_ ? 0x8000 : 0));
    store_rel(ram_, driver_ + 2, kEventDesc);
  }
  return UsedBuf{id, len};
}

}  // namespace vrdma::vhost
