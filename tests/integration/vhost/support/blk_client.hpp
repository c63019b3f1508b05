// A virtio-blk driver over our vhost-user frontend: what a guest's virtio_blk does, in this
// process, against a backend process. Test support only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "blk_device.hpp"
#include "vrdma/vhost/driver_queue.hpp"
#include "vrdma/vhost/frontend.hpp"
#include "vrdma/vhost/guest_ram.hpp"

namespace vrdma::test {

struct BlkClientOptions {
  std::uint16_t queues = 4;
  std::uint16_t queue_size = 128;
  bool packed = false;
  bool event_idx = true;
  bool indirect = false;
  bool add_mem_reg = false;   // CONFIGURE_MEM_SLOTS path instead of SET_MEM_TABLE
  bool inflight = true;
  std::uint64_t ram_mib = 96;
  std::uint32_t max_io = 64 * 1024;
};

struct BlkOp {
  std::uint16_t queue = 0;
  std::uint32_t type = kBlkIn;
  std::uint64_t sector = 0;
  std::vector<std::uint8_t> data;  // OUT: what to write; IN: resized to len and filled
  std::uint32_t len = 0;           // IN length
  std::uint8_t status = 0xff;
  // Where the device wrote (IN data and status byte), for dirty-log checks.
  std::uint64_t data_gpa = 0, status_gpa = 0;
};

class BlkClient {
 public:
  static Result<std::unique_ptr<BlkClient>> connect(const std::string& sock, BlkClientOptions o);
  // Reconnects to a (restarted) backend and resumes the same rings, as QEMU does: memory,
  // inflight area handed back, vrings at the used index.
  Status reconnect(const std::string& sock);
  // The end of a live migration (vhost/live_migration.hpp): the driver continues on `ram` (the
  // copy of its RAM) against the backend at `sock`, with the rings at `bases` (from
  // LiveMigration::stop_and_copy), as a migrated VM does on the destination. Requests still
  // outstanding are collected there.
  Status switch_to(const std::string& sock, vhost::GuestRam ram, const std::vector<std::uint32_t>& bases);

  // Runs every op (pipelined, up to the queue size per queue); fails on a timeout or a
  // status other than OK unless allow_errors.
  Status run(std::vector<BlkOp>& ops, int timeout_ms = 20000, bool allow_errors = false);
  // Posts ops without waiting (and kicks); collect() then waits until every request still
  // outstanding on any queue (from post() or an interrupted run()) has completed.
  Status post(std::vector<BlkOp>& ops, bool kick = true);
  Status collect(std::vector<BlkOp>& ops, int timeout_ms);

  vhost::Frontend& frontend() { return *fe_; }
  vhost::GuestRam& ram() { return ram_; }
  vhost::DriverQueue& queue(std::uint16_t i) { return qs_[i]; }
  // The inflight area this frontend keeps for reconnects (invalid fd until the first setup).
  [[nodiscard]] const vhost::Frontend::Inflight& inflight_area() const { return inflight_; }
  [[nodiscard]] const BlkClientOptions& options() const { return o_; }

 private:
  struct Slot {
    std::uint64_t hdr = 0, data = 0, status = 0;
  };
  struct PerQueue {
    std::vector<Slot> slots;
    std::vector<std::uint16_t> free;
    std::unordered_map<std::uint16_t, std::pair<std::size_t, std::uint16_t>> inflight;  // id -> op, slot
  };
  BlkClient() = default;
  Status setup_rings(bool fresh, const std::vector<std::uint32_t>* bases = nullptr);
  Status submit(BlkOp& op, std::size_t index);
  Status reap(std::vector<BlkOp>& ops, std::size_t& done);

  BlkClientOptions o_;
  vhost::GuestRam ram_;
  std::unique_ptr<vhost::Frontend> fe_;
  std::vector<vhost::DriverQueue> qs_;
  std::vector<PerQueue> pq_;
  vhost::Frontend::Inflight inflight_;
  bool have_inflight_ = false;
};

// Deterministic test data and an FNV-1a checksum.
std::vector<std::uint8_t> pattern(std::uint64_t seed, std::size_t len);
std::uint64_t checksum(const std::uint8_t* p, std::size_t len);

}  // namespace vrdma::test
