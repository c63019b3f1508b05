#include "vrdma/vhost/inflight.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

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

}  // namespace

std::uint64_t InflightRegion::queue_bytes(std::uint16_t queue_size) {
  const std::uint64_t raw = sizeof(QueueHeader) + std::uint64_t{sizeof(DescState)} * queue_size;
  return (raw + 63) & ~std::uint64_t{63};
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

Result<InflightArea> InflightArea::create(std::uint16_t num_queues, std::uint16_t queue_size) {
  if (num_queues == 0 || queue_size == 0 || queue_size > 32768)
    return make_error(Errc::invalid_argument,
                      fmt::format("inflight area for {} queues of size {} is out of range", num_queues, queue_size));
  const std::uint64_t bytes = InflightRegion::queue_bytes(queue_size) * num_queues;
  UniqueFd fd(::memfd_create("vrdma-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return errno_error(errno, "memfd_create for the inflight area");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return errno_error(errno, "ftruncate inflight area");
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

Result<InflightArea> InflightArea::attach(UniqueFd fd, const InflightInfo& info) {
  if (info.num_queues == 0 || info.queue_size == 0 || info.queue_size > 32768)
    return make_error(Errc::invalid_argument, "SET_INFLIGHT_FD describes zero queues or a bad queue size");
  const std::uint64_t need = InflightRegion::queue_bytes(info.queue_size) * info.num_queues;
  if (info.mmap_size < need || info.mmap_size > (std::uint64_t{1} << 32) || info.mmap_offset % 4096 != 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("SET_INFLIGHT_FD area of {:#x} bytes at {:#x} does not fit {} queues of {}",
                                  info.mmap_size, info.mmap_offset, info.num_queues, info.queue_size));
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
