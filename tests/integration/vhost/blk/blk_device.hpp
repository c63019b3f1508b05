// A small virtio-blk device (virtio 1.2 §5.2) on top of vhost/: a test fixture only. It lets
// QEMU's vhost-user-blk frontend, Linux's virtio_blk driver and our own frontend exercise the
// vhost-user backend. The disk is a file or memfd, mapped; requests copy between the chain
// and the mapping.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/vhost/device.hpp"

namespace vrdma::test {

// virtio-blk request types and status (virtio 1.2 §5.2.6).
inline constexpr std::uint32_t kBlkIn = 0, kBlkOut = 1, kBlkFlush = 4, kBlkGetId = 8;
inline constexpr std::uint8_t kBlkOk = 0, kBlkIoErr = 1, kBlkUnsupp = 2;
struct BlkReqHeader {
  std::uint32_t type;
  std::uint32_t reserved;
  std::uint64_t sector;
};
static_assert(sizeof(BlkReqHeader) == 16);

class BlkDevice final : public vhost::Device {
 public:
  // Serves `disk` (a file or memfd of a multiple of 512 bytes) with `queues` queues.
  static Result<std::unique_ptr<BlkDevice>> open(UniqueFd disk, std::uint16_t queues);

  [[nodiscard]] vhost::DeviceInfo info() const override;
  [[nodiscard]] std::vector<std::uint8_t> config() const override;
  Status write_config(std::uint32_t offset, std::span<const std::uint8_t> data) override;
  void queue_ready(vhost::Queue& q) override;

  // Test hook: exit the process (as a crash would) after popping request number n+1.
  void crash_after(std::uint64_t n) { crash_after_ = n; }
  // Test hook: a backend bug on purpose. Data read from the disk into the guest (IN requests) is
  // written without marking the dirty log, so a migration test can prove it notices.
  void unlogged_reads(bool on) { unlogged_reads_ = on; }

  [[nodiscard]] std::uint64_t requests() const { return requests_; }
  [[nodiscard]] std::uint64_t errors() const { return errors_; }
  [[nodiscard]] const std::vector<std::uint64_t>& per_queue() const { return per_queue_; }
  [[nodiscard]] std::uint64_t sectors() const { return size_ / 512; }

 private:
  std::uint8_t serve(const vhost::GuestView& g, const vhost::DescChain& c, std::uint32_t& written);

  UniqueFd fd_;
  MmapArea map_;
  std::uint64_t size_ = 0;
  std::uint16_t queues_ = 1;
  std::uint8_t wce_ = 1;
  std::uint64_t requests_ = 0, errors_ = 0;
  std::uint64_t crash_after_ = UINT64_MAX;
  bool unlogged_reads_ = false;
  std::vector<std::uint64_t> per_queue_;
};

}  // namespace vrdma::test
