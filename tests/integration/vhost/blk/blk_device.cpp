#include "blk_device.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "vrdma/common/log.hpp"

namespace vrdma::test {

using vhost::VirtioFeature;

Result<std::unique_ptr<BlkDevice>> BlkDevice::open(UniqueFd disk, std::uint16_t queues) {
  struct stat st{};
  if (::fstat(disk.get(), &st) != 0) return errno_error(errno, "fstat disk");
  if (st.st_size <= 0 || st.st_size % 512 != 0)
    return make_error(Errc::invalid_argument, "disk size must be a non-zero multiple of 512 bytes");
  void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, disk.get(), 0);
  if (p == MAP_FAILED) return errno_error(errno, "mmap disk");
  auto d = std::make_unique<BlkDevice>();
  d->fd_ = std::move(disk);
  d->map_ = MmapArea(p, static_cast<std::size_t>(st.st_size));
  d->size_ = static_cast<std::uint64_t>(st.st_size);
  d->queues_ = queues;
  d->per_queue_.assign(queues, 0);
  return d;
}

vhost::DeviceInfo BlkDevice::info() const {
  vhost::DeviceInfo i;
  i.num_queues = queues_;
  i.max_queue_size = 1024;
  i.features = {VirtioFeature::blk_seg_max, VirtioFeature::blk_blk_size, VirtioFeature::blk_flush,
                VirtioFeature::blk_size_max};
  if (queues_ > 1) i.features.set(VirtioFeature::blk_mq);
  return i;
}

std::vector<std::uint8_t> BlkDevice::config() const {
  // struct virtio_blk_config up to num_queues (virtio 1.2 §5.2.4).
  std::vector<std::uint8_t> c(60, 0);
  const std::uint64_t capacity = size_ / 512;
  const std::uint32_t size_max = 1u << 20, seg_max = 126, blk_size = 512;
  std::memcpy(c.data() + 0, &capacity, 8);
  std::memcpy(c.data() + 8, &size_max, 4);
  std::memcpy(c.data() + 12, &seg_max, 4);
  std::memcpy(c.data() + 20, &blk_size, 4);
  c[32] = wce_;
  std::memcpy(c.data() + 34, &queues_, 2);
  return c;
}

Status BlkDevice::write_config(std::uint32_t offset, std::span<const std::uint8_t> data) {
  if (offset == 32 && data.size() == 1) {  // writeback cache enable
    wce_ = data[0];
    return {};
  }
  return make_error(Errc::not_supported, fmt::format("virtio-blk config byte {} is read-only", offset));
}

std::uint8_t BlkDevice::serve(const vhost::GuestView& g, const vhost::DescChain& c, std::uint32_t& written) {
  vhost::ChainReader in(g, c);
  vhost::ChainWriter out(g, c);
  BlkReqHeader h{};
  if (c.writable < 1 || !in.read(&h, sizeof h).ok()) return kBlkIoErr;
  auto* disk = static_cast<std::uint8_t*>(map_.data());
  auto range_ok = [&](std::uint64_t len) {
    std::uint64_t off = 0, end = 0;
    return len % 512 == 0 && !__builtin_mul_overflow(h.sector, 512, &off) && !__builtin_add_overflow(off, len, &end) &&
           end <= size_;
  };
  switch (h.type) {
    case kBlkIn: {
      const std::uint64_t len = c.writable - 1;
      if (!range_ok(len)) return kBlkIoErr;
      const vhost::GuestView unlogged(g.memory_ptr(), nullptr);
      vhost::ChainWriter data(unlogged_reads_ ? unlogged : g, c);
      if (!data.write(disk + h.sector * 512, len).ok()) return kBlkIoErr;
      written = static_cast<std::uint32_t>(len);
      return kBlkOk;
    }
    case kBlkOut: {
      const std::uint64_t len = in.remaining();
      if (!range_ok(len)) return kBlkIoErr;
      return in.read(disk + h.sector * 512, len).ok() ? kBlkOk : kBlkIoErr;
    }
    case kBlkFlush:
      return kBlkOk;
    case kBlkGetId: {
      char id[20] = "vrdma-test-blk";
      const std::uint64_t n = std::min<std::uint64_t>(sizeof id, c.writable - 1);
      if (!out.write(id, n).ok()) return kBlkIoErr;
      written = static_cast<std::uint32_t>(n);
      return kBlkOk;
    }
    default:
      return kBlkUnsupp;
  }
}

void BlkDevice::queue_ready(vhost::Queue& q) {
  // Drain until empty: with EVENT_IDX the driver only kicks again after we saw an empty ring.
  for (;;) {
    auto c = q.pop();
    if (!c) return;
    if (requests_ == crash_after_) {
      log::warn("virtio-blk: crashing on purpose with request {} in flight", requests_);
      std::_Exit(9);
    }
    ++requests_;
    if (q.index() < per_queue_.size()) ++per_queue_[q.index()];
    std::uint32_t written = 0;
    const std::uint8_t status = serve(q.memory(), *c, written);
    if (status != kBlkOk) ++errors_;
    // The status byte is the chain's last writable byte.
    std::uint64_t off = 0, left = c->writable - 1;
    for (const auto& b : c->bufs) {
      if (!b.writable) continue;
      if (left < b.len) {
        off = b.gpa + left;
        break;
      }
      left -= b.len;
    }
    if (c->writable == 0 || !q.memory().write(off, &status, 1).ok() || !q.push(*c, written + 1).ok()) {
      log::error("virtio-blk: request on queue {} has no room for its status byte", q.index());
      if (c->writable == 0) (void)q.push(*c, 0);
    }
  }
}

}  // namespace vrdma::test
