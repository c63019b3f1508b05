// Frontend-side live migration of a vhost-user device from one backend process to another, done
// the way QEMU does it for a VM (vhost-user.rst "Migration"), for our own frontend in the tests
// (a test VMM: part of vhost_test_support, not of the vhost module):
//
//   begin()        the source must have acked LOG_SHMFD: the frontend makes a shared dirty log
//                  covering guest RAM (SET_LOG_BASE), starts tracking its own writes to RAM, and
//                  switches logging on (SET_FEATURES with LOG_ALL);
//   precopy()      one round: takes (and clears) the backend's dirty log and the driver's own
//                  written pages, and copies those pages to the destination RAM (round 1: all of
//                  RAM). The device keeps running; call it until it converges;
//   stop_and_copy()  the stop protocol: GET_VRING_BASE on every queue (after its reply the
//                  backend writes nothing more to guest memory), then the final round. Returns
//                  the ring bases to start the destination backend's rings with.
//
// The destination side is then plain setup: a Frontend on the destination backend with the copied
// GuestRam, SET_VRING_BASE with the returned bases, kick.
//
// Two dirty logs, as in a VM: the backend's writes go into the vhost-user log (the backend marks
// it, one bit per 4 KiB guest-physical page); the driver's writes (this process: rings, request
// headers, outgoing data — what a guest CPU writes, which KVM's dirty log tracks in a VM) are
// tracked by the kernel through userfaultfd asynchronous write protection and PAGEMAP_SCAN
// (Linux >= 6.7). Pages are copied only when one of the two logs marks them, so a page the
// backend wrote without logging it is not copied: the destination then differs from the source,
// which is how a test proves the backend's log is complete.
//
// Threading: one thread drives a LiveMigration. The backend keeps running during precopy(), and
// so may the driver: both logs are fetched and cleared atomically per page (an exchange per log
// word; PAGEMAP_SCAN re-protects each page it reports), and a page is copied after its mark was
// taken, so a write that races with a round is caught by the next one. From stop_and_copy() on
// the driver must be quiescent, as a paused VM is.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "vrdma/common/fd.hpp"
#include "vrdma/common/result.hpp"
#include "vrdma/vhost/frontend.hpp"
#include "vrdma/vhost/guest_ram.hpp"

namespace vrdma::vhost {

// Pages this process writes into a GuestRam (the driver's writes): userfaultfd write protection in
// asynchronous mode, read and re-armed atomically by PAGEMAP_SCAN. Errc::not_supported when the
// kernel lacks it (Linux < 6.7, or userfaultfd disabled). Owns the userfaultfd; the registration
// ends when it is destroyed. The GuestRam must outlive it.
class WriteTracker {
 public:
  static Result<WriteTracker> start(const GuestRam& ram);
  // Appends the guest-physical page numbers (gpa / 4096) written since start() or the last call,
  // and write-protects them again, atomically per page.
  Status take(std::vector<std::uint64_t>& pages);

 private:
  const GuestRam* ram_ = nullptr;
  UniqueFd uffd_, pagemap_;
};

class LiveMigration {
 public:
  struct Round {
    std::uint64_t log_pages = 0;     // pages marked in the backend's dirty log
    std::uint64_t driver_pages = 0;  // pages the driver wrote
    std::uint64_t copied = 0;        // distinct pages copied (round 1: all of RAM)
    std::uint64_t outside = 0;       // log bits naming no RAM page (a backend fault; not copied)
  };

  // `src` is the source backend's frontend, negotiated, with LOG_SHMFD acked; `src_ram` the RAM
  // it was given (SET_MEM_TABLE); `dst_ram` an empty RAM of the same layout
  // (GuestRam::create_like). All three must outlive the LiveMigration. Errors: LOG_SHMFD or
  // LOG_ALL not offered, layouts differ, the kernel cannot track the driver's writes, or the
  // backend refused the log.
  static Result<std::unique_ptr<LiveMigration>> begin(Frontend& src, const GuestRam& src_ram, GuestRam& dst_ram);
  ~LiveMigration();
  LiveMigration(const LiveMigration&) = delete;
  LiveMigration& operator=(const LiveMigration&) = delete;

  // One pre-copy round while the device runs.
  Result<Round> precopy();
  // GET_VRING_BASE on queues 0..num_queues-1, then the final copy. Returns the bases (in queue
  // order) for SET_VRING_BASE on the destination. The driver must be quiescent from here on.
  Result<std::vector<std::uint32_t>> stop_and_copy(std::uint16_t num_queues);
  // Gives up: logging off on the source (SET_FEATURES without LOG_ALL); the source runs on.
  Status cancel();

  [[nodiscard]] const std::vector<Round>& rounds() const { return rounds_; }
  // Bytes of the shared dirty log (one bit per 4 KiB page up to the top of RAM).
  [[nodiscard]] std::uint64_t log_bytes() const { return log_bytes_; }

 private:
  LiveMigration() = default;
  Result<Round> round(bool all);
  Status set_logging(bool on);

  Frontend* src_ = nullptr;
  const GuestRam* src_ram_ = nullptr;
  GuestRam* dst_ram_ = nullptr;
  WriteTracker tracker_;
  UniqueFd log_fd_;
  MmapArea log_map_;
  std::uint64_t log_bytes_ = 0;
  bool logging_ = false, first_ = true;
  std::vector<Round> rounds_;
};

}  // namespace vrdma::vhost
