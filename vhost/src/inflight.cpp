#include "vrdma/vhost/inflight.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "vrdma/common/log.hpp"

namespace vrdma::vhost {
namespace {

struct QueueHeader {
  std::uint64_t features;
  std::uint16_t version;
  std::uint16_t desc_num;
  std::uint16_t last_batch_head;
  std::uint16_t used_idx;
};
struct DescState {
  std::uint8_t inflight;
  std::uint8_t padding[5];
  std::uint16_t next;
  std::uint64_t counter;
};
static_assert(sizeof(QueueHeader) == 16 && sizeof(DescState) == 16);
constexpr std::uint16_t kVersion1 = 1;

QueueHeader* hdr(std::uint8_t* b) { return reinterpret_cast<QueueHeader*>(b); }
DescState* desc(std::uint8_t* b, std::uint16_t i) {
  return reinterpret_cast<DescState*>(b + sizeof(QueueHeader)) + i;
}

// The packed layout (vhost-user.rst QueueRegionPacked / DescStatePacked).
struct PackedHeader {
  std::uint64_t features;
  std::uint16_t version;
  std::uint16_t desc_num;
  std::uint16_t free_head;
  std::uint16_t old_free_head;
  std::uint16_t used_idx;
  std::uint16_t old_used_idx;
  std::uint8_t used_wrap_counter;
  std::uint8_t old_used_wrap_counter;
  std::uint8_t padding[10];  // the spec's 7, plus the alignment of desc[]
};
struct PackedState {
  std::uint8_t inflight;
  std::uint8_t padding;
  std::uint16_t next;
  std::uint16_t last;
  std::uint16_t num;
  std::uint64_t counter;
  std::uint16_t id;
  std::uint16_t flags;
  std::uint32_t len;
  std::uint64_t addr;
};
static_assert(sizeof(PackedHeader) == 32 && sizeof(PackedState) == 32);

PackedHeader* phdr(std::uint8_t* b) { return reinterpret_cast<PackedHeader*>(b); }
PackedState* pdesc(std::uint8_t* b, std::uint16_t i) {
  return reinterpret_cast<PackedState*>(b + sizeof(PackedHeader)) + i;
}

}  // namespace

std::uint64_t InflightRegion::queue_bytes(std::uint16_t queue_size) {
  const std::uint64_t split = sizeof(QueueHeader) + std::uint64_t{sizeof(DescState)} * queue_size;
  const std::uint64_t packed = sizeof(PackedHeader) + std::uint64_t{sizeof(PackedState)} * queue_size;
  return (std::max(split, packed) + 63) & ~std::uint64_t{63};
}

bool InflightRegion::holds_state() const {
  return base_ != nullptr && hdr(base_)->version == kVersion1 && hdr(base_)->desc_num == size_;
}

void InflightRegion::reset() {
  if (base_ == nullptr) return;
  std::memset(base_, 0, queue_bytes(size_));
  hdr(base_)->version = kVersion1;
  hdr(base_)->desc_num = size_;
  counter_ = 0;
}

void InflightRegion::on_pop(std::uint16_t head) {
  if (base_ == nullptr || head >= size_) return;
  desc(base_, head)->counter = ++counter_;
  std::atomic_thread_fence(std::memory_order_release);
  desc(base_, head)->inflight = 1;
}

void InflightRegion::on_push_begin(std::uint16_t head) {
  if (base_ == nullptr) return;
  hdr(base_)->last_batch_head = head;
}

void InflightRegion::on_push_end(std::uint16_t head, std::uint16_t new_used_idx) {
  if (base_ == nullptr || head >= size_) return;
  hdr(base_)->used_idx = new_used_idx;
  std::atomic_thread_fence(std::memory_order_release);
  desc(base_, head)->inflight = 0;
}

std::vector<std::uint16_t> InflightRegion::recover(std::uint16_t ring_used_idx) {
  std::vector<std::uint16_t> heads;
  if (!holds_state()) return heads;
  QueueHeader* h = hdr(base_);
  // A crash between publishing used->idx and clearing the flag: that head is already done.
  if (h->used_idx != ring_used_idx) {
    if (h->last_batch_head < size_) desc(base_, h->last_batch_head)->inflight = 0;
    h->used_idx = ring_used_idx;
  }
  for (std::uint16_t i = 0; i < size_; ++i) {
    DescState* d = desc(base_, i);
    if (d->inflight == 1) heads.push_back(i);
    else if (d->inflight != 0) d->inflight = 0;  // garbage from the frontend: not in flight
    counter_ = std::max(counter_, d->counter);
  }
  std::sort(heads.begin(), heads.end(),
            [&](std::uint16_t a, std::uint16_t b) { return desc(base_, a)->counter < desc(base_, b)->counter; });
  return heads;
}

bool PackedInflightRegion::holds_state() const {
  return base_ != nullptr && phdr(base_)->version == kVersion1 && phdr(base_)->desc_num == size_;
}

void PackedInflightRegion::reset(std::uint16_t used_idx, bool used_wrap) {
  if (base_ == nullptr) return;
  std::memset(base_, 0, InflightRegion::queue_bytes(size_));
  PackedHeader* h = phdr(base_);
  h->version = kVersion1;
  h->desc_num = size_;
  for (std::uint16_t i = 0; i < size_; ++i) pdesc(base_, i)->next = static_cast<std::uint16_t>(i + 1);  // size_ ends it
  h->free_head = h->old_free_head = 0;
  h->used_idx = h->old_used_idx = used_idx;
  h->used_wrap_counter = h->old_used_wrap_counter = used_wrap ? 1 : 0;
  counter_ = 0;
}

void PackedInflightRegion::stop_tracking(const char* why) {
  log::error("inflight area: {}; in-flight requests of this queue are no longer tracked for reconnect", why);
  base_ = nullptr;
}

std::optional<std::uint16_t> PackedInflightRegion::on_pop(std::span<const PackedDescCopy> descs) {
  if (base_ == nullptr || descs.empty()) return std::nullopt;
  PackedHeader* h = phdr(base_);
  const std::uint16_t head = h->old_free_head;  // read once: the frontend shares this memory
  if (head >= size_ || descs.size() > size_) {
    stop_tracking("the free list is empty or its head is out of range");
    return std::nullopt;
  }
  PackedState* hd = pdesc(base_, head);
  hd->num = 0;
  hd->counter = ++counter_;
  std::atomic_thread_fence(std::memory_order_release);
  hd->inflight = 1;
  std::uint16_t cur = head;
  for (std::size_t k = 0; k < descs.size(); ++k) {
    if (cur >= size_) {
      stop_tracking("the free list ends before a popped chain fits");
      return std::nullopt;
    }
    PackedState* e = pdesc(base_, cur);
    if (k > 0) e->inflight = 0;
    e->addr = descs[k].addr;
    e->len = descs[k].len;
    e->id = descs[k].id;
    e->flags = descs[k].flags;
    if (k + 1 == descs.size()) hd->last = cur;
    cur = e->next;
    h->free_head = cur;
  }
  hd->num = static_cast<std::uint16_t>(descs.size());
  std::atomic_thread_fence(std::memory_order_release);
  h->old_free_head = cur;  // commits the pop
  return head;
}

void PackedInflightRegion::on_push_begin(std::uint16_t entry, std::uint16_t new_used_idx, bool new_used_wrap) {
  if (base_ == nullptr || entry >= size_) return;
  PackedHeader* h = phdr(base_);
  const std::uint16_t last = pdesc(base_, entry)->last;
  if (last >= size_) {
    stop_tracking("a chain's last entry is out of range");
    return;
  }
  pdesc(base_, last)->next = h->free_head;
  h->free_head = entry;
  h->used_idx = new_used_idx;
  h->used_wrap_counter = new_used_wrap ? 1 : 0;
  std::atomic_thread_fence(std::memory_order_release);
}

void PackedInflightRegion::on_push_end(std::uint16_t entry) {
  if (base_ == nullptr || entry >= size_) return;
  PackedHeader* h = phdr(base_);
  pdesc(base_, entry)->inflight = 0;
  std::atomic_thread_fence(std::memory_order_release);
  h->old_free_head = h->free_head;
  h->old_used_idx = h->used_idx;
  h->old_used_wrap_counter = h->used_wrap_counter;
}

Result<PackedInflightRegion::Recovered> PackedInflightRegion::recover(
    const std::function<bool(std::uint16_t, bool)>& published) {
  if (!holds_state()) return make_error(Errc::bad_state, "inflight area holds no state for this queue");
  PackedHeader* h = phdr(base_);
  // One copy of the header: the frontend may still be writing to the shared memory.
  const PackedHeader now = *h;
  auto bad = [&](const std::string& what) {
    return make_error(Errc::protocol_error,
                      fmt::format("inflight area of a packed queue of {} is inconsistent: {}", size_, what));
  };
  if (now.used_idx >= size_ || now.old_used_idx >= size_ || now.used_wrap_counter > 1 ||
      now.old_used_wrap_counter > 1 || now.free_head > size_ || now.old_free_head > size_)
    return bad(fmt::format("header fields out of range (used {} / {}, free head {} / {})", now.used_idx,
                           now.old_used_idx, now.free_head, now.old_free_head));
  std::uint16_t free_head = now.old_free_head, used = now.old_used_idx;
  bool used_wrap = now.old_used_wrap_counter != 0;
  if (now.used_idx != now.old_used_idx || now.used_wrap_counter != now.old_used_wrap_counter) {
    // A push was under way: if its used descriptor reached the ring, finish it, else undo it.
    if (published(now.old_used_idx, now.old_used_wrap_counter != 0)) {
      free_head = now.free_head;
      used = now.used_idx;
      used_wrap = now.used_wrap_counter != 0;
    }
  }
  // The committed free head is free by definition: a pop that set its flag never finished.
  if (free_head < size_) pdesc(base_, free_head)->inflight = 0;

  Recovered r;
  std::vector<bool> claimed(size_, false);
  std::vector<std::uint64_t> order;
  std::uint32_t total = 0;
  for (std::uint16_t i = 0; i < size_; ++i) {
    const PackedState head = *pdesc(base_, i);
    if (head.inflight != 1) continue;
    if (head.num == 0 || head.num > size_)
      return bad(fmt::format("entry {} is in flight with {} descriptors", i, head.num));
    total += head.num;
    if (total > size_) return bad("the chains in flight hold more descriptors than the ring has slots");
    Chain c;
    c.entry = i;
    std::uint16_t cur = i;
    for (std::uint16_t k = 0;; ++k) {
      if (cur >= size_ || claimed[cur])
        return bad(fmt::format("the chain at entry {} links to entry {}, which is out of range or in another chain", i,
                               cur));
      claimed[cur] = true;
      const PackedState e = *pdesc(base_, cur);
      c.descs.push_back({e.addr, e.len, e.id, e.flags});
      if (k + 1 == head.num) break;
      cur = e.next;
    }
    if (cur != head.last) return bad(fmt::format("the chain at entry {} does not end at its last entry", i));
    counter_ = std::max(counter_, head.counter);
    order.push_back(head.counter);
    r.chains.push_back(std::move(c));
  }
  // Oldest first (counter order).
  std::vector<std::size_t> idx(r.chains.size());
  for (std::size_t k = 0; k < idx.size(); ++k) idx[k] = k;
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return order[a] < order[b]; });
  std::vector<Chain> sorted;
  sorted.reserve(idx.size());
  for (auto k : idx) sorted.push_back(std::move(r.chains[k]));
  r.chains = std::move(sorted);
  // Rebuild the free list from every entry no chain holds, and commit the header.
  std::uint16_t first = size_;
  PackedState* prev = nullptr;
  for (std::uint16_t i = 0; i < size_; ++i) {
    if (claimed[i]) continue;
    PackedState* e = pdesc(base_, i);
    e->inflight = 0;
    if (prev != nullptr) prev->next = i;
    else first = i;
    prev = e;
  }
  if (prev != nullptr) prev->next = size_;
  h->free_head = h->old_free_head = first;
  h->used_idx = h->old_used_idx = used;
  h->used_wrap_counter = h->old_used_wrap_counter = used_wrap ? 1 : 0;
  r.used_idx = used;
  r.used_wrap = used_wrap;
  std::uint32_t avail = std::uint32_t{used} + total;
  r.avail_wrap = used_wrap;
  if (avail >= size_) {
    avail -= size_;
    r.avail_wrap = !used_wrap;
  }
  r.avail_idx = static_cast<std::uint16_t>(avail);
  return r;
}

Result<InflightArea> InflightArea::create(std::uint16_t num_queues, std::uint16_t queue_size) {
  if (num_queues == 0 || queue_size == 0 || queue_size > 32768)
    return make_error(Errc::invalid_argument,
                      fmt::format("inflight area for {} queues of size {} is out of range", num_queues, queue_size));
  const std::uint64_t bytes = InflightRegion::queue_bytes(queue_size) * num_queues;
  UniqueFd fd(::memfd_create("vrdma-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return errno_error(errno, "memfd_create for the inflight area");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return errno_error(errno, "ftruncate inflight area");
  // The frontend holds this fd too: sealed, it cannot shrink the area under our mapping.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return errno_error(errno, "sealing the inflight area");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return errno_error(errno, "mmap inflight area");
  InflightArea a;
  a.fd_ = std::move(fd);
  a.map_ = MmapArea(p, bytes);
  a.nq_ = num_queues;
  a.qsize_ = queue_size;
  // Left zeroed (version 0): a ring's first start stamps its slice and starts at the base the
  // frontend sent; only a slice stamped by an earlier backend is recovered.
  return a;
}

Result<InflightArea> InflightArea::attach(UniqueFd fd, const InflightInfo& info, std::shared_ptr<FaultSink> sink) {
  if (info.num_queues == 0 || info.queue_size == 0 || info.queue_size > 32768)
    return make_error(Errc::invalid_argument, "SET_INFLIGHT_FD describes zero queues or a bad queue size");
  const std::uint64_t need = InflightRegion::queue_bytes(info.queue_size) * info.num_queues;
  if (info.mmap_size < need || info.mmap_size > (std::uint64_t{1} << 32) || info.mmap_offset % 4096 != 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("SET_INFLIGHT_FD area of {:#x} bytes at {:#x} does not fit {} queues of {}",
                                  info.mmap_size, info.mmap_offset, info.num_queues, info.queue_size));
  // Sealed against shrinking when it can be (then the size check below is final); guarded anyway.
  if (const int seals = ::fcntl(fd.get(), F_GET_SEALS); seals >= 0 && (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) == 0)
    (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uint64_t>(st.st_size) < info.mmap_offset + info.mmap_size)
    return make_error(Errc::invalid_argument, "SET_INFLIGHT_FD fd is smaller than the area it describes");
  void* p = ::mmap(nullptr, info.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                   static_cast<off_t>(info.mmap_offset));
  if (p == MAP_FAILED) return errno_error(errno, "mmap of the inflight area");
  InflightArea a;
  a.fd_ = std::move(fd);
  a.map_ = MmapArea(p, info.mmap_size);
  a.guard_ = GuardedMapping(p, info.mmap_size, "the inflight area", std::move(sink));
  a.offset_ = info.mmap_offset;
  a.nq_ = info.num_queues;
  a.qsize_ = info.queue_size;
  return a;
}

InflightRegion InflightArea::queue(std::uint16_t q) const {
  if (q >= nq_ || map_.data() == nullptr) return {};
  return InflightRegion(static_cast<std::uint8_t*>(map_.data()) + InflightRegion::queue_bytes(qsize_) * q, qsize_);
}

}  // namespace vrdma::vhost
