// Frontend-owned guest memory: one memfd carved into regions with a guest-physical layout of
// our own, the way a VM's RAM looks to a vhost-user backend (several regions, holes between
// them, non-zero offsets into the fd). Used by the frontend side (libpvverbs, tests).
//
// Not thread-safe. The memory stays mapped as long as the GuestRam lives.
#pragma once

#include <cstdint>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/driver_memory.hpp"
#include "vrdma/vhost/message.hpp"

namespace vrdma::vhost {

struct RamRegion {
  std::uint64_t gpa;
  std::uint64_t size;
  std::uint64_t fd_offset;  // page-aligned
};

class GuestRam final : public DriverMemory {
 public:
  // A VM-like layout of about `mib` MiB: [0, 640K), [1M, 1M + most of it) at fd offset 2M,
  // and a region above 4 GiB at a further offset, with holes between all three.
  static std::vector<RamRegion> vm_layout(std::uint64_t mib);
  // How the memfd is sealed. `sealed` is what QEMU's memory-backend-memfd does by default
  // (seal=on: F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL), so a backend's mapping can never lose
  // pages; the others are for tests of backends facing frontends that do not seal.
  enum class Sealing { sealed, allowed /* MFD_ALLOW_SEALING, no seal yet */, none /* cannot be sealed */ };
  static Result<GuestRam> create(const std::vector<RamRegion>& layout, Sealing sealing = Sealing::sealed);
  // An empty RAM with `src`'s layout and allocation state: the destination of a live migration
  // (vhost/live_migration.hpp), where what the driver allocated moves with the memory.
  static Result<GuestRam> create_like(const GuestRam& src);

  // Host pointer for [gpa, gpa+len) inside one region, or nullptr.
  [[nodiscard]] std::uint8_t* host(std::uint64_t gpa, std::uint64_t len) const override;
  // The table to send in SET_MEM_TABLE / ADD_MEM_REG (userspace_addr = our own mapping).
  [[nodiscard]] std::vector<MemRegion> table() const;
  [[nodiscard]] int fd() const { return fd_.get(); }
  [[nodiscard]] std::uint64_t fd_size() const { return fd_size_; }
  [[nodiscard]] const std::vector<RamRegion>& layout() const { return layout_; }

  // Bump allocator over the regions (never spans a region). Error when memory runs out.
  Result<std::uint64_t> alloc(std::uint64_t len, std::uint64_t align = 64) override;

 private:
  UniqueFd fd_;
  std::uint64_t fd_size_ = 0;
  std::vector<RamRegion> layout_;
  std::vector<MmapArea> maps_;
  std::vector<std::uint64_t> next_;  // per-region allocation cursor
};

}  // namespace vrdma::vhost
