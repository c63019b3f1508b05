// Guest memory as the backend sees it: the frontend's region table mapped from the fds it
// passed, guest-physical -> host translation with bounds checks, and the dirty log.
//
// Ownership and threads: a GuestMemory is immutable once built. A change of the table
// (SET_MEM_TABLE, ADD/REM_MEM_REG) builds a complete new GuestMemory and publishes it by
// swapping a shared_ptr (STYLE.md "Swap the guest memory map whole"); users that hold the
// old one keep valid mappings until they drop it. Regions unchanged by ADD/REM are shared
// between the old and the new table, not remapped.
//
// Writes: GuestView is the one API that writes guest memory. Every write through it marks
// the vhost-user dirty log (one bit per 4 KiB guest page) when logging is on, so nothing can
// write guest memory without logging it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/guest_fault.hpp"
#include "vrdma/vhost/message.hpp"

namespace vrdma::vhost {

// One mapped region. Move-only; shared between tables through shared_ptr.
class MappedRegion {
 public:
  // Maps memory_size bytes of fd from mmap_offset (which must be page-aligned). Checks that
  // the file really has that many bytes, so a short memfd cannot turn into SIGBUS later. A
  // memfd that can be sealed and is not gets F_SEAL_SHRINK first (sealed() says whether the
  // file can still shrink under the mapping). With a sink, the mapping is guarded: a SIGBUS in
  // it (a file shrunk after all, or one that cannot supply a page) is absorbed and reported
  // there (guest_fault.hpp) instead of ending the process.
  static Result<std::shared_ptr<const MappedRegion>> map(const MemRegion& r, UniqueFd fd,
                                                         std::shared_ptr<FaultSink> sink = nullptr);
  // A region over memory this process already owns (frontend side, tests). No fd kept.
  static std::shared_ptr<const MappedRegion> wrap(const MemRegion& r, std::uint8_t* host);

  [[nodiscard]] const MemRegion& desc() const { return desc_; }
  [[nodiscard]] std::uint8_t* host() const { return host_; }
  [[nodiscard]] std::uint64_t gpa() const { return desc_.guest_phys_addr; }
  [[nodiscard]] std::uint64_t size() const { return desc_.memory_size; }
  // The region's fd (-1 for wrapped regions) and the fd offset of its first byte: lets a
  // device map guest pages a second time, e.g. contiguously for an RDMA memory region.
  [[nodiscard]] int fd() const { return fd_.get(); }
  [[nodiscard]] std::uint64_t fd_offset() const { return desc_.mmap_offset; }
  // The file is sealed against shrinking (F_SEAL_SHRINK).
  [[nodiscard]] bool sealed() const { return sealed_; }
  // Where faults in this region are reported (null: unguarded); a second mapping of its pages
  // (an RDMA memory region's) is guarded with the same sink.
  [[nodiscard]] const std::shared_ptr<FaultSink>& fault_sink() const { return guard_.sink(); }

 private:
  MemRegion desc_{};
  UniqueFd fd_;
  MmapArea map_;
  GuardedMapping guard_;  // after map_: unregistered before the unmap
  std::uint8_t* host_ = nullptr;
  bool sealed_ = false;
};

class GuestMemory {
 public:
  using RegionPtr = std::shared_ptr<const MappedRegion>;

  // Builds a table; regions must not overlap in guest-physical or frontend-virtual space.
  static Result<std::shared_ptr<const GuestMemory>> build(std::vector<RegionPtr> regions);
  static std::shared_ptr<const GuestMemory> empty();

  // A new table with `r` added (ADD_MEM_REG) or the region matching `r` removed (REM_MEM_REG).
  [[nodiscard]] Result<std::shared_ptr<const GuestMemory>> with(RegionPtr r) const;
  [[nodiscard]] Result<std::shared_ptr<const GuestMemory>> without(const MemRegion& r) const;

  struct Span {
    std::uint8_t* ptr;
    std::uint64_t len;  // bytes available from ptr to the end of the region
  };
  // Host bytes at gpa, contiguous to the end of its region. Error if gpa is in no region.
  [[nodiscard]] Result<Span> at(std::uint64_t gpa) const;
  // Host pointer for [gpa, gpa+len) when the whole range lies in one region.
  [[nodiscard]] Result<std::uint8_t*> range(std::uint64_t gpa, std::uint64_t len) const;
  // Frontend-virtual -> guest-physical, for ring addresses (SET_VRING_ADDR uses frontend VAs).
  [[nodiscard]] Result<std::uint64_t> uaddr_to_gpa(std::uint64_t uaddr, std::uint64_t len) const;

  [[nodiscard]] const std::vector<RegionPtr>& regions() const { return regions_; }

 private:
  std::vector<RegionPtr> regions_;  // sorted by gpa
};

// The vhost-user dirty log: bit (gpa / 4096) of a shared bitmap.
class DirtyLog {
 public:
  static constexpr std::uint64_t kPageSize = 4096;
  // Like MappedRegion::map: sealed against shrinking where the file allows, guarded with a sink.
  static Result<std::shared_ptr<DirtyLog>> map(UniqueFd fd, std::uint64_t size, std::uint64_t offset,
                                               std::shared_ptr<FaultSink> sink = nullptr);

  // Marks every page of [gpa, gpa+len). Atomic per byte (the frontend reads and clears the
  // bitmap concurrently). Pages beyond the bitmap are counted in overflow(), never written;
  // false when there were any.
  bool mark(std::uint64_t gpa, std::uint64_t len) noexcept;
  [[nodiscard]] std::uint64_t size() const { return size_; }
  [[nodiscard]] std::uint64_t overflow() const { return overflow_.load(std::memory_order_relaxed); }

 private:
  MmapArea map_;
  GuardedMapping guard_;
  std::uint8_t* bits_ = nullptr;
  std::uint64_t size_ = 0;
  std::atomic<std::uint64_t> overflow_{0};
};

// The one way the backend reads and writes guest memory. Cheap to copy (two shared_ptrs).
class GuestView {
 public:
  GuestView() : mem_(GuestMemory::empty()) {}
  GuestView(std::shared_ptr<const GuestMemory> mem, std::shared_ptr<DirtyLog> log)
      : mem_(std::move(mem)), log_(std::move(log)) {}

  Status read(std::uint64_t gpa, void* dst, std::uint64_t len) const;
  Status write(std::uint64_t gpa, const void* src, std::uint64_t len) const;

  template <class T>
  Result<T> read_obj(std::uint64_t gpa) const {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    VRDMA_TRY(read(gpa, &v, sizeof v));
    return v;
  }
  template <class T>
  Status write_obj(std::uint64_t gpa, const T& v) const {
    static_assert(std::is_trivially_copyable_v<T>);
    return write(gpa, &v, sizeof v);
  }
  // Ring index fields: naturally aligned, shared with the driver; acquire/release order.
  Result<std::uint16_t> load_u16_acquire(std::uint64_t gpa) const;
  Status store_u16_release(std::uint64_t gpa, std::uint16_t v) const;

  [[nodiscard]] const GuestMemory& memory() const { return *mem_; }
  [[nodiscard]] const std::shared_ptr<const GuestMemory>& memory_ptr() const { return mem_; }
  [[nodiscard]] bool logging() const { return log_ != nullptr; }
  // The dirty log when logging is on (for writers outside this API, e.g. an RDMA engine).
  [[nodiscard]] const std::shared_ptr<DirtyLog>& log() const { return log_; }

 private:
  std::shared_ptr<const GuestMemory> mem_;
  std::shared_ptr<DirtyLog> log_;
};

}  // namespace vrdma::vhost
