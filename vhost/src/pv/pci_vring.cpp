#include "pci_vring.hpp"

#include <atomic>
#include <cstring>

#include "ring_layout.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::pv {
namespace {

using vhost::SplitDesc;
using vhost::UsedElem;

template <class T>
T* at(const DmaArea& m, std::size_t off) {
  return reinterpret_cast<T*>(m.host + off);
}
std::uint16_t load_acquire(const std::uint16_t* p) {
  return std::atomic_ref<const std::uint16_t>(*p).load(std::memory_order_acquire);
}
void store_release(std::uint16_t* p, std::uint16_t v) { std::atomic_ref<std::uint16_t>(*p).store(v, std::memory_order_release); }

}  // namespace

std::size_t PciVring::bytes(std::uint16_t size) {
  // §2.7: descriptors (16-byte aligned), avail ring (flags, idx, ring[size], used_event),
  // used ring on the next 4 KiB (flags, idx, ring[size], avail_event).
  const std::size_t desc = std::size_t{16} * size;
  const std::size_t avail = 6 + std::size_t{2} * size;
  const std::size_t used_off = (desc + avail + 4095) / 4096 * 4096;
  return (used_off + 6 + std::size_t{8} * size + 4095) / 4096 * 4096;
}

PciVring::PciVring(DmaArea mem, std::uint16_t size)
    : mem_(mem), size_(size), avail_off_(std::size_t{16} * size), free_(size), chain_len_(size, 0) {
  used_off_ = (avail_off_ + 6 + std::size_t{2} * size + 4095) / 4096 * 4096;
  auto* d = at<SplitDesc>(mem_, 0);
  for (std::uint16_t i = 0; i < size; ++i) d[i].next = static_cast<std::uint16_t>((i + 1) % size);
}

Result<std::uint16_t> PciVring::add(std::span<const ChainBuf> bufs) {
  if (bufs.empty() || bufs.size() > size_) return make_error(Errc::invalid_argument, "a chain of 1..queue size buffers");
  if (broken_) return make_error(Errc::bad_state, "the virtqueue is broken (the device returned a buffer it did not own)");
  if (bufs.size() > free_) return make_error(Errc::would_block, "the virtqueue is full");
  auto* d = at<SplitDesc>(mem_, 0);
  const std::uint16_t head = free_head_;
  std::uint16_t i = head;
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    d[i].addr = bufs[k].gpa;
    d[i].len = bufs[k].len;
    d[i].flags = static_cast<std::uint16_t>((bufs[k].writable ? vhost::kDescWrite : 0) |
                                            (k + 1 < bufs.size() ? vhost::kDescNext : 0));
    if (k + 1 < bufs.size()) i = d[i].next;
  }
  free_head_ = d[i].next;
  free_ = static_cast<std::uint16_t>(free_ - bufs.size());
  chain_len_[head] = static_cast<std::uint16_t>(bufs.size());
  auto* ring = at<std::uint16_t>(mem_, avail_off_ + 4);
  ring[avail_idx_ % size_] = head;
  ++avail_idx_;
  return head;
}

bool PciVring::publish() {
  store_release(at<std::uint16_t>(mem_, avail_off_ + 2), avail_idx_);
  // The device reads avail.idx before or after we read used.flags: a full fence keeps the
  // "no notify" hint from being read before our index is visible (§2.7.10).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return (load_acquire(at<std::uint16_t>(mem_, used_off_)) & vhost::kUsedNoNotify) == 0;
}

std::optional<std::pair<std::uint16_t, std::uint32_t>> PciVring::get_used() {
  if (broken_) return std::nullopt;
  const std::uint16_t idx = load_acquire(at<std::uint16_t>(mem_, used_off_ + 2));
  if (idx == last_used_) return std::nullopt;
  const auto* u = at<UsedElem>(mem_, used_off_ + 4);
  const UsedElem e = u[last_used_ % size_];
  if (e.id >= size_ || chain_len_[e.id] == 0) {
    log::error("pv: the device returned buffer id {} which it does not own; the queue stops", e.id);
    broken_ = true;
    return std::nullopt;
  }
  ++last_used_;
  const auto id = static_cast<std::uint16_t>(e.id);
  // Return the chain to the free list (its descriptors are linked through `next` already).
  auto* d = at<SplitDesc>(mem_, 0);
  std::uint16_t tail = id;
  for (std::uint16_t k = 1; k < chain_len_[id]; ++k) tail = d[tail].next;
  d[tail].next = free_head_;
  free_head_ = id;
  free_ = static_cast<std::uint16_t>(free_ + chain_len_[id]);
  chain_len_[id] = 0;
  return std::pair{id, e.len};
}

}  // namespace vrdma::pv
